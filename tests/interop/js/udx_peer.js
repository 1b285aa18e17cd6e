// A udx-native stream endpoint driven by JSON lines on stdin, reporting JSON lines on stdout.
// Used by the Python interop tests (tests/interop/test_interop_udx*.py, test_relay_forward*.py).
//
// argv: [id]   — local stream id (random when absent); env UDX_PEER_HOST: the address to bind
//   and connect to (default 127.0.0.1; ::1 for IPv6)
// stdin commands:
//   {"cmd":"connect","remote_id":N,"port":P,"host":"127.0.0.1"}
//   {"cmd":"send","bytes":N,"end":true}   write N random bytes (64 KiB chunks, honouring
//                                         backpressure), report their sha256, then end()
//   {"cmd":"end"} {"cmd":"destroy"} {"cmd":"message","hex":"..."} {"cmd":"keepalive","ms":N}
//   {"cmd":"stats"}
// stdout events: ready, connected, sent, data_end (bytes + sha256 of everything received), message,
//   error, close (with retransmit counters), stats
const UDX = require('udx-native')
const crypto = require('crypto')
const readline = require('readline')

const udx = new UDX()
const socket = udx.createSocket()
const HOST = process.env.UDX_PEER_HOST || '127.0.0.1'
socket.bind(0, HOST)
const id = process.argv[2] ? Number(process.argv[2]) : crypto.randomBytes(4).readUInt32LE(0)
const stream = udx.createStream(id)

function out (obj) { process.stdout.write(JSON.stringify(obj) + '\n') }
function counters () {
  return {
    retransmits: stream.retransmits,
    rtoCount: stream.rtoCount,
    fastRecoveries: stream.fastRecoveries,
    rtt: stream.rtt,
    mtu: stream.mtu,
    packetsTransmitted: stream.packetsTransmitted,
    packetsReceived: stream.packetsReceived
  }
}

const rxHash = crypto.createHash('sha256')
let rxBytes = 0
stream.on('data', (d) => { rxBytes += d.length; rxHash.update(d) })
stream.on('end', () => out({ event: 'data_end', bytes: rxBytes, sha256: rxHash.digest('hex') }))
stream.on('message', (m) => out({ event: 'message', hex: m.toString('hex') }))
stream.on('error', (err) => out({ event: 'error', code: err.code || String(err) }))
stream.on('close', () => out({ event: 'close', ...counters() }))

async function send (n, end) {
  const h = crypto.createHash('sha256')
  let left = n
  while (left > 0) {
    const chunk = crypto.randomBytes(Math.min(65536, left))
    left -= chunk.length
    h.update(chunk)
    if (!stream.write(chunk)) await new Promise((resolve) => stream.once('drain', resolve))
  }
  out({ event: 'sent', bytes: n, sha256: h.digest('hex') })
  if (end) stream.end()
}

const rl = readline.createInterface({ input: process.stdin })
rl.on('line', (line) => {
  const m = JSON.parse(line)
  if (m.cmd === 'connect') {
    stream.connect(socket, m.remote_id, m.port, m.host || HOST)
    out({ event: 'connected' })
  }
  else if (m.cmd === 'send') send(m.bytes, m.end !== false)
  else if (m.cmd === 'end') stream.end()
  else if (m.cmd === 'destroy') stream.destroy()
  else if (m.cmd === 'message') stream.trySend(Buffer.from(m.hex, 'hex'))
  else if (m.cmd === 'keepalive') stream.setKeepalive(m.ms)
  else if (m.cmd === 'stats') out({ event: 'stats', ...counters() })
})
rl.on('close', () => process.exit(0))

out({ event: 'ready', id, port: socket.address().port })
