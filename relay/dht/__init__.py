"""dht-rpc node and HyperDHT server and client, so real Node `hyperdht` peers can find and reach us
(and we them).

Layers (sans-IO cores, one asyncio runtime):

- `relay.dht.messages` — wire codecs: dht-rpc `Request`/`Response` frames
  (`decode_message`), hyperdht values (`Handshake`, `Holepunch`, `NoisePayload`,
  `HolepunchPayload`, `PeerRecord`, `Announce`, `LookupReply`), namespaces, `node_id`,
  `announce_signable`, enums `Internal`, `Command`, `ErrorCode`, `Firewall`, `Mode`.
  `DHTError` is the one error type of this layer (`.code`: `BAD_MESSAGE`,
  `REQUEST_TIMEOUT`, `BIND_FAILED`, ...).
- `relay.dht.table` — `RoutingTable` (kademlia-routing-table), `NatSampler` (nat-sampler).
- `relay.dht.address` — `OwnAddress`: our public address, voted from replies to our own
  requests (one vote per host; the first needs 3 agreeing hosts until our first walk ends)
  and rechecked with its witnesses before it moves.
- `relay.dht.core` — `DHTCore`: the node's state and decisions (table upkeep, the tick,
  reachability verdicts, rejoining, every command handler, handshake routing); bytes,
  ticks and `now` in, datagrams, one deadline and events out.
- `relay.dht.rpc` — `RPC`: tids, retransmission deadlines, congestion window, round-trip
  tokens; datagrams and `now` in, datagrams and events out.
- `relay.dht.query` — `Query`: the iterative walk (dht-rpc `lib/query.js`).
- `relay.dht.handshake` — `HandshakeResponder`: Noise IK responder + dedup by message 1.
- `relay.dht.backlog` — `HandshakeBacklog`: new handshakes waiting for the CPU (the least
  served host first, stale ones shed, bounded), so a flood never stalls the socket reads.
- `relay.dht.persistent` — `Persistent`: what a persistent node stores for others
  (announce records, forwards, mutable/immutable values; xache-style expiry).
- `relay.dht.announcer` — `AnnounceState` (sans-IO decisions) + `Announcer` (driver).
- `relay.dht.router` — where PEER_HANDSHAKE / PEER_HOLEPUNCH go next (pure functions).
- `relay.dht.holepunch` — `NatAnalyzer`, `PunchState`: server-side holepunch decisions.
- `relay.dht.blindclient` — `BlindRelayClient`: blind-relay `pair` from the peer's side.
- `relay.dht.node`, `.announcer`, `.server`, `.client`, `.connection` — the asyncio runtime
  (`DHTNode` keeps the sockets, awaited requests and the one clock, and runs the round-trip
  sequences `DHTCore` asks for: walks, joining, the PING_NAT check).

Public asyncio API (stable)::

    from relay.udx import UDX
    from relay.dht import DHTNode, HyperDHTServer, Connection, DHTError

    udx = UDX()
    node = DHTNode(bootstrap=["127.0.0.1:49737"],   # default: the public hyperdht nodes
                   host="0.0.0.0", port=49737,      # the server socket (UDX + dht-rpc share it)
                   udx=udx,                         # sockets are bound as udx.create_socket(...)
                   firewalled=None,                 # None: detect with PING_NAT; False: "I am public"
                   ephemeral=True)                  # True: never store for others (default);
    #   False: become persistent at bootstrap if reachable; None: adaptive, as Node (~20 min)
    #   or DHTNode(socket=existing_udx_socket, udx=udx, ...) to use an already bound socket.
    await node.bootstrap()                          # raises DHTError("BIND_FAILED") if the port is taken;
    #   bootstrap(require_reply=True) also raises DHTError("BOOTSTRAP_FAILED") when no node answered;
    #   otherwise a node nobody answered (or that lost every node) keeps rejoining: 5, 10, 15 s...
    node.stats()  # {"bootstrapped", "firewalled", "public_host", "public_port", "last_announce", "nodes"}
    node.bootstrapped       # True only while some DHT node answered and sits in the table
    node.remote_address()   # (host, port) once reachable and port-preserving, else None
    node.local_address()    # the bound server socket address
    node.server_socket, node.client_socket          # UDXSockets of `udx`

    async def on_connection(conn: Connection) -> None:
        conn.remote_public_key, conn.handshake_hash, conn.handshake  # HandshakeResult (tx, rx, ...)
        conn.stream              # the connected relay.udx.UDXStream (socket, remote_addr, remote_id)
        conn.secret_stream       # relay.secretstream_aio.SecretStreamProtocol, already started
        conn.secret_stream.send(b"..."); await conn.secret_stream.recv()
        conn.client_address, conn.relayed, conn.remote_payload        # NoisePayload of the client

    server = HyperDHTServer(node, key_pair, on_connection,   # key_pair: relay.keys.KeyPair
                            firewall=None,        # (remote_public_key, payload, address) -> True drops
                            keep_alive=5.0)       # secret-stream keep-alive, as hyperdht
    await server.listen()        # registers the key, announces, returns after the first round
    server.refresh()             # re-announce now (e.g. after a network change)
    server.connections           # live Connection objects
    await server.close()         # unannounce, destroy pending streams and connections
    await node.close()           # also closes (unannounces) servers still listening on it

    # server side relaying (hyperdht relayThrough): every client is offered this blind relay
    HyperDHTServer(node, key_pair, on_connection, relay_through=relay_public_key, holepunch=False)

    # client side (hyperdht connect): FIND_PEER, PEER_HANDSHAKE through the announce holders,
    # then direct / hole-punched (consistent NATs) / through a blind relay; errors are DHTError
    from relay.dht import connect
    conn = await connect(node, server_public_key,
                         relay_through=relay_public_key,  # or None; the server may offer one too
                         punch=False,                     # the blocked network: the relay only
                         timeout=20.0)                    # DHTError("CONNECT_TIMEOUT") naming the stage
    conn.relayed, conn.remote_address, conn.extra["trace"].stages   # timings per step

Tests: `tests/interop/_dht_testnet.py` runs a Node hyperdht testnet on 127.0.0.1 (random
ports) with a JSON command channel (`findPeer`, `ping`, `findNode`, `connect` + echo,
`serve`); see `tests/interop/test_interop_dht.py` for the pattern.

Other node calls: `await node.ping((host, port))`, `await node.find_node(target)`,
`await node.find_peer(public_key)` (returns a finished `Query`: `.closest_replies`,
`.replies`), `await node.request(addr, command, target=..., value=..., token=...)`.

Holepunching: when the node cannot claim OPEN, each connection attempt gets its own
puncher socket (its NAT mapping sampled from DHT nodes, `relay.dht.holepunch`), the routed
reply leaves from it, and client probes are echoed / client rounds answered as hyperdht's
server does. Only consistent NATs are punched; random NATs (birthday sockets) are refused
with an abort. `HyperDHTServer(..., holepunch=False)` disables it (silence, as Node).
"""

from __future__ import annotations

from .client import connect
from .connection import Connection
from .messages import BOOTSTRAP_NODES, DEFAULT_PORT, DHTError
from .node import DHTNode
from .server import HyperDHTServer

__all__ = ["BOOTSTRAP_NODES", "DEFAULT_PORT", "Connection", "DHTError", "DHTNode", "HyperDHTServer", "connect"]
