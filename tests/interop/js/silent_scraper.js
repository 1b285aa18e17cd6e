// A "scraper" that accepts hyperdht connections on its key and never says a word (a hung or
// hostile dht-prometheus bridge). usage: node js/silent_scraper.js '{"bootstrap":["127.0.0.1:port"]}'
// prints {"key": <z32>} once listening, then {"connection": n} per connection; runs until stdin closes.
const DHT = require('hyperdht')
const z32 = require('z32')

async function main () {
  const opts = JSON.parse(process.argv[2])
  const bootstrap = opts.bootstrap.map((b) => { const [host, port] = b.split(':'); return { host, port: Number(port) } })
  const dht = new DHT({ bootstrap, host: '127.0.0.1' })
  let n = 0
  const server = dht.createServer((socket) => {
    socket.on('error', () => {})
    process.stdout.write(JSON.stringify({ connection: ++n }) + '\n')
  })
  await server.listen(DHT.keyPair())
  process.stdout.write(JSON.stringify({ key: z32.encode(server.publicKey) }) + '\n')
  process.stdin.on('end', async () => { await dht.destroy(); process.exit(0) })
  process.stdin.resume()
}

main().catch((err) => { console.error(err); process.exit(1) })
