"""Where root or a tool is missing, the blocked-network tests say exactly what (never pass)."""

from __future__ import annotations

import pytest

from tests.network import topology


def test_missing_root_and_tools_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topology.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(topology.shutil, "which", lambda exe: None)
    missing = topology.missing_requirements()
    assert any(m.startswith("root") and "uid 1000" in m for m in missing), missing
    assert any("`ip`" in m and "iproute2" in m for m in missing), missing
    assert any("`nft`" in m and "nftables" in m for m in missing), missing
    assert any("`node`" in m for m in missing), missing


def test_topology_refuses_to_build_without_requirements(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topology, "missing_requirements", lambda: ["root (test)"])
    with pytest.raises(topology.NetworkUnavailable, match=r"needs: root \(test\)"), topology.topology():
        pass
