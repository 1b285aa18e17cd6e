"""SocketStats: the fast paths count a forwarded datagram once (`forwarded_*`); every reader of
the received/relayed/sent counters and `reads` sees it, however long it has held the object."""

from __future__ import annotations

from relay.udx import SocketStats


def test_forwarded_counts_show_in_every_counter_they_stand_for() -> None:
    st = SocketStats()
    held = st  # a metrics reader that keeps the object
    st.received_packets += 2  # a slow-path datagram pair, counted the long way
    st.received_bytes += 100
    st.reads += 1
    st.forwarded_packets += 3
    st.forwarded_bytes += 768
    st.forwarded_reads += 2
    assert (held.received_packets, held.relayed_packets, held.sent_packets) == (5, 3, 3)
    assert (held.received_bytes, held.relayed_bytes, held.sent_bytes) == (868, 768, 768)
    assert held.reads == 3
    st.sent_packets += 1  # += on a counter that includes forwarded ones adds exactly one
    st.sent_packets = st.sent_packets  # and assigning what it reads changes nothing
    assert st.sent_packets == 4 and st.relayed_packets == 3
    d = st.as_dict()
    assert d["received_packets"] == 5 and d["sent_packets"] == 4 and d["reads"] == 3
    assert "forwarded_packets" not in d and d["dropped_by_cause"] == {}
    st.drop("garbage")
    assert st.as_dict()["dropped_by_cause"] == {"garbage": 1} and st.dropped_packets == 1
    assert "received_packets=5" in repr(st)
