"""Fixtures for the blocked-network tests: the topology fails loudly (never skips) when this
machine cannot build it, naming exactly what is missing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.network.topology import Topology, missing_requirements


@pytest.fixture(scope="session")
def netns_ready() -> None:
    missing = missing_requirements()
    if missing:
        pytest.fail("the blocked-network tests need: " + "; ".join(missing), pytrace=False)


def build(**kw: object) -> Iterator[Topology]:
    t = Topology(**kw)  # type: ignore[arg-type]
    try:
        t.build()
        t.start_testnet()
        yield t
    finally:
        t.close()
