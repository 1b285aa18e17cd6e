"""relay.dhtprom, the dht-prometheus wire and schedule, driven with bytes and `now` only.

The other end is a protomux `Mux` speaking protomux-rpc as the bridge does (the real bridge:
tests/interop/test_interop_scraper.py)."""

from __future__ import annotations

from relay.dhtprom import (
    ALIAS_PROTOCOL,
    METRICS_PROTOCOL,
    RPC_MESSAGES,
    AliasRegistrar,
    AliasRequest,
    MetricsRefused,
    MetricsResponder,
    MetricsServed,
    Registered,
    RegistrationFailed,
    RegistrationSchedule,
    RpcRequest,
    RpcResponse,
    ScraperLeft,
    StartAttempt,
    decode_metrics_reply,
    encode_alias_response,
    encode_metrics_request,
)
from relay.encoding import Reader, Writer
from relay.protomux import Channel, MessageReceived, Mux
from tests.cores import fed

REQUEST = AliasRequest(b"s" * 32, "gpu-relay-1", b"t" * 32, "host-a", "blind-relay")


def pump(a: Mux, b_receive, now: float = 0.0) -> None:  # type: ignore[no-untyped-def]
    for m in a.data_to_send():
        b_receive(m, now)


def peer(protocol: str) -> tuple[Mux, Channel]:
    mux = Mux()
    chan = mux.open_channel(protocol, b"", messages=RPC_MESSAGES)
    assert chan is not None
    return mux, chan


def test_alias_request_bytes_are_dht_prom_alias_rpc_s() -> None:
    # uint 1, uint 1, fixed32 secret, string alias, fixed32 key, string hostname, string service
    expected = b"\x01\x01" + b"s" * 32 + b"\x0bgpu-relay-1" + b"t" * 32 + b"\x06host-a" + b"\x0bblind-relay"
    assert REQUEST.encode() == expected
    assert AliasRequest.decode(expected) == REQUEST


def test_rpc_frames_round_trip_with_protomux_rpc_flags() -> None:
    w = Writer()
    RPC_MESSAGES[1].write(w, RpcResponse(7, None, "Unknown method 'x'", "UNKNOWN_METHOD"))  # type: ignore[misc]
    raw = w.getvalue()
    assert raw[0] == 0b11 and raw[1] == 7  # flags: error + code
    back = RPC_MESSAGES[1].read(Reader(raw))  # type: ignore[misc]
    assert back.error == "Unknown method 'x'" and back.code == "UNKNOWN_METHOD" and back.value is None


def registrar_and_scraper(now: float = 0.0) -> tuple[AliasRegistrar, Mux, Channel, list[RpcRequest]]:
    reg = AliasRegistrar(REQUEST, timeout=10.0, now=now)
    mux, chan = peer(ALIAS_PROTOCOL)
    got: list[RpcRequest] = []
    for m in reg.data_to_send():
        for ev in fed(mux, m):
            if isinstance(ev, MessageReceived) and ev.type == 0:
                got.append(ev.message)
    for m in mux.data_to_send():
        reg.receive(m, now)
    return reg, mux, chan, got


def test_registration_accepted_then_scraper_leaves() -> None:
    reg, mux, chan, got = registrar_and_scraper()
    assert [r.method for r in got] == ["alias"] and AliasRequest.decode(got[0].value) == REQUEST
    chan.send(1, RpcResponse(got[0].id, encode_alias_response(True, updated=True)))
    pump(mux, reg.receive)
    assert reg.next_event() == Registered(True)
    assert reg.get_timer() is None  # answered: no deadline left
    reg.connection_closed()
    assert isinstance(reg.next_event(), ScraperLeft)


