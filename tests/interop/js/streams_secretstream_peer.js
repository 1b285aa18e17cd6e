// Real @hyperswarm/secret-stream peer over TCP on 127.0.0.1 for the Python interop tests.
// argv[2] = JSON {mode: "server"|"client", port?, seed (hex), sendBytes, tamper?, handshake?}
// handshake (hex fields tx, rx, hash, publicKey, remotePublicKey) = hyperdht's hand-over path;
// pattern ("IK") + remotePublicKey (hex) = a non-default Noise pattern inside the stream.
// Prints one JSON object per line: listening, open, sent, received, error, close.
'use strict'
const net = require('net')
const crypto = require('crypto')
const NoiseSecretStream = require('@hyperswarm/secret-stream')

const opts = JSON.parse(process.argv[2])
const keyPair = NoiseSecretStream.keyPair(Buffer.from(opts.seed, 'hex'))
const SIZES = [1, 1000, 65536, 17, 300000, 0, 4096, 123457]

function out (obj) { process.stdout.write(JSON.stringify(obj) + '\n') }

function run (socket, isInitiator) {
  const handshake = opts.handshake
    ? Object.fromEntries(Object.entries(opts.handshake).map(([k, v]) => [k, Buffer.from(v, 'hex')]))
    : null
  const streamOpts = handshake ? { handshake } : { keyPair }
  if (opts.pattern) streamOpts.pattern = opts.pattern
  if (opts.remotePublicKey) streamOpts.remotePublicKey = Buffer.from(opts.remotePublicKey, 'hex')
  const stream = new NoiseSecretStream(isInitiator, socket, streamOpts)
  const hashIn = crypto.createHash('sha256')
  let bytesIn = 0
  let messagesIn = 0

  stream.on('connect', () => {
    out({
      event: 'open',
      publicKey: stream.publicKey.toString('hex'),
      remotePublicKey: stream.remotePublicKey.toString('hex'),
      handshakeHash: stream.handshakeHash.toString('hex')
    })
    if (opts.tamper) {
      // a frame the peer cannot authenticate, written under the secret stream
      const body = crypto.randomBytes(40)
      const frame = Buffer.concat([Buffer.from([body.length, 0, 0]), body])
      socket.write(frame)
      return
    }
    const data = crypto.randomBytes(opts.sendBytes)
    let off = 0
    let i = 0
    let messages = 0
    while (off < data.length) {
      const n = Math.min(SIZES[i++ % SIZES.length], data.length - off)
      stream.write(data.subarray(off, off + n))
      off += n
      messages++
    }
    out({ event: 'sent', bytes: data.length, messages, sha256: crypto.createHash('sha256').update(data).digest('hex') })
    stream.end()
  })
  stream.on('data', (d) => {
    hashIn.update(d)
    bytesIn += d.length
    messagesIn++
  })
  stream.on('end', () => {
    out({ event: 'received', bytes: bytesIn, messages: messagesIn, sha256: hashIn.digest('hex') })
  })
  stream.on('error', (err) => out({ event: 'error', message: err.message }))
  stream.on('close', () => {
    out({ event: 'close', bytesIn, messagesIn })
    if (opts.mode === 'server') server.close()
  })
}

let server = null
if (opts.mode === 'server') {
  server = net.createServer((socket) => run(socket, false))
  server.listen(0, '127.0.0.1', () => {
    out({ event: 'listening', port: server.address().port, publicKey: keyPair.publicKey.toString('hex') })
  })
} else {
  const socket = net.connect(opts.port, '127.0.0.1')
  run(socket, true)
}
