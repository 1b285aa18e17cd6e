// The Node reference relay with a dht-prometheus scraper, set up as blind-relay-service 2.2.0's
// --scraper-* path does it: hyperdht + blind-relay, hyper-instrument 3.2.1 on the same DHT, and
// the blind_relay_* gauges read from the relay's stats at scrape time.
// usage: node js/instrumented_relay.js '{"bootstrap":["127.0.0.1:port"],"scraperPublicKey":..,"scraperSecret":..,"alias":..}'
// prints {"key": <relay z32>, "target": <metrics z32>} once listening; runs until stdin closes.
const DHT = require('hyperdht')
const { Server: RelayServer } = require('blind-relay')
const Instrumentation = require('hyper-instrument')
const z32 = require('z32')

async function main () {
  const opts = JSON.parse(process.argv[2])
  const bootstrap = opts.bootstrap.map((b) => { const [host, port] = b.split(':'); return { host, port: Number(port) } })
  const dht = new DHT({ bootstrap, host: '127.0.0.1' })
  const relay = new RelayServer({ createStream: (o) => dht.createRawStream({ ...o, framed: true }) })
  const server = dht.createServer((socket) => {
    socket.on('error', () => {})
    relay.accept(socket, { id: socket.remotePublicKey }).on('error', () => {})
  })
  await server.listen(DHT.keyPair())
  const instrumentation = new Instrumentation({
    dht,
    scraperPublicKey: opts.scraperPublicKey,
    scraperSecret: opts.scraperSecret,
    prometheusAlias: opts.alias,
    prometheusServiceName: 'blind-relay',
    version: '2.2.0'
  })
  const prom = instrumentation.promClient
  const groups = {
    sessions: ['accepted', 'opened', 'closed'],
    pairings: ['requested', 'matched', 'cancelled', 'pending', 'active'],
    streams: ['opened', 'closed', 'errors']
  }
  for (const [group, names] of Object.entries(groups)) {
    for (const name of names) {
      new prom.Gauge({ // eslint-disable-line no-new
        name: `blind_relay_${group}_${name}`,
        help: `blind-relay ${group} ${name}`,
        collect () { this.set(relay.stats[group][name]) }
      })
    }
  }
  await instrumentation.ready()
  process.stdout.write(JSON.stringify({
    key: z32.encode(server.publicKey),
    target: z32.encode(instrumentation.dhtPromClient.publicKey)
  }) + '\n')
  const stop = async () => { await instrumentation.close().catch(() => {}); process.exit(0) }
  process.stdin.on('end', stop)
  process.stdin.resume()
}

main().catch((err) => { console.error(err); process.exit(1) })
