"""`--scraper-*`: register with a dht-prometheus scraper over the DHT and answer its metrics requests.

The asyncio glue around `relay.dhtprom` (the wire and the schedule, sans-IO), on the relay's own
`DHTNode` and UDP socket, as blind-relay-service does through hyper-instrument 3.2.1 and
dht-prom-client 2.1.0:

* a second `HyperDHTServer` on a fresh key pair (the *target key* the alias points at) whose
  firewall admits the scraper's key only; each connection gets a `MetricsResponder` serving
  the same text as `GET /metrics`;
* one registration at a time: connect to the scraper's key, send the alias with the shared
  secret, keep the connection; when it closes (the scraper restarted) register again within
  a second or so, and every hour anyway. Failures back off to 5 minutes.

Nothing here may slow the relay: connects and requests have timeouts, at most one attempt
runs, at most `MAX_SCRAPER_CONNECTIONS` scraper connections are kept, requests past the budget
get a short refusal, and a failure is logged once (then at debug level) until it succeeds.
Every outcome is counted in `stats` (`/stats` `scraper`, `/metrics` `blind_relay_scraper_*`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

from relay.core import Driver
from relay.dht import Connection, DHTError, DHTNode, HyperDHTServer
from relay.dht.client import connect
from relay.dht.messages import NoisePayload
from relay.dhtprom import (
    AliasRegistrar,
    AliasRequest,
    MetricsRefused,
    MetricsResponder,
    MetricsServed,
    Registered,
    RegistrationFailed,
    RegistrationSchedule,
    ScraperConfig,
    ScraperLeft,
    ScraperProtocolError,
    StartAttempt,
)
from relay.keys import KeyPair, encode_id, key_pair
from relay.secretstream import Closed, Ended, Message, SecretStreamError

log = logging.getLogger("relay.scraper")

CONNECT_TIMEOUT = 20.0
REQUEST_TIMEOUT = 10.0  # protomux-rpc-client's default request timeout
LISTEN_TIMEOUT = 30.0
MAX_SCRAPER_CONNECTIONS = 4
MAX_FRAME = 64 * 1024  # requests and alias answers are tens of bytes


class ScraperLink:
    """Keeps the relay registered with one scraper and serves it metrics; `stats` for /stats."""

    def __init__(
        self,
        node: DHTNode,
        config: ScraperConfig,
        render: Callable[[], str],
        *,
        target: KeyPair | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self.node = node
        self.config = config
        self.render = render
        self.target = target or key_pair()
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._loop = asyncio.get_running_loop()
        self.schedule = RegistrationSchedule(self._loop.time())
        #: runs the schedule: its StartAttempt events and its one timer (relay.core)
        self.driver: Driver[StartAttempt] = Driver(self.schedule, self._loop, on_event=self._on_schedule_event)
        self.server: HyperDHTServer | None = None
        self._attempt: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._registrar_conn: Connection | None = None
        self._scrapes: list[Connection] = []
        self._closed = False
        self._failing_logged = False
        self.stats: dict[str, Any] = {
            "registered": False,
            "registrations": 0,
            "registration_failures": 0,
            "metrics_served": 0,
            "metrics_refused": 0,
            "connections_refused": 0,
            "last_error": None,
        }

    @property
    def target_key(self) -> str:
        return encode_id(self.target.public_key)

    def snapshot(self) -> dict[str, Any]:
        return {
            **self.stats,
            "scraper": encode_id(self.config.public_key),
            "alias": self.config.alias,
            "target": self.target_key,
        }

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Listen on the target key and start registering, in the background (never blocks startup)."""
        self._spawn(self._run())

    async def _run(self) -> None:
        self.server = HyperDHTServer(
            self.node, self.target, self._on_scrape, firewall=self._firewall, keep_alive=5.0, holepunch=True
        )
        try:
            await asyncio.wait_for(self.server.listen(), LISTEN_TIMEOUT)
        except (TimeoutError, DHTError) as e:
            # the node keeps announcing in the background; registration can go ahead meanwhile
            log.warning("announcing the metrics key for the scraper is slow: %s", e or "timed out")
        log.info(
            "registering with the dht-prometheus scraper",
            extra={"scraper": encode_id(self.config.public_key), "alias": self.config.alias, "target": self.target_key},
        )
        self.driver.pump()

    async def close(self) -> None:
        self._closed = True
        self.driver.close()
        for t in list(self._tasks):
            t.cancel()
        for c in [*self._scrapes, *([self._registrar_conn] if self._registrar_conn else [])]:
            with contextlib.suppress(Exception):
                c.destroy()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.close(), 5)

    # -- schedule ----------------------------------------------------------------------------

    def _on_schedule_event(self, ev: StartAttempt) -> None:
        self._attempt = self._spawn(self._register())

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # -- registering -------------------------------------------------------------------------

    async def _register(self) -> None:
        """One attempt: connect, send the alias, wait for the answer; all of it bounded."""
        cfg = self.config
        host = cfg.hostname or socket.gethostname()
        request = AliasRequest(cfg.secret, cfg.alias, self.target.public_key, host, cfg.service)
        conn: Connection | None = None
        try:
            conn = await connect(self.node, cfg.public_key, timeout=self.connect_timeout)
        except DHTError as e:
            self._failed(f"cannot reach the scraper: {e}")
            return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug must not leave the schedule stuck in "attempting"
            self._failed(f"cannot reach the scraper: {e!r}")
            return
        conn.secret_stream.stream.max_frame = MAX_FRAME
        reg = AliasRegistrar(request, timeout=self.request_timeout, now=self._loop.time())
        driver: Driver[Any] = Driver(
            reg,
            self._loop,
            on_event=lambda ev: self._on_registrar_event(ev, conn),
            transmit=lambda now: send(conn, reg),
        )
        driver.pump()
        # read with recv(), not on_event: the scraper opens its channel at once, and a message
        # that arrived before a callback was set would only be in recv()'s queue
        try:
            async for message in conn.secret_stream:
                driver.feed(reg.receive, message)
        except ScraperProtocolError:
            conn.destroy()
        except SecretStreamError:
            pass
        finally:
            driver.close()
            reg.connection_closed()
            driver.pump()
            if not conn.secret_stream.stream.closed:
                conn.destroy()

    def _on_registrar_event(self, ev: Any, conn: Connection) -> None:
        if isinstance(ev, Registered):
            old, self._registrar_conn = self._registrar_conn, conn
            if old is not None and old is not conn:
                old.destroy()  # a refresh replaced it; its close is not a scraper restart
            self.driver.feed(self.schedule.succeeded)
            self.stats["registered"] = True
            self.stats["registrations"] += 1
            self.stats["last_error"] = None
            level = logging.INFO if (self._failing_logged or self.stats["registrations"] == 1) else logging.DEBUG
            self._failing_logged = False
            log.log(
                level,
                "registered with the scraper",
                extra={"alias": self.config.alias, "updated": ev.updated, "target": self.target_key},
            )
        elif isinstance(ev, RegistrationFailed):
            conn.destroy()
            self._failed(ev.reason)
            return
        elif isinstance(ev, ScraperLeft):
            if self._registrar_conn is not conn:
                return
            self._registrar_conn = None
            self.stats["registered"] = False
            self.driver.feed(self.schedule.scraper_left)
            log.debug("the scraper's connection closed; registering again")

    def _failed(self, reason: str) -> None:
        wait = self.driver.feed(self.schedule.failed)
        self.stats["registered"] = False
        self.stats["registration_failures"] += 1
        self.stats["last_error"] = reason
        if not self._failing_logged:
            self._failing_logged = True
            log.warning(
                "%s; retrying in the background (said once until it works; /stats scraper.last_error has the latest)",
                reason,
            )
        else:
            log.debug("scraper registration failed again: %s (next in %gs)", reason, wait)

    # -- serving the scraper -----------------------------------------------------------------

    def _firewall(self, remote_public_key: bytes, payload: NoisePayload, address: tuple[str, int]) -> bool:
        """True refuses: only the scraper may connect to the target key (as dht-prom-client)."""
        if remote_public_key == self.config.public_key:
            return False
        self.stats["connections_refused"] += 1
        log.debug("refused a metrics connection from a key that is not the scraper's", extra={"address": address})
        return True

    def _on_scrape(self, conn: Connection) -> None:
        while len(self._scrapes) >= MAX_SCRAPER_CONNECTIONS:
            self.stats["connections_refused"] += 1
            self._scrapes.pop(0).destroy()  # the oldest: a restarted scraper's new one wins
        self._scrapes.append(conn)
        conn.secret_stream.stream.max_frame = MAX_FRAME
        responder = MetricsResponder(self.render, self._loop.time())

        def on_responder_event(ev: Any) -> None:
            if isinstance(ev, MetricsServed):
                self.stats["metrics_served"] += 1
            elif isinstance(ev, MetricsRefused):
                self.stats["metrics_refused"] += 1
                log.debug("metrics request refused: %s", ev.reason)

        driver: Driver[Any] = Driver(
            responder, self._loop, on_event=on_responder_event, transmit=lambda now: send(conn, responder)
        )

        def on_event(ev: Any) -> None:
            if isinstance(ev, Message):
                try:
                    driver.feed(responder.receive, ev.data)
                except ScraperProtocolError as e:
                    log.debug("the scraper broke protomux: %s", e)
                    conn.destroy()
            elif isinstance(ev, Ended):
                with contextlib.suppress(Exception):
                    conn.close()
            elif isinstance(ev, Closed):
                driver.close()
                responder.connection_closed()
                with contextlib.suppress(ValueError):
                    self._scrapes.remove(conn)
            driver.pump()

        conn.secret_stream.on_event = on_event
        driver.pump()


def send(conn: Connection, core: Any) -> None:
    """A core's protomux frames to the connection's secret stream (nothing if it closed)."""
    try:
        for m in core.data_to_send():
            conn.secret_stream.send(m)
    except SecretStreamError:
        pass
