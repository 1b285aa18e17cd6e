// Several npm blind-relay Clients, each on its own TCP connection + @hyperswarm/secret-stream,
// driven by JSON commands on stdin, reporting JSON events on stdout. The channel id is the
// client's own public key, exactly as hyperdht does it (relay.Client.from(socket, {id: socket.publicKey})).
// Run with cwd tests/interop. Used by tests/interop/test_interop_blind.py.
const net = require('net')
const SecretStream = require('@hyperswarm/secret-stream')
const relay = require('blind-relay')
const crypto = require('hypercore-crypto')

const { out, serveCommands } = require('./command_loop')
const hex = (b) => (b ? Buffer.from(b).toString('hex') : null)
const buf = (h) => Buffer.from(h, 'hex')

const clients = new Map()

const commands = {
  connect ({ name, port, seed }) {
    const socket = net.connect(port, '127.0.0.1')
    const stream = new SecretStream(true, socket, { keyPair: crypto.keyPair(buf(seed)) })
    const client = relay.Client.from(stream, { id: stream.publicKey })
    clients.set(name, { stream, client })
    stream.on('error', (err) => out({ ev: 'stream-error', name, message: err.message }))
    stream.on('close', () => out({ ev: 'stream-close', name }))
    client.on('open', () => out({ ev: 'open', name, publicKey: hex(stream.publicKey) }))
    client.on('close', () => out({ ev: 'close', name }))
    client.on('pair', (isInitiator, token, rawStream, remoteId) =>
      out({ ev: 'pair', name, isInitiator, token: hex(token), localId: rawStream.id, remoteId }))
  },
  pair ({ name, initiator, token, id }) {
    const req = clients.get(name).client.pair(initiator, buf(token), { id })
    req.on('data', (remoteId) => out({ ev: 'request-data', name, token, remoteId }))
    req.on('error', (err) => out({ ev: 'request-error', name, token, message: err.message }))
  },
  unpair ({ name, token }) { clients.get(name).client.unpair(buf(token)) },
  destroy ({ name }) { clients.get(name).stream.destroy() },
  end ({ name }) { clients.get(name).stream.end() },
  exit () { process.exit(0) }
}

serveCommands(commands)
