"""OwnAddress: our public address moves only on replies from enough hosts, verified by witnesses."""

from __future__ import annotations

from relay.dht.address import MIN_HOSTS, OwnAddress

ME = ("198.51.100.4", 49737)
FAKE = ("203.0.113.66", 4444)


def hosts(n: int, first: int = 1) -> list[tuple[str, int]]:
    return [(f"10.0.{i}.1", 49737) for i in range(first, first + n)]


def test_first_address_needs_a_majority_of_distinct_hosts() -> None:
    own = OwnAddress()
    a, b, c, d = hosts(4)
    own.add(a, ME)
    assert own.address is None  # one host, during our first walk: not enough
    own.settle()
    assert own.address == ME  # the walk ended and it was the only host (a loopback testnet)
    own = OwnAddress()
    for r, claim in ((a, FAKE), (b, ME), (c, ME), (d, ME)):
        own.add(r, claim)
    assert own.address == ME and MIN_HOSTS == 3  # 3 of 4 agree, whoever answered first


def test_the_first_host_to_answer_no_longer_decides_alone() -> None:
    """The first reply used to set the address: a hostile node answering first (one our
    bootstrap node named) made every later, honest majority a 'move' that had to be confirmed by
    that same node. Now its vote is one of many."""
    own = OwnAddress()
    hostile, *honest = hosts(4)
    own.add(hostile, FAKE)
    own.add(honest[0], ME)
    assert own.address is None  # 1 to 1: no majority of 3 yet
    own.add(honest[1], ME)
    assert own.address is None  # 2 of 3 agree, but fewer than MIN_HOSTS: wait
    own.add(honest[2], ME)
    assert own.address == ME and own.candidate is None and own.take_rechecks() == []
    # a walk that ends with no majority adopts nothing
    split = OwnAddress()
    split.add(hosts(1, first=10)[0], FAKE)
    split.add(hosts(1, first=11)[0], ME)
    split.settle()
    assert split.address is None


def test_one_host_from_many_ports_is_one_vote() -> None:
    own = OwnAddress.adopted(ME, {h: (h, 1) for h, _ in hosts(3)})
    for port in range(1000, 1080):  # 80 replies from one host, each from another port
        own.add(("10.9.9.9", port), FAKE)
    assert own.address == ME and own.candidate is None and own.take_rechecks() == []


def test_a_hostile_majority_is_refused_when_the_witnesses_still_see_us() -> None:
    witnesses = hosts(3)
    own = OwnAddress.adopted(ME, {r[0]: r for r in witnesses})
    for r in hosts(5, first=100):  # five hostile hosts answer our requests claiming FAKE
        own.add(r, FAKE)
    assert own.address == ME and own.candidate == FAKE
    asked = own.take_rechecks()
    assert sorted(asked) == sorted(witnesses)
    for r in asked:  # the driver PINGs them; they still see ME
        own.add(r, ME)
    assert own.address == ME and own.candidate is None and own.refused == 1
    own.add(hosts(1, first=200)[0], FAKE)  # more of the same: no new round of rechecks
    assert own.take_rechecks() == [] and own.address == ME


def test_a_real_move_is_confirmed_by_the_witnesses() -> None:
    witnesses = hosts(3)
    own = OwnAddress.adopted(ME, {r[0]: r for r in witnesses})
    new = ("198.51.100.9", 49737)  # DHCP gave us another address
    for r in hosts(4, first=50):
        own.add(r, new)
    asked = own.take_rechecks()
    assert asked and own.address == ME
    own.add(asked[0], new)
    own.add(asked[1], new)
    own.recheck_failed(asked[2])
    assert own.address == new and own.moves == 1


def test_no_witness_answering_lets_the_vote_move_it() -> None:
    own = OwnAddress.adopted(ME, {r[0]: r for r in hosts(2)})
    new = ("198.51.100.9", 1)
    for r in hosts(3, first=50):
        own.add(r, new)
    for r in own.take_rechecks():
        own.recheck_failed(r)
    assert own.address == new
