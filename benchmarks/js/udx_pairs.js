// Many udx-native stream endpoints in one process: one side of N relayed pairs for
// benchmarks/udx_forward.py --pairs N (the other side is a second copy of this process).
// argv: <n streams> [streams per socket]  (each socket is one "peer": its own port)
// stdin commands (JSON lines):
//   {"cmd":"connect","remotes":[id...],"port":P}   stream i -> remote id remotes[i] at the relay
//   {"cmd":"hello"}      a 1-byte message on every stream; replies {"event":"hello","heard":k}
//                        (k streams have heard their partner)
//   {"cmd":"send","bytes":N,"end":true}   every stream writes N bytes (one shared random chunk)
//   {"cmd":"stats"}
// stdout events: ready {ids, ports}, connected, hello, sent, received {bytes} (every stream got
//   `expect` bytes, see "expect"), data_end {bytes} (every stream saw END), stats
const UDX = require('udx-native')
const crypto = require('crypto')
const readline = require('readline')

const n = Number(process.argv[2] || 1)
const perSocket = Number(process.argv[3] || 1)
const udx = new UDX()
const sockets = []
const streams = []
const chunk = crypto.randomBytes(65536)
let ended = 0
let rxTotal = 0
let expect = 0
let reached = 0

function out (obj) { process.stdout.write(JSON.stringify(obj) + '\n') }

for (let i = 0; i < n; i++) {
  if (i % perSocket === 0) {
    const s = udx.createSocket()
    s.bind(0, '127.0.0.1')
    sockets.push(s)
  }
  const id = crypto.randomBytes(4).readUInt32LE(0)
  const stream = udx.createStream(id)
  stream.sock = sockets[sockets.length - 1]
  stream.heard = false
  stream.rx = 0
  stream.on('data', (d) => {
    stream.rx += d.length
    rxTotal += d.length
    if (expect && stream.rx >= expect && stream.rx - d.length < expect) {
      if (++reached === n) out({ event: 'received', bytes: rxTotal })
    }
  })
  stream.on('message', () => { stream.heard = true })
  stream.on('end', () => {
    stream.end()
    if (++ended === n) out({ event: 'data_end', bytes: rxTotal })
  })
  stream.on('error', (err) => out({ event: 'error', code: err.code || String(err) }))
  streams.push(stream)
}

async function sendAll (bytes, end) {
  await Promise.all(streams.map(async (s) => {
    let left = bytes
    while (left > 0) {
      const c = left >= chunk.length ? chunk : chunk.subarray(0, left)
      left -= c.length
      if (!s.write(c)) await new Promise((resolve) => s.once('drain', resolve))
    }
    if (end) s.end()
  }))
  out({ event: 'sent', bytes: bytes * n })
}

const rl = readline.createInterface({ input: process.stdin })
rl.on('line', (line) => {
  const m = JSON.parse(line)
  if (m.cmd === 'connect') {
    streams.forEach((s, i) => s.connect(s.sock, m.remotes[i], m.port, '127.0.0.1'))
    out({ event: 'connected' })
  } else if (m.cmd === 'hello') {
    let heard = 0
    for (const s of streams) {
      if (s.heard) heard++
      s.trySend(Buffer.from([0])) // until both sides heard: the partner may not have yet
    }
    out({ event: 'hello', heard })
  } else if (m.cmd === 'expect') {
    expect = m.bytes
  } else if (m.cmd === 'send') {
    sendAll(m.bytes, m.end !== false)
  } else if (m.cmd === 'stats') {
    let tx = 0
    let re = 0
    for (const s of streams) { tx += s.packetsTransmitted; re += s.retransmits }
    out({ event: 'stats', packetsTransmitted: tx, retransmits: re })
  }
})
rl.on('close', () => process.exit(0))
out({ event: 'ready', ids: streams.map((s) => s.id), ports: sockets.map((s) => s.address().port) })
