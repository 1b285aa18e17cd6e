// A worker and its jobs in the deployment's shape, every connection through a blind relay, held
// open: one hyperdht server (the worker) on `workerHost`, jobs connecting to it from DHT nodes on
// `jobHosts` (round robin). hyperdht opens one relay connection per side of each relayed
// connection, so the relay sees every job's connection twice: once from the worker's address
// (thousands of sessions from one address, as in a real cluster) and once from the job's.
// usage: node js/relay_capacity_peers.js '<json: {bootstrap, relay, relayPort, workerHost?, jobHosts?}>'
// Then one JSON command per stdin line, each answered when done (stdin closed = exit):
//   {"op": "open", "n": 100, "rate": 40, "parallel": 64, "timeout": 30000}
//       open n more connections, started at most `rate` per second with at most `parallel`
//       setting up at once; one {"ev": "pair", i, ok, setupMs | failMs, error, relayed} each, then
//       {"ev": "opened", ok, failed}
//   {"op": "echo", "bytes": 1000, "timeout": 30000}
//       every open connection echoes `bytes` random bytes through the worker:
//       {"ev": "echoed", ok, failed, open, errors: {message: count}}
//   {"op": "status"}  -> {"ev": "status", open, closed, errors: {message: count}}
//   {"op": "pairRaw", "n": 3, "timeout": 20000}
//       n pairings straight at the relay with npm blind-relay's Client (two fresh relay
//       connections per pairing, initiator and not, one token): how long until each side's
//       pairing fails or pairs, and how: {"ev": "raw", i, side, ok, ms, error}, then
//       {"ev": "rawDone", ok, failed}. What a full relay tells a peer, without hyperdht's
//       connect() around it (which waits for its hole-puncher to give up before it fails)
// Connections that close count in `closed` with their error: an established pair never dies
// unless something (the relay) kills it.
const DHT = require('hyperdht')
const crypto = require('hypercore-crypto')
const id = require('hypercore-id-encoding')
const b4a = require('b4a')
const readline = require('readline')
const relay = require('blind-relay')

const opts = JSON.parse(process.argv[2])
const bootstrap = opts.bootstrap.map((b) => typeof b === 'string' ? b : `${b.host}:${b.port}`)
const relayKey = id.decode(opts.relay)
const relayPorts = opts.relayPorts || [opts.relayPort]
const workerHost = opts.workerHost || '127.0.0.1'
const jobHosts = opts.jobHosts || ['127.0.0.1']

const out = (o) => process.stdout.write(JSON.stringify(o) + '\n')
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const open = new Map() // i -> client socket
const closedErrors = {}
let closed = 0
let next = 0

function count (map, message) { map[message] = (map[message] || 0) + 1 }

