// Real noise-handshake 4.2 + noise-curve-ed peer driven over stdin/stdout for the Python tests.
// argv[2] = JSON {pattern, initiator, seed, remoteStatic?, prologue}
// stdin lines: {"send": payloadHex} or {"recv": messageHex}
// stdout lines: {"publicKey"} first, then {"msg"} / {"payload"} / {"error"}, and
// {"complete": true, tx, rx, hash, rs} once the handshake is done.
'use strict'
const readline = require('readline')
const Noise = require('noise-handshake')
const curve = require('noise-curve-ed')

const opts = JSON.parse(process.argv[2])
const hex = (b) => Buffer.from(b).toString('hex')
const keyPair = curve.generateKeyPair(Buffer.from(opts.seed, 'hex'))
const noise = new Noise(opts.pattern, opts.initiator, keyPair, { curve })
noise.initialise(Buffer.from(opts.prologue, 'hex'), opts.remoteStatic ? Buffer.from(opts.remoteStatic, 'hex') : undefined)

function out (obj) { process.stdout.write(JSON.stringify(obj) + '\n') }
function done () {
  if (noise.complete) out({ complete: true, tx: hex(noise.tx), rx: hex(noise.rx), hash: hex(noise.hash), rs: hex(noise.rs) })
}

out({ publicKey: hex(keyPair.publicKey) })
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  const cmd = JSON.parse(line)
  try {
    if (cmd.send !== undefined) {
      out({ msg: hex(noise.send(Buffer.from(cmd.send, 'hex'))) })
    } else {
      out({ payload: hex(noise.recv(Buffer.from(cmd.recv, 'hex'))) })
    }
    done()
  } catch (err) {
    out({ error: err.message })
  }
})
