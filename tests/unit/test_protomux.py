"""relay.protomux against the npm protomux vectors, its pairing/id rules, and random input."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import relay.protomux as pm
from relay.core import drain_events
from relay.protomux import (
    ChannelClosed,
    ChannelOpened,
    ChannelRequested,
    MessageReceived,
    MessageType,
    Mux,
    OpenRejected,
    ProtomuxError,
)
from tests.cores import closed, fed
from tests.vectors import load

V = load("streams")["protomux"]
STRING = MessageType(lambda r: r.string(), lambda w, v: w.string(v), "string")
UINT = MessageType(lambda r: r.uint(), lambda w, v: w.uint(v), "uint")


def h(x: str) -> bytes:
    return bytes.fromhex(x)


def pipe(src: Mux, dst: Mux) -> list[pm.Event]:
    """Deliver everything `src` wants to send into `dst`; returns dst's events."""
    events: list[pm.Event] = []
    for msg in src.data_to_send():
        events += fed(dst, msg)
    return events


def settle(a: Mux, b: Mux) -> tuple[list[pm.Event], list[pm.Event]]:
    """Exchange messages until both are quiet; returns (a's events, b's events)."""
    ea: list[pm.Event] = drain_events(a)
    eb: list[pm.Event] = drain_events(b)
    for _ in range(20):
        got_b = pipe(a, b)
        got_a = pipe(b, a)
        eb += got_b
        ea += got_a
        if not got_a and not got_b and not a._out and not b._out:
            break
    return ea, eb


# ------------------------------------------------------------------------------ vectors


def test_example_channel_vector_as_sender_and_receiver() -> None:
    wire = V["example_channel"]["wire"]
    a, b = Mux(), Mux()
    ca = a.open_channel("example", messages=[STRING, UINT])
    assert ca is not None
    assert ca.send(0, "hi") and ca.send(1, 300)
    sent_a = a.data_to_send()
    assert [m.hex() for m in sent_a] == [wire[0]["hex"], wire[2]["hex"], wire[3]["hex"]]
    cb = b.open_channel("example", messages=[STRING])  # only type 0: type 1 is dropped
    assert cb is not None
    assert [m.hex() for m in b.data_to_send()] == [wire[1]["hex"]]
    events = []
    for m in sent_a:
        events += fed(b, m)
    assert events[0] == ChannelOpened(cb, None)
    got = [e.message for e in events if isinstance(e, MessageReceived)]
    assert got == V["example_channel"]["responder_received"]
    ca.close()
    close = a.data_to_send()
    assert [m.hex() for m in close] == [wire[4]["hex"]]
    assert fed(b, close[0]) == [ChannelClosed(cb, True, False)]
    assert cb.closed and b.data_to_send() == []  # a remote close is not answered


def test_batch_vector_encode_and_decode() -> None:
    a = Mux()
    a.cork()
    ch = a.open_channel("example", h("abcd"), messages=[STRING, UINT])
    assert ch is not None
    ch.send(0, "hi")
    ch.send(1, 7)
    assert a.data_to_send() == []
    a.uncork()
    assert [m.hex() for m in a.data_to_send()] == [w["hex"] for w in V["batch"]["wire"]]

    b = Mux()
    cb = b.open_channel("example", h("abcd"), messages=[STRING, UINT])
    assert cb is not None
    b.data_to_send()
    events = fed(b, h(V["batch"]["wire"][0]["hex"]))
    assert events == [ChannelOpened(cb, None), MessageReceived(cb, 0, "hi"), MessageReceived(cb, 1, 7)]


def test_reject_vector() -> None:
    b = Mux()
    events = fed(b, h(V["reject"]["incoming_open"]))
    assert events == [OpenRejected("nobody-here", None, 1)]
    assert [m.hex() for m in b.data_to_send()] == [w["hex"] for w in V["reject"]["wire"]]
    # the rejected slot is free again: the remote may reuse id 1
    assert fed(b, h(V["reject"]["incoming_open"])) == [OpenRejected("nobody-here", None, 1)]