async function main () {
  const node = (host) => new DHT({ bootstrap, quickFirewall: false, ephemeral: true, host, port: [0, 0] })
  const worker = node(workerHost)
  const jobs = jobHosts.map(node)
  await Promise.all([worker, ...jobs].map((n) => n.fullyBootstrapped()))
  const server = worker.createServer({ holepunch: false, shareLocalAddress: false }, (socket) => {
    socket.on('error', () => {})
    socket.pipe(socket) // echo
  })
  await server.listen(crypto.keyPair())

  async function connectOne (timeout) {
    const i = next++
    const job = jobs[i % jobs.length]
    const t0 = process.hrtime.bigint()
    const ms = () => Number(process.hrtime.bigint() - t0) / 1e6
    const socket = job.connect(server.publicKey, { localConnection: false, fastOpen: false, relayThrough: relayKey, holepunch: () => false })
    let error = null
    socket.on('error', (err) => { error = error || err.message })
    const rec = { ev: 'pair', i, ok: false }
    try {
      await new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error('timeout: open')), timeout)
        socket.once('open', () => { clearTimeout(t); resolve() })
        socket.once('close', () => { clearTimeout(t); reject(new Error(error || 'closed before open')) })
      })
      rec.ok = true
      rec.setupMs = ms()
      rec.relayed = relayPorts.includes(socket.rawStream.remotePort)
      open.set(i, socket)
      socket.once('close', () => { open.delete(i); closed++; count(closedErrors, error || 'closed') })
    } catch (err) {
      rec.failMs = ms()
      rec.error = err.message
      socket.destroy()
    }
    out(rec)
    return rec.ok
  }

  async function openMany (cmd) {
    const n = cmd.n
    const gap = cmd.rate ? 1000 / cmd.rate : 0
    const parallel = cmd.parallel || 64
    const timeout = cmd.timeout || 30000
    let ok = 0
    let failed = 0
    let running = 0
    const all = []
    const start = Date.now()
    for (let k = 0; k < n; k++) {
      while (running >= parallel) await sleep(5)
      const due = start + k * gap
      if (due > Date.now()) await sleep(due - Date.now())
      running++
      all.push(connectOne(timeout).then((good) => { running--; if (good) ok++; else failed++ }))
    }
    await Promise.all(all)
    out({ ev: 'opened', ok, failed })
  }

  async function echoAll (cmd) {
    const bytes = cmd.bytes || 1000
    const timeout = cmd.timeout || 30000
    const errors = {}
    let ok = 0
    let failed = 0
    await Promise.all([...open.values()].map(async (socket) => {
      const payload = crypto.randomBytes(bytes)
      const got = []
      let n = 0
      try {
        await new Promise((resolve, reject) => {
          const t = setTimeout(() => reject(new Error('timeout: echo')), timeout)
          const ondata = (d) => { got.push(d); n += d.length; if (n >= bytes) { clearTimeout(t); socket.off('data', ondata); resolve() } }
          socket.on('data', ondata)
          socket.once('close', () => { clearTimeout(t); reject(new Error('closed during echo')) })
          socket.write(payload)
        })
        if (b4a.equals(b4a.concat(got), payload)) ok++
        else { failed++; count(errors, 'echo differs') }
      } catch (err) {
        failed++
        count(errors, err.message)
      }
    }))
    out({ ev: 'echoed', ok, failed, open: open.size, errors })
  }

  async function pairRaw (cmd) {
    const timeout = cmd.timeout || 20000
    let ok = 0
    let failed = 0
    const sockets = []
    await Promise.all(Array.from({ length: cmd.n }, async (_, i) => {
      const token = relay.token()
      await Promise.all([true, false].map(async (isInitiator) => {
        const job = jobs[i % jobs.length]
        const t0 = process.hrtime.bigint()
        const socket = job.connect(relayKey, { keyPair: DHT.keyPair() })
        socket.on('error', () => {})
        sockets.push(socket)
        const client = relay.Client.from(socket, { id: socket.publicKey })
        const rec = { ev: 'raw', i, side: isInitiator ? 'initiator' : 'responder', ok: false }
        try {
          await new Promise((resolve, reject) => {
            const t = setTimeout(() => reject(new Error('timeout: pair')), timeout)
            const stream = { id: (Math.random() * 0xffffffff) >>> 0 }
            client.pair(isInitiator, token, stream)
              .on('error', (err) => { clearTimeout(t); reject(err) })
              .on('data', () => { clearTimeout(t); resolve() })
          })
          rec.ok = true
          ok++
        } catch (err) {
          rec.error = err.code || err.message
          failed++
        }
        rec.ms = Number(process.hrtime.bigint() - t0) / 1e6
        out(rec)
      }))
    }))
    for (const s of sockets) s.destroy()
    out({ ev: 'rawDone', ok, failed })
  }

  const commands = {
    pairRaw,
    open: openMany,
    echo: echoAll,
    status: async () => out({ ev: 'status', open: open.size, closed, errors: closedErrors })
  }
  let queue = Promise.resolve()
  readline.createInterface({ input: process.stdin }).on('line', (line) => {
    if (!line.trim()) return
    const cmd = JSON.parse(line)
    queue = queue.then(() => commands[cmd.op](cmd)).catch((err) => out({ ev: 'command-error', op: cmd.op, message: err.message }))
  })
  process.stdin.on('end', async () => {
    await queue
    for (const s of open.values()) s.destroy()
    process.exit(0)
  })
  out({ ev: 'ready', server: id.encode(server.publicKey) })
}

main().catch((err) => { console.error(err); process.exit(2) })
