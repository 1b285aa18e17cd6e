// The line protocol the interop peers share: one JSON command per stdin line, answered on stdout
// with `done` or `command-error` (same `seq`), so the Python side can await each step.
const readline = require('readline')

const out = (o) => process.stdout.write(JSON.stringify(o) + '\n')

function serveCommands (commands) {
  readline.createInterface({ input: process.stdin }).on('line', (line) => {
    if (!line.trim()) return
    const cmd = JSON.parse(line)
    try {
      commands[cmd.op](cmd)
      out({ ev: 'done', op: cmd.op, seq: cmd.seq })
    } catch (err) {
      out({ ev: 'command-error', op: cmd.op, seq: cmd.seq, message: err.message })
    }
  })
  process.stdin.on('end', () => process.exit(0))
}

module.exports = { out, serveCommands }
