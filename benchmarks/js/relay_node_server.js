// The Node yardstick: a blind relay built from npm hyperdht + blind-relay exactly as
// blind-relay-service 2.x runs it (keep-alive 5 s, framed raw streams, id = remote public key).
// usage: node relay_node_server.js '<json: {bootstrap, port, host, seed (hex32)}>'
// Prints {"key": z32, "port": n, "pid": n}, then serves until SIGTERM/SIGINT. With "stats": true it prints
// blind-relay's stats as a JSON line whenever it receives SIGUSR2.
const path = require('path')
const req = (m) => require(require.resolve(m, { paths: [path.join(__dirname, '../../tests/interop/node_modules')] }))
const DHT = req('hyperdht')
const { Server: RelayServer } = req('blind-relay')
const id = req('hypercore-id-encoding')
const b4a = req('b4a')

async function main () {
  const opts = JSON.parse(process.argv[2] || '{}')
  const dht = new DHT({ port: opts.port || [0, 0], host: opts.host || '127.0.0.1', bootstrap: opts.bootstrap, ...(opts.dht || {}) })
  const relay = new RelayServer({ createStream: (o) => dht.createRawStream({ ...o, framed: true }) })
  const server = dht.createServer((socket) => {
    socket.setKeepAlive(5000)
    socket.on('error', () => {})
    relay.accept(socket, { id: socket.remotePublicKey }).on('error', () => {})
  })
  const keyPair = DHT.keyPair(opts.seed ? b4a.from(opts.seed, 'hex') : undefined)
  await server.listen(keyPair)
  process.stdout.write(JSON.stringify({ key: id.encode(server.publicKey), port: dht.address().port, ports: [dht.io.serverSocket.address().port, dht.io.clientSocket.address().port], pid: process.pid }) + '\n')
  process.on('SIGUSR2', () => process.stdout.write(JSON.stringify({ stats: relay.stats }) + '\n'))
  const stop = async () => { await relay.close(); await server.close(); await dht.destroy(); process.exit(0) }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
}

main().catch((err) => { console.error(err); process.exit(1) })
