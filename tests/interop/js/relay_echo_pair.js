// One real hyperdht pair relayed through a blind relay, held open and echoing on command, so a
// test can attack the relayed streams while the pair lives.
// usage: node js/relay_echo_pair.js '<json: {bootstrap: ["host:port"], relay: <z32|hex key>, timeout: 30000}>'
// First line: {ready, client: {remoteId, remotePort, remoteHost, localPort}, server: {...}} where
// remoteId is the relay-side id of that peer's relayed raw stream (the id its packets carry).
// Then one JSON command per stdin line, one JSON answer line each:
//   {"cmd": "start", "bytes": n}  echo rounds of n random bytes back to back until "stop"
//   {"cmd": "stop", "atLeast": k} -> {rounds, failed, error, open, ms}: rounds echoed exact since
//                                  "start" (it goes on until k rounds, unless one fails)
//   {"cmd": "echo", "rounds": k, "bytes": n} -> {rounds, failed, error, open}: k rounds, in order
// A line {"closed": "client"|"server", error, ms} is printed as soon as either end closes (ms since ready).
// Exits when stdin closes.
const DHT = require('hyperdht')
const crypto = require('hypercore-crypto')
const id = require('hypercore-id-encoding')
const b4a = require('b4a')
const readline = require('readline')

const opts = JSON.parse(process.argv[2])
const bootstrap = opts.bootstrap.map((b) => typeof b === 'string' ? b : `${b.host}:${b.port}`)
const relayKey = id.decode(opts.relay)
const timeout = opts.timeout || 30000
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n')

function withTimeout (p, ms, what) {
  let t
  return Promise.race([p, new Promise((resolve, reject) => { t = setTimeout(() => reject(new Error('timeout: ' + what)), ms) })])
    .finally(() => clearTimeout(t))
}

async function main () {
  const serverNode = new DHT({ bootstrap, quickFirewall: false, ephemeral: true, host: '127.0.0.1', port: [0, 0] })
  const clientNode = new DHT({ bootstrap, quickFirewall: false, ephemeral: true, host: '127.0.0.1', port: [0, 0] })
  await serverNode.fullyBootstrapped()
  await clientNode.fullyBootstrapped()

  // as relay_peers.js "client" mode: the client asks for the relay, nothing can go direct
  const serverSocketP = new Promise((resolve) => {
    const server = serverNode.createServer({ holepunch: false, shareLocalAddress: false }, (socket) => {
      socket.on('error', () => {})
      socket.pipe(socket) // echo
      resolve(socket)
    })
    serverNode._echoServer = server
  })
  await serverNode._echoServer.listen(crypto.keyPair())
  const socket = clientNode.connect(serverNode._echoServer.publicKey, {
    localConnection: false, fastOpen: false, relayThrough: relayKey, holepunch: () => false
  })
  let lastError = null
  socket.on('error', (err) => { lastError = err.message })
  await withTimeout(new Promise((resolve, reject) => {
    socket.once('open', resolve)
    socket.once('close', () => reject(new Error(lastError || 'closed before open')))
  }), timeout, 'open')
  const serverSocket = await withTimeout(serverSocketP, timeout, 'server socket')
  const ends = { client: socket, server: serverSocket }
  const readyAt = Date.now()
  const open = () => !socket.destroyed && !serverSocket.destroyed
  for (const [name, s] of Object.entries(ends)) {
    s.once('close', () => out({ closed: name, error: lastError, ms: Date.now() - readyAt }))
  }
  const info = (s) => ({ remoteId: s.rawStream.remoteId, remotePort: s.rawStream.remotePort, remoteHost: s.rawStream.remoteHost, localPort: s.rawStream.socket.address().port })
  out({ ready: true, client: info(socket), server: info(serverSocket) })

  // one round: n random bytes out, the same n bytes back, exact
  async function round (n) {
    const payload = crypto.randomBytes(n)
    const got = []
    let m = 0
    let ondata, onclose
    const echoed = new Promise((resolve, reject) => {
      ondata = (d) => { got.push(d); m += d.length; if (m >= n) resolve() }
      onclose = () => reject(new Error('closed during echo' + (lastError ? ` (${lastError})` : '')))
      socket.on('data', ondata)
      socket.once('close', onclose)
      serverSocket.once('close', onclose) // the pair is gone when either end is
    })
    try {
      if (!open()) throw new Error('closed')
      socket.write(payload)
      await withTimeout(echoed, timeout, 'echo')
      if (!b4a.equals(b4a.concat(got), payload)) throw new Error('echo differs')
    } finally {
      socket.removeListener('data', ondata)
      socket.removeListener('close', onclose)
      serverSocket.removeListener('close', onclose)
    }
  }

  let loop = null
  async function rounds (k, n, state) {
    const res = { rounds: 0, failed: 0, error: null }
    const t0 = Date.now()
    while (state ? !(state.stop && res.rounds >= state.atLeast) : res.rounds + res.failed < k) {
      try {
        await round(n)
        res.rounds++
      } catch (err) {
        res.failed++
        res.error = err.message
        break
      }
    }
    res.open = open()
    res.ms = Date.now() - t0
    return res
  }

  const rl = readline.createInterface({ input: process.stdin })
  for await (const line of rl) {
    if (!line.trim()) continue
    const c = JSON.parse(line)
    if (c.cmd === 'start') {
      const state = { stop: false, atLeast: 0 }
      loop = { state, done: rounds(0, c.bytes || 16384, state) }
      out({ started: true })
    } else if (c.cmd === 'stop') {
      loop.state.atLeast = c.atLeast || 0
      loop.state.stop = true
      out(await loop.done)
      loop = null
    } else if (c.cmd === 'echo') {
      out(await rounds(c.rounds || 1, c.bytes || 16384, null))
    }
  }
  socket.destroy()
  serverSocket.destroy()
  await clientNode.destroy()
  await serverNode.destroy()
  process.exit(0)
}

main().catch((err) => { out({ fatal: err.message }); process.exit(2) })
