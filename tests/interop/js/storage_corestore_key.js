// Open (or create) a corestore 7 storage the way blind-relay-service does and print the relay key.
// usage: node js/storage_corestore_key.js <storage dir> [--no-close]
//   --no-close: exit without closing the store, leaving the head only in RocksDB's WAL
const path = require('path')
const Corestore = require('corestore')
const id = require('hypercore-id-encoding')

async function main () {
  const dir = path.resolve(process.argv[2])
  const store = new Corestore(dir)
  await store.ready()
  const kp = await store.createKeyPair('blind-relay')
  process.stdout.write(JSON.stringify({ key: id.encode(kp.publicKey), publicKey: kp.publicKey.toString('hex') }) + '\n')
  if (process.argv.includes('--no-close')) process.exit(0)
  await store.close()
}

main().catch((err) => { console.error(err); process.exit(1) })
