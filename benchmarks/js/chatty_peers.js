// Chatty benchmark peers: N real hyperdht connections through a blind relay (client-side relayThrough,
// punching disabled, so every byte crosses the relay), each doing fixed-size request/response round
// trips (the client writes `size` bytes, the server echoes them, the client writes again when the
// whole reply is in).
// usage: node chatty_peers.js '<json: {bootstrap, relay, relayPort, pairs: 32, size: 256, seconds: 10}>'
// Prints {"ready": n, "setupMs": ms} once every pair is open, waits for a line on stdin, runs for
// `seconds`, prints {"done": true} the moment it stops sending, then one result line:
// {"roundTrips", "seconds", "rttMs": {"p50", "p99", "max"}, "relayed", "perPairMin"}
const path = require('path')
const req = (m) => require(require.resolve(m, { paths: [path.join(__dirname, '../../tests/interop/node_modules')] }))
const DHT = req('hyperdht')
const crypto = req('hypercore-crypto')
const id = req('hypercore-id-encoding')

const opts = JSON.parse(process.argv[2])
const relayKey = id.decode(opts.relay)
const size = opts.size || 256
const now = () => Number(process.hrtime.bigint()) / 1e6
const SETUP_CONCURRENCY = 8

function echoServer (socket) {
  // Echo whole requests: a reply goes out once `size` bytes of a request are in.
  let pending = 0
  socket.on('error', () => {})
  socket.on('data', (d) => {
    pending += d.length
    while (pending >= size) {
      pending -= size
      socket.write(Buffer.alloc(size, 0x72))
    }
  })
}

async function connectPair (clientNode, serverKey) {
  const socket = clientNode.connect(serverKey, {
    relayThrough: relayKey, holepunch: () => false, localConnection: false, fastOpen: false
  })
  socket.on('error', () => {})
  await new Promise((resolve, reject) => {
    socket.once('open', resolve)
    socket.once('close', () => reject(new Error('closed before open')))
  })
  return socket
}

function lineFromStdin () {
  return new Promise((resolve) => {
    process.stdin.once('data', resolve)
    process.stdin.once('end', resolve)
  })
}

async function main () {
  const serverNode = new DHT({ bootstrap: opts.bootstrap, quickFirewall: false, ephemeral: true, host: '127.0.0.1', port: [0, 0] })
  const clientNode = new DHT({ bootstrap: opts.bootstrap, quickFirewall: false, ephemeral: true, host: '127.0.0.1', port: [0, 0] })
  await serverNode.fullyBootstrapped()
  await clientNode.fullyBootstrapped()
  const server = serverNode.createServer({ holepunch: false, shareLocalAddress: false }, echoServer)
  await server.listen(crypto.keyPair())

  const t0 = now()
  const sockets = []
  let next = 0
  async function opener () {
    while (next < opts.pairs) {
      next++
      sockets.push(await connectPair(clientNode, server.publicKey))
    }
  }
  await Promise.all(Array.from({ length: Math.min(SETUP_CONCURRENCY, opts.pairs) }, opener))
  const relayed = sockets.every((s) => s.rawStream.remotePort === opts.relayPort)
  process.stdout.write(JSON.stringify({ ready: sockets.length, setupMs: now() - t0, relayed }) + '\n')
  await lineFromStdin()

  const rtts = []
  const counts = new Array(sockets.length).fill(0)
  let running = true
  const request = Buffer.alloc(size, 0x71)
  const start = now()
  sockets.forEach((s, i) => {
    let got = 0
    let sentAt = now()
    s.on('data', (d) => {
      got += d.length
      while (got >= size) {
        got -= size
        if (!running) return // replies that arrive after the window are not counted
        const t = now()
        rtts.push(t - sentAt)
        counts[i]++
        sentAt = t
        s.write(request)
      }
    })
    s.write(request)
  })
  await new Promise((resolve) => setTimeout(resolve, opts.seconds * 1000))
  running = false
  const seconds = (now() - start) / 1000
  process.stdout.write(JSON.stringify({ done: true }) + '\n')

  rtts.sort((a, b) => a - b)
  const pick = (q) => rtts.length ? rtts[Math.min(rtts.length - 1, Math.floor(q * rtts.length))] : null
  process.stdout.write(JSON.stringify({
    roundTrips: rtts.length,
    seconds,
    rttMs: { p50: pick(0.5), p99: pick(0.99), max: rtts.length ? rtts[rtts.length - 1] : null },
    perPairMin: Math.min(...counts),
    relayed
  }) + '\n')
  for (const s of sockets) s.destroy()
  await server.close()
  await clientNode.destroy()
  await serverNode.destroy()
  process.exit(0)
}

main().catch((err) => { console.error(err); process.exit(1) })
