// The Node side of benchmarks/udx_forward.py: udx-native's relayTo set up as blind-relay does it
// (two raw streams per pair, a firewall that connects each on its first packet, relayTo both ways).
// argv: <peer A stream id> <peer D stream id>, or one JSON list [[aId, dId], ...] for many pairs;
// prints {"port","rb","rc","pairs":[[rb, rc], ...]}; stdin "stats" -> counters.
const UDX = require('udx-native')
const crypto = require('crypto')
const readline = require('readline')

const args = process.argv.slice(2)
const wanted = args[0].startsWith('[') ? JSON.parse(args[0]) : [args.map(Number)]
const udx = new UDX()
const socket = udx.createSocket()
socket.bind(0, '127.0.0.1')
const used = new Set()

function rawStream (peerId) {
  let id = crypto.randomBytes(4).readUInt32LE(0)
  while (used.has(id)) id = crypto.randomBytes(4).readUInt32LE(0)
  used.add(id)
  const stream = udx.createStream(id, {
    firewall (sock, port, host) {
      stream.connect(sock, peerId, port, host)
      return false
    }
  })
  stream.on('error', () => {})
  return stream
}

const pairs = wanted.map(([aId, dId]) => {
  const rb = rawStream(aId)
  const rc = rawStream(dId)
  rb.relayTo(rc)
  rc.relayTo(rb)
  return [rb.id, rc.id]
})

const rl = readline.createInterface({ input: process.stdin })
rl.on('line', (line) => {
  if (line.trim() === 'stats') {
    process.stdout.write(JSON.stringify({
      event: 'stats',
      received_packets: udx.packetsReceived,
      received_bytes: udx.bytesReceived,
      sent_packets: udx.packetsTransmitted,
      sent_bytes: udx.bytesTransmitted
    }) + '\n')
  }
})
rl.on('close', () => process.exit(0))
process.stdout.write(JSON.stringify({ event: 'ready', port: socket.address().port, rb: pairs[0][0], rc: pairs[0][1], pairs }) + '\n')
