"""`--scraper-*` input checks: bad values exit 2 naming the flag and the fix, before anything starts."""

from __future__ import annotations

import logging

import pytest

from relay.cli import _scraper_config, _scraper_flags, parse_args
from relay.dhtprom import MAX_ALIAS, default_alias
from relay.keys import encode_id

KEY = bytes(range(32))
SECRET = bytes(range(32, 64))


def flags(*argv: str) -> tuple[bytes, bytes, str | None] | None:
    return _scraper_flags(parse_args(list(argv)))


def test_keys_in_hex_or_z32() -> None:
    assert flags("--scraper-public-key", KEY.hex(), "--scraper-secret", encode_id(SECRET)) == (KEY, SECRET, None)
    assert flags("--scraper-public-key", encode_id(KEY), "--scraper-secret", SECRET.hex()) == (KEY, SECRET, None)


def test_default_alias_is_blind_relay_service_s() -> None:
    relay_key = encode_id(bytes(32))
    cfg = _scraper_config((KEY, SECRET, None), relay_key)
    assert cfg is not None and cfg.alias == f"blind-relay-{relay_key}" == default_alias(relay_key)
    assert len(default_alias("x" * 200)) == MAX_ALIAS
    assert SECRET.hex() not in repr(cfg) and encode_id(SECRET) not in repr(cfg)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--scraper-public-key", KEY.hex()], "--scraper-public-key needs --scraper-secret"),
        (["--scraper-public-key", "nope", "--scraper-secret", SECRET.hex()], "--scraper-public-key 'nope' is not"),
        (["--scraper-public-key", KEY.hex(), "--scraper-secret", "ab" * 31], "--scraper-secret is not 32 bytes"),
        (
            ["--scraper-public-key", KEY.hex(), "--scraper-secret", SECRET.hex(), "--scraper-alias", "a" * 100],
            "--scraper-alias: the Prometheus alias must have length less than 100",
        ),
        (
            ["--scraper-public-key", KEY.hex(), "--scraper-secret", SECRET.hex(), "--scraper-alias", "a:b"],
            "--scraper-alias: the Prometheus alias must not contain ':'",
        ),
    ],
)
def test_bad_values_exit_2_naming_the_flag(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        flags(*argv)
    assert e.value.code == 2
    assert words in capsys.readouterr().err


def test_alias_of_99_is_fine_and_secret_alone_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    got = flags("--scraper-public-key", KEY.hex(), "--scraper-secret", SECRET.hex(), "--scraper-alias", "a" * 99)
    assert got == (KEY, SECRET, "a" * 99)
    with caplog.at_level(logging.WARNING, logger="relay"):
        assert flags("--scraper-secret", SECRET.hex()) is None
    assert any("without --scraper-public-key" in r.getMessage() for r in caplog.records)


def test_systemd_unit_runs_the_relay_with_the_scraper_flags() -> None:
    from relay.cli import _unit_extra_args

    argv = ["--scraper-public-key", KEY.hex(), "--scraper-secret", encode_id(SECRET), "--scraper-alias", "gpu-1"]
    extra = _unit_extra_args(parse_args(argv))
    assert extra[-6:] == argv
    with pytest.raises(SystemExit):
        _unit_extra_args(parse_args(["--scraper-public-key", "nope", "--scraper-secret", SECRET.hex()]))
