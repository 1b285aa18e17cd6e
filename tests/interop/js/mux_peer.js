// A protomux peer driven line by line from stdin (JSON commands), reporting JSON events on
// stdout. Runs the real npm packages: @hyperswarm/secret-stream over TCP, protomux on top.
// Run with cwd tests/interop. Used by tests/interop/test_interop_protomux.py.
const net = require('net')
const SecretStream = require('@hyperswarm/secret-stream')
const Protomux = require('protomux')
const c = require('compact-encoding')
const crypto = require('hypercore-crypto')

const { out, serveCommands } = require('./command_loop')
const hex = (b) => (b ? Buffer.from(b).toString('hex') : null)
const buf = (h) => (h === null || h === undefined ? null : Buffer.from(h, 'hex'))

let stream = null
let mux = null
const channels = new Map()

function createChannel (name, { protocol, id, types = 1, handshake = null }) {
  const messages = []
  for (let t = 0; t < types; t++) {
    messages.push({
      encoding: c.raw,
      onmessage (m) { out({ ev: 'message', name, type: t, hex: hex(m) }) }
    })
  }
  const ch = mux.createChannel({
    protocol,
    id: buf(id),
    handshake: handshake !== null ? c.raw : null,
    messages,
    onopen (hs) { out({ ev: 'open', name, handshake: hex(hs) }) },
    onclose (isRemote) { out({ ev: 'close', name, isRemote }) }
  })
  if (ch === null) { out({ ev: 'open-null', name }); return null }
  channels.set(name, ch)
  ch.open(handshake !== null ? buf(handshake) : undefined)
  return ch
}

const commands = {
  connect ({ port, initiator, seed }) {
    const socket = net.connect(port, '127.0.0.1')
    stream = new SecretStream(initiator, socket, { keyPair: crypto.keyPair(buf(seed)) })
    mux = new Protomux(stream)
    stream.on('open', () => out({ ev: 'connected', publicKey: hex(stream.publicKey), remotePublicKey: hex(stream.remotePublicKey) }))
    stream.on('error', (err) => out({ ev: 'stream-error', message: err.message }))
    stream.on('close', () => out({ ev: 'stream-close' }))
  },
  open (cmd) { createChannel(cmd.name, cmd) },
  pair (cmd) {
    // accept a remote-first open of (protocol, id) by creating the channel in the notify hook
    mux.pair({ protocol: cmd.protocol, id: buf(cmd.id) }, () => {
      out({ ev: 'requested', name: cmd.name })
      createChannel(cmd.name, cmd)
    })
  },
  send ({ name, type, hex: h }) { channels.get(name).messages[type].send(buf(h)) },
  sendmany ({ items }) { for (const { name, type, hex: h } of items) channels.get(name).messages[type].send(buf(h)) },
  cork () { mux.cork() },
  uncork () { mux.uncork() },
  close ({ name }) { channels.get(name).close() },
  end () { stream.end() },
  destroy () { stream.destroy() },
  exit () { process.exit(0) }
}

serveCommands(commands)
