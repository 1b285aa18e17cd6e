// A hyperdht testnet on one "wan" host: `size` persistent, unfirewalled nodes on one address.
// usage: node testnet.js '{"host": "11.0.0.3", "size": 12}'
// Prints {"event":"ready","bootstrap":["host:port", ...]} and runs until stdin closes.
// Built like hyperdht/testnet.js (ephemeral: false, firewalled: false), but on the given host and
// on random ports: the topology's wan is a namespace of its own, never the machine's network.
const DHT = require('hyperdht')

async function main () {
  const { host, size = 12 } = JSON.parse(process.argv[2])
  const first = new DHT({ ephemeral: false, firewalled: false, bootstrap: [], port: [0, 0], host })
  await first.fullyBootstrapped()
  const bootstrap = [`${host}:${first.address().port}`]
  const nodes = [first]
  while (nodes.length < size) {
    const node = new DHT({ ephemeral: false, firewalled: false, bootstrap, port: [0, 0], host })
    await node.fullyBootstrapped()
    nodes.push(node)
  }
  // bootstrap through several nodes, as the public DHT's three bootstrap hosts
  const all = nodes.slice(0, 3).map((n) => `${host}:${n.address().port}`)
  process.stdout.write(JSON.stringify({ event: 'ready', bootstrap: all }) + '\n')
  process.stdin.resume()
  process.stdin.on('end', async () => {
    await Promise.allSettled(nodes.map((n) => n.destroy()))
    process.exit(0)
  })
}

main().catch((err) => { console.error(err); process.exit(1) })