# ------------------------------------------------------------------------------ pairing


def test_remote_open_first_is_buffered_until_accepted() -> None:
    a, b = Mux(), Mux()
    b.pair("proto")
    ca = a.open_channel("proto", b"\x01" * 32, handshake=b"hs-a")
    assert ca is not None
    ca.send(0, b"early-1")
    ca.send(3, b"early-2")
    eb = pipe(a, b)
    assert eb == [ChannelRequested("proto", b"\x01" * 32, 1)]
    assert b.buffered == 2 * 512 + 14
    cb = b.open_channel("proto", b"\x01" * 32, handshake=b"hs-b")
    assert cb is not None
    eb = drain_events(b)
    assert eb == [
        ChannelOpened(cb, b"hs-a"),
        MessageReceived(cb, 0, b"early-1"),
        MessageReceived(cb, 3, b"early-2"),
    ]
    assert b.buffered == 0
    assert pipe(b, a) == [ChannelOpened(ca, b"hs-b")]
    assert (ca.local_id, ca.remote_id, cb.local_id, cb.remote_id) == (1, 1, 1, 1)


def test_reject_of_requested_channel_drops_buffer_and_closes_remote() -> None:
    a, b = Mux(), Mux()
    b.pair("proto", b"\x05")
    ca = a.open_channel("proto", b"\x05")
    assert ca is not None
    ca.send(0, b"x")
    pipe(a, b)
    b.reject("proto", b"\x05")
    assert b.buffered == 0
    assert pipe(b, a) == [ChannelClosed(ca, True, True)]
    # id 1 is free on both sides again
    ca2 = a.open_channel("proto", b"\x05")
    assert ca2 is not None and ca2.local_id == 1
    assert pipe(a, b) == [ChannelRequested("proto", b"\x05", 1)]


def test_unpaired_key_and_pair_for_other_id() -> None:
    a, b = Mux(), Mux()
    b.pair("proto", b"\x01")
    a.open_channel("proto", b"\x02")
    assert pipe(a, b) == [OpenRejected("proto", b"\x02", 1)]
    b.unpair("proto", b"\x01")
    b.pair("proto")  # any id
    a.open_channel("proto", b"\x03")
    assert pipe(a, b) == [ChannelRequested("proto", b"\x03", 2)]


def test_unique_channels_and_empty_id_equals_none() -> None:
    a = Mux()
    assert a.open_channel("p", b"") is not None
    assert a.open_channel("p", None) is None
    assert a.opened("p")
    assert a.open_channel("p", unique=False) is not None


def test_many_channels_interleaved_both_directions() -> None:
    a, b = Mux(), Mux()
    for i in range(5):
        b.pair(f"p{i}")
    chans_a = [a.open_channel(f"p{i}", bytes([i]) * 4) for i in range(5)]
    _, eb = settle(a, b)
    for ev in eb:
        assert isinstance(ev, ChannelRequested)
        b.open_channel(ev.protocol, ev.id)
    ea, eb = settle(a, b)
    assert sum(isinstance(e, ChannelOpened) for e in ea) == 5
    assert sum(isinstance(e, ChannelOpened) for e in eb) == 5
    chans_b = {c.protocol: c for c in b}
    for i, ca in enumerate(chans_a):
        assert ca is not None and ca.opened
        ca.send(0, f"a{i}".encode())
        chans_b[f"p{i}"].send(1, f"b{i}".encode())
    ea, eb = settle(a, b)
    assert [(e.channel.protocol, e.type, e.message) for e in eb] == [(f"p{i}", 0, f"a{i}".encode()) for i in range(5)]
    assert [(e.channel.protocol, e.type, e.message) for e in ea] == [(f"p{i}", 1, f"b{i}".encode()) for i in range(5)]


# ------------------------------------------------------------------------------ ids


