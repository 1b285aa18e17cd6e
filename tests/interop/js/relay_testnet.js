// A local hyperdht testnet on 127.0.0.1 for the relay tests and benchmarks.
// usage: node js/relay_testnet.js [size] [bootstrapPort]   -> prints {"bootstrap":[{"host","port"}]};
// runs until stdin closes. bootstrapPort: the first node's port (a test that started a relay first).
const createTestnet = require('hyperdht/testnet')

async function main () {
  const size = Number(process.argv[2] || 3)
  // port [0, 0] = any free port (a plain 0 means hyperdht's default 49737)
  const port = process.argv[3] ? Number(process.argv[3]) : [0, 0]
  const testnet = await createTestnet(size, { host: '127.0.0.1', port })
  process.stdout.write(JSON.stringify({ bootstrap: testnet.bootstrap }) + '\n')
  const stop = async () => { await testnet.destroy(); process.exit(0) }
  process.stdin.on('end', stop)
  process.stdin.on('close', stop)
  process.stdin.resume()
  process.on('SIGTERM', stop)
}

main().catch((err) => { console.error(err); process.exit(1) })
