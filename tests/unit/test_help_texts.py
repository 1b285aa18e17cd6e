"""What `blind-relay --help` says about kernel forwarding matches what the kernel path does: it
forwards both IP families (relay/udx/kernel.py has a rule set per family), so the help must not
send an IPv6 operator away."""

from __future__ import annotations

import re

from relay.cli import build_parser
from relay.udx import kernel


def _kernel_help() -> str:
    text = " ".join(build_parser().format_help().split())
    found = re.search(r"--kernel-forwarding (.*?) --allow", text)
    assert found is not None, text
    return found.group(1)


def test_kernel_forwarding_help_names_every_family_the_kernel_path_forwards() -> None:
    said = _kernel_help()
    for family in (kernel.IPV4, kernel.IPV6):
        assert family.name.replace("ipv", "IPv") in said, (family.name, said)
    assert "root or CAP_NET_ADMIN" in said, said