def test_ids_reuse_after_paired_close_and_after_reject() -> None:
    a, b = Mux(), Mux()
    b.pair("p")
    c1 = a.open_channel("p", b"\x01")
    c2 = a.open_channel("p", b"\x02")
    assert c1 is not None and c2 is not None and (c1.local_id, c2.local_id) == (1, 2)
    for ev in pipe(a, b):
        assert isinstance(ev, ChannelRequested)
        b.open_channel("p", ev.id)
    pipe(b, a)
    drain_events(b)
    c1.close()
    assert [e.is_remote for e in pipe(a, b)] == [True]  # type: ignore[attr-defined]
    c3 = a.open_channel("p", b"\x03")
    assert c3 is not None and c3.local_id == 1  # freed at once: the remote had acked
    # closing before the remote answered does not free the id ...
    b2 = Mux()
    x = b2.open_channel("q")
    assert x is not None
    x.close()
    y = b2.open_channel("q")
    assert y is not None and y.local_id == 2
    # ... until the remote's reject for it arrives
    b2.data_to_send()
    fed(b2, b"\x00\x02\x01")
    z = b2.open_channel("r")
    assert z is not None and z.local_id == 1


def test_open_crossing_our_close_frees_the_id_on_both_sides() -> None:
    a, b = Mux(), Mux()
    ca = a.open_channel("p")
    cb = b.open_channel("p")
    assert ca is not None and cb is not None
    from_a = a.data_to_send()
    ca.close()
    from_a += a.data_to_send()
    drain_events(a)
    # b's open reaches a after a closed: protomux frees the id; we also repeat our close
    assert pipe(b, a) == []
    again = a.data_to_send()
    assert again == [h("000301")]
    events = []
    for msg in from_a + again:
        events += fed(b, msg)
    assert events == [ChannelOpened(cb, None), ChannelClosed(cb, True)]
    reopened = a.open_channel("p")
    assert reopened is not None and reopened.local_id == 1
    assert pipe(a, b) == [OpenRejected("p", None, 1)]  # slot 1 is free at b: no error


def test_close_before_accept_withdraws_the_open() -> None:
    a, b = Mux(), Mux()
    b.pair("p")
    ca = a.open_channel("p")
    assert ca is not None
    ca.send(0, b"lost")
    ca.close()
    assert pipe(a, b) == [ChannelRequested("p", None, 1)]
    assert b.data_to_send() == [h("000201")] and b.buffered == 0
    fed(a, h("000201"))
    assert a.open_channel("p") is not None  # id 1 again, and b's slot 1 is free
    assert pipe(a, b) == [ChannelRequested("p", None, 1)]


@pytest.mark.parametrize(
    ("msg", "why"),
    [
        ("000102017000", "skips ahead"),  # first open uses id 2
        ("000100017000", "id 0"),
        ("000201", "reject"),  # reject for an id we never opened
        ("0001", "out of bounds"),
        ("00010101", "out of bounds"),
        ("00", "out of bounds"),
        ("0000", "out of bounds"),
        ("00000005", "out of bounds"),  # item claims 5 bytes, has none: clamped, then type is missing
    ],
)
def test_bad_control_messages_raise(msg: str, why: str) -> None:
    m = Mux()
    with pytest.raises(ProtomuxError, match=why):
        fed(m, h(msg))
    assert m.destroyed
    with pytest.raises(ProtomuxError, match="destroyed"):
        fed(m, b"\x00\x03\x01")


def test_open_of_occupied_slot_raises() -> None:
    m = Mux()
    m.pair("p")
    fed(m, h("000101017000"))
    with pytest.raises(ProtomuxError, match="still in use"):
        fed(m, h("000101017000"))


