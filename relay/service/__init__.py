"""The relay as an operated service: storage and key, metrics, logs, limits, allow-list, systemd.

Modules: `storage` (primary key, corestore derivation, migration from blind-relay-service),
`metrics` (`/metrics` + `/stats`), `logs`, `limits`, `allow`, `systemd`, `runtime`
(`relay-runtime.json`) and `app` (the asyncio process that wires the protocol layers).
"""
