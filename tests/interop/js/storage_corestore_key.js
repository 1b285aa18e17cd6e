// Open (or create) a corestore 7 storage the way blind-relay-service does and print the relay key.
// usage: node js/storage_corestore_key.js <storage dir> [--no-close]
//   --no-close: die without closing the store (SIGKILL, as a crash or power cut would), leaving
//   the head only in RocksDB's WAL. Not process.exit(): rocksdb-native's destructors then race its
//   background threads, and the process sometimes dies of SIGSEGV after printing the key.
const path = require('path')
const Corestore = require('corestore')
const id = require('hypercore-id-encoding')

async function main () {
  const dir = path.resolve(process.argv[2])
  const store = new Corestore(dir)
  await store.ready()
  const kp = await store.createKeyPair('blind-relay')
  process.stdout.write(JSON.stringify({ key: id.encode(kp.publicKey), publicKey: kp.publicKey.toString('hex') }) + '\n')
  if (process.argv.includes('--no-close')) process.kill(process.pid, 'SIGKILL')
  await store.close()
}

main().catch((err) => { console.error(err); process.exit(1) })