def test_ignored_inputs() -> None:
    m = Mux()
    assert fed(m, b"") == []
    assert fed(m, h("0009ff")) == []  # unknown control type
    assert fed(m, h("000300")) == []  # close for id 0
    assert fed(m, h("000307")) == []  # close for an unknown id
    assert fed(m, h("05006869")) == []  # message for an unknown channel
    assert fed(m, h("000000")) == []  # an empty batch
    assert fed(m, h("00000000050000")) == []  # a batch that only switches channels
    assert not m.destroyed and m.data_to_send() == []


def test_bad_message_payload_raises_protomux_error() -> None:
    a, b = Mux(), Mux()
    ca = a.open_channel("p", messages=[None])
    cb = b.open_channel("p", messages=[UINT])
    assert ca is not None and cb is not None
    settle(a, b)
    ca.send(0, b"\xfd\x01")  # truncated uint16
    with pytest.raises(ProtomuxError, match="bad message type 0"):
        pipe(a, b)


def test_send_validates_type_and_closed_channels() -> None:
    m = Mux()
    c = m.open_channel("p", messages=[None])
    assert c is not None
    with pytest.raises(ValueError):
        c.send(1, b"")
    c.close()
    assert c.send(0, b"x") is False


def test_stream_closed_closes_everything_and_sends_nothing() -> None:
    a, b = Mux(), Mux()
    c1 = a.open_channel("one")
    c2 = a.open_channel("two")
    a.data_to_send()
    events = closed(a)
    assert events == [ChannelClosed(c1, True), ChannelClosed(c2, True)]  # type: ignore[arg-type]
    assert a.data_to_send() == [] and a.open_channel("three") is None
    assert closed(b) == []


# ------------------------------------------------------------------------------ batches


def test_received_batch_is_answered_with_a_batch() -> None:
    b = Mux()
    # two opens nobody waits for, in one batch: both rejects leave as one batch (as protomux corks)
    batch = _batch(0, [h("0101017000"), h("0102017100")])
    events = fed(b, batch)
    assert events == [OpenRejected("p", None, 1), OpenRejected("q", None, 2)]
    assert b.data_to_send() == [_batch(0, [h("0201"), h("0202")])]
    # a batch of one item is not corked
    assert fed(b, _batch(0, [h("0101017000")])) == [OpenRejected("p", None, 1)]
    assert b.data_to_send() == [h("000201")]


def _batch(channel: int, items: list[bytes]) -> bytes:
    return bytes([0, 0, channel]) + b"".join(bytes([len(i)]) + i for i in items)


def test_batch_switches_channels_and_splits_when_large(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = Mux(), Mux()
    x = a.open_channel("x")
    y = a.open_channel("y")
    bx = b.open_channel("x")
    by = b.open_channel("y")
    assert x and y and bx and by
    settle(a, b)
    a.cork()
    x.send(0, b"1")
    y.send(0, b"2")
    x.send(1, b"3")
    a.cork()  # nested cork: still one batch
    y.send(0, b"4")
    a.uncork()
    assert a.data_to_send() == []
    a.uncork()
    out = a.data_to_send()
    assert out == [bytes([0, 0, 1, 2, 0, ord("1"), 0, 2, 2, 0, ord("2"), 0, 1, 2, 1, ord("3"), 0, 2, 2, 0, ord("4")])]
    events = fed(b, out[0])
    assert [(e.channel, e.message) for e in events] == [(bx, b"1"), (by, b"2"), (bx, b"3"), (by, b"4")]

    monkeypatch.setattr(pm, "MAX_BATCH", 10)
    a.cork()
    for i in range(6):
        x.send(0, bytes([i]) * 4)
    a.uncork()
    out = a.data_to_send()
    assert len(out) > 1
    got = []
    for msg in out:
        got += [e.message for e in fed(b, msg)]
    assert got == [bytes([i]) * 4 for i in range(6)]


def test_nested_batches_are_limited() -> None:
    inner = h("0100") + b"z"  # message on unknown channel 1
    msg = inner
    for _ in range(pm.MAX_BATCH_DEPTH):
        msg = h("0000") + h("00") + bytes([len(msg) - 1]) + msg[1:]
    m = Mux()
    with pytest.raises(ProtomuxError, match="nested"):
        fed(m, msg)


def test_buffer_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pm, "MAX_BUFFERED", 2000)
    m = Mux()
    m.pair("p")
    fed(m, h("000101017000"))
    fed(m, h("0100") + b"x" * 100)
    with pytest.raises(ProtomuxError, match="buffered"):
        fed(m, h("0100") + b"x" * 1000)


