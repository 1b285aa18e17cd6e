// One hyperdht peer on one LAN host, driven by JSON lines on stdin, reporting JSON lines on stdout.
// usage: node peer.js '{"bootstrap": ["host:port"], "name": "a"}'
// Commands (one per line, each answered with {"ev": "result", "seq", ...} or {"ev": "error", "seq", "message"}):
//   {"op": "info"}                                      -> NAT view: host, port, firewalled, randomized
//   {"op": "listen", "relayThrough"?, "holepunch"?: bool, "shareLocalAddress"?: bool}
//                                                       -> {publicKey}; the server echoes every byte
//   {"op": "connect", "key", "relayThrough"?, "holepunch"?: bool, "bytes", "timeout", "idleMs"?, "upgrade"?: bool,
//    "settleMs"?: wait that long for a switch to direct, then echo again on whatever path}
//                                                       -> {ok, error?, remote, setupMs, echoMs, ...}
//   {"op": "serverConnections"}                         -> every server-side connection's remotes so far
// Every raw stream's remote is reported as seen by this peer (rawStream.remoteHost/remotePort), so
// the test checks "relayed" and "upgraded" from the peers' own view, not from the relay's.
const DHT = require('hyperdht')
const crypto = require('hypercore-crypto')
const id = require('hypercore-id-encoding')
const b4a = require('b4a')
const readline = require('readline')

const opts = JSON.parse(process.argv[2])
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n')
const dht = new DHT({ bootstrap: opts.bootstrap, ...(opts.dht || {}) })
const servers = []
const serverConnections = []

function withTimeout (p, ms, what) {
  let t
  return Promise.race([p, new Promise((resolve, reject) => { t = setTimeout(() => reject(new Error('timeout: ' + what)), ms) })])
    .finally(() => clearTimeout(t))
}

const remoteOf = (rs) => ({ host: rs.remoteHost, port: rs.remotePort })
const relayOpt = (k) => (k ? id.decode(k) : null)

function watchRemote (rs, rec) {
  rec.remotes = [remoteOf(rs)]
  rs.on('remote-changed', () => rec.remotes.push(remoteOf(rs)))
}

function echoOnce (socket, bytes, timeout) {
  const payload = crypto.randomBytes(bytes)
  const got = []
  let n = 0
  const echoed = new Promise((resolve, reject) => {
    const onData = (d) => { got.push(d); n += d.length; if (n >= bytes) { socket.off('data', onData); resolve() } }
    socket.on('data', onData)
    socket.once('close', () => reject(new Error('closed during echo')))
  })
  // secret-stream messages are at most 16 MiB: write in 64 KiB pieces, as an application would
  for (let i = 0; i < bytes; i += 65536) socket.write(payload.subarray(i, i + 65536))
  return withTimeout(echoed, timeout, 'echo').then(() => b4a.equals(b4a.concat(got), payload))
}

const commands = {
  async info () {
    await dht.fullyBootstrapped()
    return { host: dht.host, port: dht.port, firewalled: dht.firewalled, randomized: dht.randomized, nodes: dht.nodes ? dht.nodes.length : null }
  },
  async listen (cmd) {
    await dht.fullyBootstrapped()
    const server = dht.createServer({
      relayThrough: relayOpt(cmd.relayThrough),
      holepunch: cmd.holepunch === false ? false : undefined,
      shareLocalAddress: cmd.shareLocalAddress === true
    }, (socket) => {
      const rec = { at: Date.now() }
      watchRemote(socket.rawStream, rec)
      serverConnections.push(rec)
      socket.on('error', (err) => { rec.error = err.message })
      socket.on('close', () => { rec.closed = true })
      socket.pipe(socket) // echo
    })
    await server.listen(crypto.keyPair())
    servers.push(server)
    return { publicKey: b4a.toString(server.publicKey, 'hex') }
  },
  async serverConnections () {
    return { connections: serverConnections }
  },
  async connect (cmd) {
    await dht.fullyBootstrapped()
    const rec = { ok: false }
    const timeout = cmd.timeout || 30000
    const t0 = Date.now()
    const socket = dht.connect(b4a.from(cmd.key, 'hex'), {
      relayThrough: relayOpt(cmd.relayThrough),
      holepunch: cmd.holepunch === false ? () => false : undefined,
      localConnection: false,
      fastOpen: false
    })
    socket.on('error', (err) => { rec.error = rec.error || `${err.code || ''} ${err.message}`.trim() })
    try {
      await withTimeout(new Promise((resolve, reject) => {
        socket.once('open', resolve)
        socket.once('close', () => reject(new Error(rec.error || 'closed before open')))
      }), timeout, 'open')
      rec.setupMs = Date.now() - t0
      watchRemote(socket.rawStream, rec)
      const t1 = Date.now()
      rec.ok = await echoOnce(socket, cmd.bytes || 1000, timeout)
      rec.echoMs = Date.now() - t1
      if (cmd.idleMs) {
        // idle long enough for the NATs' conntrack entries to expire, then talk again
        await new Promise((resolve) => setTimeout(resolve, cmd.idleMs))
        const t2 = Date.now()
        rec.okAfterIdle = await echoOnce(socket, cmd.bytesAfterIdle || 10000, timeout)
        rec.echoAfterIdleMs = Date.now() - t2
        rec.ok = rec.ok && rec.okAfterIdle
      }
      if (cmd.settleMs) {
        // give the punch its chance (up to settleMs, or until the switch), then the connection
        // must still carry data, on whichever path it ended up
        const rs = socket.rawStream
        await new Promise((resolve) => {
          const t = setTimeout(resolve, cmd.settleMs)
          rs.once('remote-changed', () => { clearTimeout(t); resolve() })
        })
        rec.okAfterSettle = await echoOnce(socket, 10000, timeout)
        rec.ok = rec.ok && rec.okAfterSettle
      }
      if (cmd.upgrade) {
        // wait (bounded) for the switch to direct, then echo again on the new path
        const rs = socket.rawStream
        if (rec.remotes.length < 2) {
          await withTimeout(new Promise((resolve, reject) => {
            rs.once('remote-changed', resolve)
            rs.once('close', () => reject(new Error('raw stream closed before its remote changed')))
          }), timeout, 'upgrade to direct')
        }
        rec.okAfterUpgrade = await echoOnce(socket, 10000, timeout)
        rec.ok = rec.ok && rec.okAfterUpgrade
      }
    } catch (err) {
      rec.error = rec.error && rec.error !== err.message ? `${err.message} (${rec.error})` : err.message
      rec.ok = false
    }
    rec.totalMs = Date.now() - t0
    rec.finalRemote = socket.rawStream ? remoteOf(socket.rawStream) : null
    socket.destroy()
    return rec
  }
}

readline.createInterface({ input: process.stdin }).on('line', (line) => {
  if (!line.trim()) return
  const cmd = JSON.parse(line)
  Promise.resolve().then(() => commands[cmd.op](cmd)).then(
    (res) => out({ ev: 'result', seq: cmd.seq, ...res }),
    (err) => out({ ev: 'error', seq: cmd.seq, message: err.message })
  )
})
process.stdin.on('end', async () => {
  await Promise.allSettled(servers.map((s) => s.close()))
  await dht.destroy().catch(() => {})
  process.exit(0)
})
out({ ev: 'started', pid: process.pid })
