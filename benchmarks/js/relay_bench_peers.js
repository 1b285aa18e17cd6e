// Benchmark peers: real hyperdht server + client that connect through a blind relay (client-side
// relayThrough, punching disabled so every byte crosses the relay).
// usage: node relay_bench_peers.js '<json: {bootstrap, relay, relayPort, setup: 20, bytes: 67108864}>'
// Prints one JSON line: {setup: [{openMs, firstEchoMs}], throughput: {bytes, seconds, mbps}, relayed}
const path = require('path')
const req = (m) => require(require.resolve(m, { paths: [path.join(__dirname, '../../tests/interop/node_modules')] }))
const DHT = req('hyperdht')
const crypto = req('hypercore-crypto')
const id = req('hypercore-id-encoding')

const opts = JSON.parse(process.argv[2])
const bootstrap = opts.bootstrap
const relayKey = id.decode(opts.relay)
const now = () => Number(process.hrtime.bigint()) / 1e6

async function connectOnce (serverNode, clientNode, onServerSocket) {
  const server = serverNode.createServer({ holepunch: false, shareLocalAddress: false }, (s) => {
    s.on('error', () => {})
    onServerSocket(s)
  })
  await server.listen(crypto.keyPair())
  const t0 = now()
  const socket = clientNode.connect(server.publicKey, {
    relayThrough: relayKey, holepunch: () => false, localConnection: false, fastOpen: false
  })
  socket.on('error', () => {})
  await new Promise((resolve, reject) => { socket.once('open', resolve); socket.once('close', () => reject(new Error('closed before open'))) })
  return { server, socket, openMs: now() - t0, t0 }
}

async function main () {
  const serverNode = new DHT({ bootstrap, quickFirewall: false, ephemeral: true, host: '127.0.0.1', port: [0, 0] })
  const clientNode = new DHT({ bootstrap, quickFirewall: false, ephemeral: true, host: '127.0.0.1', port: [0, 0] })
  await serverNode.fullyBootstrapped()
  await clientNode.fullyBootstrapped()
  const out = { setup: [], relayed: true }

  for (let i = 0; i < (opts.setup || 0); i++) {
    const c = await connectOnce(serverNode, clientNode, (s) => s.pipe(s))
    const echoed = new Promise((resolve) => c.socket.once('data', resolve))
    c.socket.write(Buffer.from('x'))
    await echoed
    out.setup.push({ openMs: c.openMs, firstEchoMs: now() - c.t0 })
    out.relayed = out.relayed && c.socket.rawStream.remotePort === opts.relayPort
    c.socket.destroy()
    await c.server.close()
  }

  if (opts.bytes) {
    const total = opts.bytes
    let got = 0
    let serverSocket = null
    const done = new Promise((resolve) => {
      connectOnce(serverNode, clientNode, (s) => {
        serverSocket = s
        s.on('data', (d) => { got += d.length; if (got >= total) { s.write(Buffer.from('k')); resolve() } })
      }).then((c) => { out._c = c })
    })
    while (!out._c) await new Promise((resolve) => setTimeout(resolve, 5))
    const c = out._c
    delete out._c
    const acked = new Promise((resolve) => c.socket.once('data', resolve))
    const chunk = crypto.randomBytes(65536)
    const t0 = now()
    let sent = 0
    while (sent < total) {
      const n = Math.min(chunk.length, total - sent)
      sent += n
      if (!c.socket.write(n === chunk.length ? chunk : chunk.subarray(0, n))) {
        await new Promise((resolve) => c.socket.once('drain', resolve))
      }
    }
    await done
    await acked
    const seconds = (now() - t0) / 1000
    out.throughput = { bytes: total, seconds, mbps: total / seconds / 1e6 }
    out.relayed = out.relayed && c.socket.rawStream.remotePort === opts.relayPort
    c.socket.destroy()
    if (serverSocket) serverSocket.destroy()
    await c.server.close()
  }

  process.stdout.write(JSON.stringify(out) + '\n')
  await clientNode.destroy()
  await serverNode.destroy()
  process.exit(0)
}

main().catch((err) => { console.error(err); process.exit(1) })
