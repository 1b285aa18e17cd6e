"""The demo: a sandbox deployment with stand-in `task`/`cosmicac`, a private DHT, and a worker
whose jobs meet through the relay."""
