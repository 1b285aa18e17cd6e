// Flood a blind relay with pair requests for random tokens that nobody else will ever pair.
// usage: node js/relay_flood.js '<json: {bootstrap, relay, sessions: 10, pairs: 1000, hold: false}>'
// Each session is a real hyperdht connection (its own key pair) with an npm blind-relay Client
// that sends `pairs` pair requests. Prints {"sent": n, "sessions": s} once everything is written;
// with hold=true keeps the sessions open until stdin closes (so the relay holds the pending entries).
const DHT = require('hyperdht')
const relay = require('blind-relay')
const id = require('hypercore-id-encoding')

async function main () {
  const opts = JSON.parse(process.argv[2])
  const bootstrap = opts.bootstrap.map((b) => typeof b === 'string' ? b : `${b.host}:${b.port}`)
  const relayKey = id.decode(opts.relay)
  const sessions = opts.sessions || 10
  const pairs = opts.pairs || 1000
  const node = new DHT({ bootstrap, ephemeral: true, quickFirewall: false, host: '127.0.0.1', port: [0, 0] })
  await node.fullyBootstrapped()
  let sent = 0
  const sockets = []
  await Promise.all(Array.from({ length: sessions }, async () => {
    const keyPair = DHT.keyPair()
    const socket = node.connect(relayKey, { keyPair })
    socket.on('error', () => {})
    sockets.push(socket)
    await new Promise((resolve, reject) => { socket.once('open', resolve); socket.once('close', () => reject(new Error('relay connection closed'))) })
    const client = relay.Client.from(socket, { id: socket.publicKey })
    for (let i = 0; i < pairs; i++) {
      // a stand-in stream: the client only reads `.id` to put it in the request
      // a Readable: it sends its request once read from, as hyperdht's .on('data') does
      client.pair(i % 2 === 0, relay.token(), { id: (Math.random() * 0xffffffff) >>> 0 }).on('error', () => {}).on('data', () => {})
      sent++
      if (i % 100 === 99) await new Promise((resolve) => setImmediate(resolve))
    }
    await new Promise((resolve) => setTimeout(resolve, 100)) // let the writes leave
  }))
  process.stdout.write(JSON.stringify({ sent, sessions: sockets.length }) + '\n')
  const stop = async () => { for (const s of sockets) s.destroy(); await node.destroy(); process.exit(0) }
  if (opts.hold) {
    process.stdin.on('end', stop)
    process.stdin.resume()
  } else {
    await stop()
  }
}

main().catch((err) => { console.error(err); process.exit(1) })
