// Real hyperdht peers holding relayed connections that reconnect as soon as one closes, as a
// job agent does, reporting every transition so a test can tell a close from a timeout.
// usage: node js/relay_restart_peers.js '<json options>'
//   { bootstrap: ["host:port"], relay: <z32 key>, relayPort: <int>, pairs: 4,
//     relays: [<z32 key>, ...], relayPorts: [<int>, ...]   (instead of relay/relayPort: several
//     relays, given to hyperdht as its relayThrough array, which picks one per connection),
//     retryMs: 250, bytes: 1000, timeout: 30000,
//     serverHost: "127.0.0.1", clientHost: "127.0.0.1" }   (each side's DHT node binds its host:
//     one worker address holding every server end, as a worker holds every job's connection)
// Prints JSON lines: {event: "up", i, t, attempt, relayed, relayPort} once a connection echoed
// through a relay (relayPort: the port its raw stream goes to); {event: "down", side:
// "client"|"server", i, t, code} when one closed (code: the error's code, e.g. ECONNRESET or
// ETIMEDOUT, or null for a clean end); {event: "failed", i, t, code}
// for a reconnect attempt that failed (it is retried after retryMs). t is Date.now().
// Runs until stdin closes.
const DHT = require('hyperdht')
const crypto = require('hypercore-crypto')
const id = require('hypercore-id-encoding')
const b4a = require('b4a')

const opts = JSON.parse(process.argv[2])
const bootstrap = opts.bootstrap
const relayKeys = (opts.relays || [opts.relay]).map((k) => id.decode(k))
const relayThrough = relayKeys.length === 1 ? relayKeys[0] : relayKeys
const relayPorts = opts.relayPorts || [opts.relayPort]
const pairs = opts.pairs || 4
const retryMs = opts.retryMs === undefined ? 250 : opts.retryMs
const bytes = opts.bytes || 1000
const timeout = opts.timeout || 30000

const out = (o) => process.stdout.write(JSON.stringify({ t: Date.now(), ...o }) + '\n')
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function main () {
  const node = (host) => new DHT({ bootstrap, quickFirewall: false, ephemeral: true, host, port: [0, 0] })
  const serverNode = node(opts.serverHost || '127.0.0.1')
  const clientNode = node(opts.clientHost || '127.0.0.1')
  await serverNode.fullyBootstrapped()
  await clientNode.fullyBootstrapped()

  // punching off and no LAN address: the relayed path is the only one
  const server = serverNode.createServer({ holepunch: false, shareLocalAddress: false }, (socket) => {
    let code = null
    socket.on('error', (err) => { code = code || err.code || err.message })
    socket.on('close', () => {
      const i = socket.userData && socket.userData.i
      out({ event: 'down', side: 'server', i: i === undefined ? null : i, code })
    })
    socket.on('data', (d) => {
      if (socket.userData === null || socket.userData === undefined) {
        socket.userData = { i: d.readUInt32BE(0) } // the client's first 4 bytes say which pair it is
      }
      socket.write(d)
    })
  })
  await server.listen(crypto.keyPair())

  async function connectOnce (i) {
    const socket = clientNode.connect(server.publicKey, {
      relayThrough, holepunch: () => false, localConnection: false, fastOpen: false
    })
    let code = null
    socket.on('error', (err) => { code = code || err.code || err.message })
    const closed = new Promise((resolve) => socket.once('close', () => resolve(code)))
    let timer
    const opened = await Promise.race([
      new Promise((resolve) => socket.once('open', () => resolve(true))),
      closed.then(() => false),
      new Promise((resolve) => { timer = setTimeout(() => resolve(false), timeout) })
    ])
    clearTimeout(timer)
    if (!opened) {
      socket.destroy()
      return { ok: false, code: (await closed) || 'timeout' }
    }
    const payload = crypto.randomBytes(bytes)
    payload.writeUInt32BE(i, 0)
    const got = []
    let n = 0
    const echo = Promise.race([
      new Promise((resolve) => socket.on('data', (d) => { got.push(d); n += d.length; if (n >= bytes) resolve(true) })),
      closed.then(() => false),
      new Promise((resolve) => { timer = setTimeout(() => resolve(false), timeout) })
    ])
    socket.write(payload)
    const echoed = await echo
    clearTimeout(timer)
    socket.removeAllListeners('data')
    if (!echoed || !b4a.equals(b4a.concat(got), payload)) {
      socket.destroy()
      return { ok: false, code: (await closed) || 'echo' }
    }
    const relayPort = socket.rawStream.remotePort
    return { ok: true, socket, closed, relayed: relayPorts.includes(relayPort), relayPort }
  }

  async function keepUp (i) {
    let attempt = 0
    for (;;) {
      attempt++
      const r = await connectOnce(i).catch((err) => ({ ok: false, code: err.code || err.message }))
      if (!r.ok) {
        out({ event: 'failed', i, attempt, code: r.code })
        await sleep(retryMs)
        continue
      }
      out({ event: 'up', i, attempt, relayed: r.relayed, relayPort: r.relayPort })
      const code = await r.closed
      out({ event: 'down', side: 'client', i, code })
      attempt = 0
    }
  }

  for (let i = 0; i < pairs; i++) keepUp(i)
  process.stdin.resume()
  process.stdin.on('end', async () => {
    await clientNode.destroy({ force: true }).catch(() => {})
    await serverNode.destroy({ force: true }).catch(() => {})
    process.exit(0)
  })
}

main().catch((err) => { console.error(err); process.exit(2) })
