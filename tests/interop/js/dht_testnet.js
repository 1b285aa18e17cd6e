// A local hyperdht testnet on 127.0.0.1 plus a command channel for the DHT interop tests.
// usage: node js/dht_testnet.js [size]
// Prints {"event":"ready","bootstrap":[{host,port}],"nodes":[{host,port}]} and then answers one JSON
// command per stdin line with one JSON line {"id", "ok", ...}. Every port is random: the nodes are
// built like hyperdht/testnet.js (ephemeral: false, firewalled: false) but with port [0, 0], because a
// plain 0 means hyperdht's default 49737 and tests must not take fixed ports.
const DHT = require('hyperdht')
const b4a = require('b4a')
const readline = require('readline')

const PORT_ANY = [0, 0]

function out (obj) {
  process.stdout.write(JSON.stringify(obj) + '\n')
}

async function main () {
  const size = Number(process.argv[2] || 4)
  const nodes = []
  const first = new DHT({ ephemeral: false, firewalled: false, bootstrap: [], port: PORT_ANY, host: '127.0.0.1' })
  await first.fullyBootstrapped()
  nodes.push(first)
  const bootstrap = [{ host: '127.0.0.1', port: first.address().port }]
  while (nodes.length < size) {
    const node = new DHT({ ephemeral: false, firewalled: false, bootstrap, port: PORT_ANY, host: '127.0.0.1' })
    await node.fullyBootstrapped()
    nodes.push(node)
  }
  const clients = []
  const named = new Map()
  function client (name, opts = {}) {
    if (name && named.has(name)) return named.get(name)
    const c = new DHT({ bootstrap, port: PORT_ANY, host: '127.0.0.1', ...opts })
    clients.push(c)
    if (name) named.set(name, c)
    return c
  }

  const commands = {
    // FIND_PEER walk from a testnet node: which nodes hold a record for key?
    async findPeer ({ key }) {
      const found = []
      const asker = nodes.filter((n) => !n.destroyed).pop()
      for await (const data of asker.findPeer(b4a.from(key, 'hex'))) {
        found.push({ from: { host: data.from.host, port: data.from.port }, publicKey: b4a.toString(data.peer.publicKey, 'hex') })
      }
      return { found }
    },
    // dht-rpc PING from a testnet node to an address
    async ping ({ host, port }) {
      const res = await nodes[1].ping({ host, port })
      return { to: res.to, from: { host: res.from.host, port: res.from.port }, nodeId: res.from.id ? b4a.toString(res.from.id, 'hex') : null }
    },
    // one internal FIND_NODE request to an address, returns its closerNodes
    async findNode ({ host, port, target }) {
      const q = nodes[1].findNode(b4a.from(target, 'hex'), { nodes: [{ host, port }], onlyClosestNodes: true, retries: 2 })
      const replies = []
      for await (const r of q) {
        replies.push({ from: { host: r.from.host, port: r.from.port }, closerNodes: (r.closerNodes || []).map((n) => ({ host: n.host, port: n.port })) })
      }
      return { replies }
    },
    // a user command the python node does not serve: expect UNKNOWN_COMMAND (error 1)
    async request ({ host, port, command, target }) {
      const res = await nodes[1].request({ command, target: target ? b4a.from(target, 'hex') : null }, { host, port })
      return { error: res.error, closerNodes: (res.closerNodes || []).length }
    },
    // storage commands from a testnet node (they reach every persistent node near the target)
    async immutablePut ({ value }) {
      const { hash, closestNodes } = await nodes[1].immutablePut(b4a.from(value))
      return { hash: b4a.toString(hash, 'hex'), closestNodes: closestNodes.map((n) => ({ host: n.host, port: n.port })) }
    },
    async immutableGet ({ hash }) {
      const res = await nodes[nodes.length - 1].immutableGet(b4a.from(hash, 'hex'))
      return { value: res ? b4a.toString(res.value) : null, from: res ? { host: res.from.host, port: res.from.port } : null }
    },
    async mutablePut ({ value, seq = 0 }) {
      const keyPair = DHT.keyPair(b4a.alloc(32, 7))
      const res = await nodes[1].mutablePut(keyPair, b4a.from(value), { seq })
      return { publicKey: b4a.toString(res.publicKey, 'hex'), seq: res.seq }
    },
    async mutableGet ({ publicKey }) {
      const res = await nodes[nodes.length - 1].mutableGet(b4a.from(publicKey, 'hex'))
      return { value: res ? b4a.toString(res.value) : null, seq: res ? res.seq : null }
    },
    async announceTopic ({ topic }) {
      const keyPair = DHT.keyPair()
      await nodes[1].announce(b4a.from(topic, 'hex'), keyPair).finished()
      return { publicKey: b4a.toString(keyPair.publicKey, 'hex') }
    },
    async lookupTopic ({ topic }) {
      const found = []
      for await (const data of nodes[nodes.length - 1].lookup(b4a.from(topic, 'hex'))) {
        found.push({ from: { host: data.from.host, port: data.from.port }, peers: data.peers.map((p) => b4a.toString(p.publicKey, 'hex')) })
      }
      return { found }
    },
    // stop the testnet nodes at these ports (to see announce nodes go away)
    async kill ({ ports }) {
      for (const n of nodes) {
        if (!n.destroyed && ports.includes(n.address().port)) await n.destroy({ force: true })
      }
      return { killed: ports.length }
    },
    // a Node hyperdht echo server on a testnet node (for side-by-side comparisons)
    async serve () {
      const server = nodes[nodes.length - 1].createServer((socket) => {
        socket.on('error', () => {})
        socket.pipe(socket)
      })
      await server.listen(DHT.keyPair())
      return { key: b4a.toString(server.publicKey, 'hex') }
    },
    // hyperdht client connect + echo over the secret stream
    // client: reuse a named DHT client (its relay-address cache makes a reconnect go direct)
    // relayAddresses: DHT nodes to send the handshake to first (hyperdht connect option)
    // dhtOpts: options of a fresh client DHT; connectOpts: options of dht.connect
    async connect ({ key, message, timeoutMs: timeout = 20000, keepOpen = false, client: name = null, relayAddresses = null, dhtOpts = {}, connectOpts = {} }) {
      const dht = client(name, dhtOpts)
      if (dhtOpts.quickFirewall === false) await dht.fullyBootstrapped()
      const started = process.hrtime.bigint()
      const socket = dht.connect(b4a.from(key, 'hex'), { ...(relayAddresses ? { relayAddresses } : {}), ...connectOpts })
      const msg = b4a.from(message || 'hello')
      const result = await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('connect timeout')), timeout)
        let got = b4a.alloc(0)
        socket.on('error', (err) => { clearTimeout(timer); reject(err) })
        socket.on('open', () => socket.write(msg))
        socket.on('data', (data) => {
          got = b4a.concat([got, data])
          if (got.byteLength >= msg.byteLength) {
            clearTimeout(timer)
            resolve({
              elapsedMs: Number(process.hrtime.bigint() - started) / 1e6,
              clientFirewalled: dht.firewalled,
              punches: dht.stats.punches,
              echo: b4a.toString(got),
              remotePublicKey: b4a.toString(socket.remotePublicKey, 'hex'),
              handshakeHash: b4a.toString(socket.handshakeHash, 'hex'),
              rawStream: { remotePort: socket.rawStream.remotePort, remoteHost: socket.rawStream.remoteHost, remoteId: socket.rawStream.remoteId }
            })
          }
        })
      })
      if (!keepOpen) {
        socket.end()
        socket.destroy()
      }
      return result
    }
  }

  out({ event: 'ready', bootstrap, nodes: nodes.map((n) => ({ host: '127.0.0.1', port: n.address().port })) })

  const rl = readline.createInterface({ input: process.stdin })
  rl.on('line', async (line) => {
    let cmd
    try {
      cmd = JSON.parse(line)
    } catch {
      return
    }
    try {
      const res = await commands[cmd.cmd](cmd)
      out({ event: 'result', ...res, id: cmd.id, ok: true })
    } catch (err) {
      out({ event: 'result', id: cmd.id, ok: false, error: String(err && (err.code || err.message || err)) })
    }
  })
  const stop = async () => {
    for (const c of clients) await c.destroy({ force: true }).catch(() => {})
    for (let i = nodes.length - 1; i >= 0; i--) await nodes[i].destroy({ force: true }).catch(() => {})
    process.exit(0)
  }
  rl.on('close', stop)
  process.on('SIGTERM', stop)
}

main().catch((err) => {
  console.error(err)
  process.exit(1)
})
