// A local hyperdht testnet on 127.0.0.1 for the relay tests and benchmarks.
// usage: node js/relay_testnet.js [size]   -> prints {"bootstrap":[{"host","port"}]}; runs until stdin closes
const createTestnet = require('hyperdht/testnet')

async function main () {
  const size = Number(process.argv[2] || 3)
  // port [0, 0] = any free port (a plain 0 means hyperdht's default 49737)
  const testnet = await createTestnet(size, { host: '127.0.0.1', port: [0, 0] })
  process.stdout.write(JSON.stringify({ bootstrap: testnet.bootstrap }) + '\n')
  const stop = async () => { await testnet.destroy(); process.exit(0) }
  process.stdin.on('end', stop)
  process.stdin.on('close', stop)
  process.stdin.resume()
  process.on('SIGTERM', stop)
}

main().catch((err) => { console.error(err); process.exit(1) })
