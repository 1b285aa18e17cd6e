// Real hyperdht peers for the Python client's interop tests (tests/interop/test_interop_client.py).
// usage: node js/client_peers.js '<json {bootstrap: ["host:port"]}>'
// Prints {"event":"ready"}, then answers one JSON command per stdin line ({id, cmd, ...}) with one
// line {"event":"result", id, ok, ...}:
//   serve {relayThrough?: hex, holepunch?: bool, shareLocalAddress?: bool, firewalled?: bool}
//        -> {key}; an echo server (every byte comes back); records each connection's raw stream
//   served {} -> {connections: [{remoteHost, remotePort}]}
//   connect {key, relayThrough?: hex, holepunch?: bool, bytes, timeoutMs}
//        -> {intact, received, remoteHost, remotePort}: sends `bytes` random bytes, waits for the echo
const DHT = require('hyperdht')
const b4a = require('b4a')
const crypto = require('crypto')
const readline = require('readline')

const out = (o) => process.stdout.write(JSON.stringify(o) + '\n')

async function main () {
  const opts = JSON.parse(process.argv[2])
  const dhts = []
  async function makeDHT (extra = {}) {
    const dht = new DHT({ bootstrap: opts.bootstrap, quickFirewall: false, ephemeral: true, host: '127.0.0.1', port: [0, 0], ...extra })
    await dht.fullyBootstrapped()
    dhts.push(dht)
    return dht
  }
  const served = []

  const commands = {
    async serve ({ relayThrough = null, holepunch = true, shareLocalAddress = true, firewalled = true }) {
      const dht = await makeDHT(firewalled ? {} : { firewalled: false })
      const server = dht.createServer({
        holepunch: holepunch ? undefined : false,
        shareLocalAddress,
        relayThrough: relayThrough ? b4a.from(relayThrough, 'hex') : null
      }, (socket) => {
        socket.on('error', () => {})
        socket.on('open', () => {
          served.push({ remoteHost: socket.rawStream.remoteHost, remotePort: socket.rawStream.remotePort })
        })
        socket.pipe(socket)
      })
      await server.listen(DHT.keyPair())
      return { key: b4a.toString(server.publicKey, 'hex') }
    },
    async served () {
      return { connections: served }
    },
    async connect ({ key, relayThrough = null, holepunch = true, bytes = 1000, timeoutMs = 20000 }) {
      const dht = await makeDHT()
      const connectOpts = {}
      if (relayThrough) connectOpts.relayThrough = b4a.from(relayThrough, 'hex')
      if (!holepunch) connectOpts.holepunch = () => false
      const socket = dht.connect(b4a.from(key, 'hex'), connectOpts)
      const data = crypto.randomBytes(bytes)
      return await new Promise((resolve, reject) => {
        const timer = setTimeout(() => { socket.destroy(); reject(new Error('connect timeout')) }, timeoutMs)
        const got = []
        let n = 0
        socket.on('error', (err) => { clearTimeout(timer); reject(err) })
        socket.on('open', () => socket.write(data))
        socket.on('data', (d) => {
          got.push(d)
          n += d.byteLength
          if (n >= bytes) {
            clearTimeout(timer)
            const all = b4a.concat(got)
            resolve({
              intact: b4a.equals(all.subarray(0, bytes), data),
              received: n,
              remoteHost: socket.rawStream.remoteHost,
              remotePort: socket.rawStream.remotePort
            })
            socket.end()
          }
        })
      })
    }
  }

  out({ event: 'ready' })
  const rl = readline.createInterface({ input: process.stdin })
  rl.on('line', async (line) => {
    let cmd
    try { cmd = JSON.parse(line) } catch { return }
    try {
      const res = await commands[cmd.cmd](cmd)
      out({ event: 'result', ...res, id: cmd.id, ok: true })
    } catch (err) {
      out({ event: 'result', id: cmd.id, ok: false, error: String(err && (err.code || err.message || err)) })
    }
  })
  const stop = async () => {
    for (const d of dhts) await d.destroy({ force: true }).catch(() => {})
    process.exit(0)
  }
  rl.on('close', stop)
  process.on('SIGTERM', stop)
}

main().catch((err) => { console.error(err); process.exit(1) })