def test_wrong_secret_names_the_flag() -> None:
    reg, mux, chan, got = registrar_and_scraper()
    chan.send(1, RpcResponse(got[0].id, encode_alias_response(False, error="Unauthorised")))
    pump(mux, reg.receive)
    ev = reg.next_event()
    assert isinstance(ev, RegistrationFailed) and "Unauthorised" in ev.reason and "--scraper-secret" in ev.reason
    reg.connection_closed()
    assert reg.next_event() is None  # a failed attempt's close is not a scraper restart


def test_silent_scraper_times_out_at_the_deadline() -> None:
    reg, *_ = registrar_and_scraper(now=100.0)
    assert reg.get_timer() == 110.0
    reg.handle_timer(109.9)
    assert reg.next_event() is None
    reg.handle_timer(110.0)
    ev = reg.next_event()
    assert isinstance(ev, RegistrationFailed) and "in time" in ev.reason


def ask(mux: Mux, chan: Channel, responder: MetricsResponder, rid: int, now: float, method: str = "metrics") -> None:
    chan.send(0, RpcRequest(rid, method, encode_metrics_request()))
    pump(mux, responder.receive, now)


def replies(responder: MetricsResponder, mux: Mux) -> list[RpcResponse]:
    out = []
    for m in responder.data_to_send():
        for ev in fed(mux, m):
            if isinstance(ev, MessageReceived) and ev.type == 1:
                out.append(ev.message)
    return out


def test_metrics_answered_and_budget_bounds_renders() -> None:
    renders = []

    def render() -> str:
        renders.append(1)
        return "blind_relay_sessions_accepted 3.0\n"

    responder = MetricsResponder(render, 0.0, rate=1.0, burst=2.0)
    mux, chan = peer(METRICS_PROTOCOL)
    pump(mux, responder.receive)
    for m in responder.data_to_send():
        fed(mux, m)
    for rid in (1, 2, 3):
        ask(mux, chan, responder, rid, now=0.0)
    got = replies(responder, mux)
    assert [decode_metrics_reply(r.value or b"") for r in got] == [
        (True, "blind_relay_sessions_accepted 3.0\n"),
        (True, "blind_relay_sessions_accepted 3.0\n"),
        (False, "Too many metrics requests"),
    ]
    assert len(renders) == 2  # the third cost no render
    events = [responder.next_event() for _ in range(3)]
    assert [type(e) for e in events] == [MetricsServed, MetricsServed, MetricsRefused]
    ask(mux, chan, responder, 4, now=1.0)  # a second later a token is back
    assert decode_metrics_reply(replies(responder, mux)[0].value or b"")[0] is True


def test_unknown_method_and_broken_collector_get_errors_not_crashes() -> None:
    def broken() -> str:
        raise RuntimeError("collector bug")

    responder = MetricsResponder(broken, 0.0)
    mux, chan = peer(METRICS_PROTOCOL)
    pump(mux, responder.receive)
    for m in responder.data_to_send():
        fed(mux, m)
    ask(mux, chan, responder, 1, 0.0, method="shutdown")
    ask(mux, chan, responder, 2, 0.0)
    unknown, failed = replies(responder, mux)
    assert unknown.code == "UNKNOWN_METHOD"
    assert decode_metrics_reply(failed.value or b"") == (False, "Failed to obtain metrics")


def test_schedule_backs_off_and_comes_back_fast_after_a_restart() -> None:
    s = RegistrationSchedule(0.0, backoff=(1.0, 5.0, 15.0), refresh=3600.0)
    s.handle_timer(0.0)
    assert isinstance(s.next_event(), StartAttempt) and s.get_timer() is None  # one attempt at a time
    s.handle_timer(50.0)
    assert s.next_event() is None
    assert [s.failed(t) for t in (0.0, 1.0, 6.0, 21.0)] == [1.0, 5.0, 15.0, 15.0]
    assert s.get_timer() == 36.0
    s.handle_timer(36.0)
    s.next_event()
    s.succeeded(40.0)
    assert s.get_timer() == 3640.0 and s.failures == 0
    s.scraper_left(100.0)
    assert s.get_timer() == 101.0