# ------------------------------------------------------------------------------ property tests


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_only_raise_protomux_error(data: bytes) -> None:
    m = Mux()
    m.pair("p")
    c = m.open_channel("q", messages=[UINT, STRING])
    assert c is not None
    try:
        fed(m, data)
    except ProtomuxError:
        assert m.destroyed


@functools.cache
def _valid_messages() -> list[bytes]:
    a = Mux()
    a.cork()
    ch = a.open_channel("example", h("abcd"), messages=[STRING, UINT], handshake=b"hs")
    assert ch is not None
    ch.send(0, "hi")
    ch.send(1, 70000)
    a.uncork()
    return [
        *a.data_to_send(),
        *(h(w["hex"]) for w in V["example_channel"]["wire"]),
        h(V["reject"]["incoming_open"]),
    ]


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2), st.data())
def test_truncated_and_mutated_messages_only_raise_protomux_error(which: int, data: st.DataObject) -> None:
    msg = _valid_messages()[which]
    cut = data.draw(st.integers(0, len(msg)))
    flip = data.draw(st.lists(st.tuples(st.integers(0, max(0, cut - 1)), st.integers(0, 255)), max_size=3))
    buf = bytearray(msg[:cut])
    for pos, val in flip:
        if pos < len(buf):
            buf[pos] = val
    m = Mux()
    m.pair("example")
    c = m.open_channel("example", h("abcd"), messages=[STRING, UINT], handshake=b"x")
    assert c is not None
    try:
        for e in fed(m, bytes(buf)):
            assert isinstance(e, pm.Event)
    except ProtomuxError:
        pass


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["open", "send", "close", "cork", "uncork"]), st.integers(0, 3)), max_size=30)
)
def test_two_muxes_stay_consistent(ops: list[tuple[str, int]]) -> None:
    """Whatever one side does, the other never errors and gets every message sent, in order per channel."""
    a, b = Mux(), Mux()
    b.pair("p")
    sent: list[bytes] = []
    got: list[bytes] = []

    def step() -> None:
        for _ in range(3):
            _, eb = settle(a, b)
            for e in eb:
                if isinstance(e, ChannelRequested):
                    b.open_channel(e.protocol, e.id, unique=False)
                elif isinstance(e, MessageReceived):
                    got.append(e.message)
            got.extend(e.message for e in drain_events(b) if isinstance(e, MessageReceived))

    opened = 0
    closed_early: set[int] = set()
    for op, k in ops:
        chans = [c for c in a if not c.closed]
        if op == "open":
            opened += 1
            a.open_channel("p", bytes([k]), unique=False, user_data=opened)
        elif op == "send" and chans:
            chan = chans[k % len(chans)]
            payload = bytes([chan.user_data, len(sent)])
            chan.send(0, payload)
            sent.append(payload)
        elif op == "close" and chans:
            chan = chans[k % len(chans)]
            if chan.remote_id == 0:
                closed_early.add(chan.user_data)
            chan.close()
        elif op == "cork":
            a.cork()
        elif op == "uncork":
            a.uncork()
        step()
    while a._corked:
        a.uncork()
    step()
    for n in range(1, opened + 1):
        g, s = [m for m in got if m[0] == n], [m for m in sent if m[0] == n]
        # a channel closed before the peer accepted it loses what it sent; any other gets all, in order
        assert g == s or (g == [] and n in closed_early)
    assert not b.destroyed and not a.destroyed
