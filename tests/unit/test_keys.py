"""relay.keys against the vectors made by hypercore-crypto, z32, id-encoding and corestore."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relay.encoding import DecodeError
from relay.keys import (
    DEFAULT_NAMESPACE,
    NS_CORESTORE,
    KeyEncodingError,
    corestore_key_pair,
    corestore_seed,
    decode_id,
    discovery_key,
    encode_id,
    is_valid_id,
    key_pair,
    namespace,
    normalize_id,
    z32_decode,
    z32_encode,
)
from tests.vectors import load

V = load("streams")


@pytest.mark.parametrize("case", V["keys"]["keyPair"], ids=lambda c: c["seed"][:8])
def test_key_pair_matches_hypercore_crypto(case: dict) -> None:
    kp = key_pair(bytes.fromhex(case["seed"]))
    assert kp.public_key.hex() == case["publicKey"]
    assert kp.secret_key.hex() == case["secretKey"]
    assert kp.seed.hex() == case["seed"]


def test_random_key_pair_is_fresh_and_consistent() -> None:
    a, b = key_pair(), key_pair()
    assert a.public_key != b.public_key
    assert key_pair(a.seed) == a
    assert a.public_key.hex() in repr(a) and a.seed.hex() not in repr(a)


def test_key_pair_rejects_short_seed() -> None:
    with pytest.raises(ValueError):
        key_pair(b"\x01" * 31)


@pytest.mark.parametrize("case", V["keys"]["namespace"], ids=lambda c: c["name"])
def test_namespace_matches_hypercore_crypto(case: dict) -> None:
    arg = case["count"] if "count" in case else case["ids"]
    assert [x.hex() for x in namespace(case["name"], arg)] == case["out"]


def test_namespace_rejects_id_above_one_byte() -> None:
    with pytest.raises(ValueError):
        namespace("x", [256])


def test_discovery_key() -> None:
    d = V["keys"]["discoveryKey"]
    assert discovery_key(bytes.fromhex(d["key"])).hex() == d["discoveryKey"]


@pytest.mark.parametrize("case", V["z32"]["samples"], ids=lambda c: c["z32"][:10] or "empty")
def test_z32_samples(case: dict) -> None:
    raw = bytes.fromhex(case["bytes"])
    assert z32_encode(raw) == case["z32"]
    assert z32_decode(case["z32"]) == raw


def test_id_encoding_behaviours() -> None:
    e = V["z32"]["id_encoding"]
    key = bytes.fromhex(e["key"])
    assert encode_id(key) == e["encode"]
    assert decode_id(e["encode"]) == key
    assert decode_id(key.hex()).hex() == e["decode_from_hex_ok"]
    assert decode_id(key.hex().upper()).hex() == e["decode_from_upper_hex_ok"]
    assert decode_id(f"pear://{e['encode']}/some/path").hex() == e["decode_from_pear_url_ok"]
    assert normalize_id(key.hex()) == e["normalize_from_hex"]
    assert is_valid_id(e["encode"].upper()) is e["isValid_upper_z32"]
    assert is_valid_id(e["encode"][:51]) is e["isValid_51_chars"]
    assert is_valid_id(key) and not is_valid_id(key[:31]) and not is_valid_id(None)


def test_decode_id_errors_are_decode_errors() -> None:
    for bad in ("", "zz", "g" * 64, "0" * 63, "!" * 52, b"\x00" * 33, "00" * 31 + "  ", 42):
        with pytest.raises(KeyEncodingError):
            decode_id(bad)
    with pytest.raises(KeyEncodingError):
        encode_id(b"\x00" * 31)
    assert issubclass(KeyEncodingError, DecodeError)


@settings(deadline=None)
@given(st.binary(max_size=80))
def test_z32_round_trip(data: bytes) -> None:
    assert z32_decode(z32_encode(data)) == data


@settings(deadline=None)
@given(st.text(max_size=70))
def test_z32_decode_random_text_raises_only_decode_error(text: str) -> None:
    try:
        out = z32_decode(text)
    except DecodeError:
        return
    q, r = divmod(len(text), 8)
    assert len(out) == q * 5 + (0, 1, 1, 2, 2, 3, 4, 4)[r]


@settings(deadline=None)
@given(st.one_of(st.text(max_size=80), st.binary(max_size=40), st.just("00" * 31 + "  ")))
def test_decode_id_random_input_raises_only_decode_error(value: str | bytes) -> None:
    try:
        out = decode_id(value)
    except DecodeError:
        return
    assert len(out) == 32


def test_corestore_derivation_constants() -> None:
    d = V["corestore"]["derivation"]
    assert NS_CORESTORE.hex() == d["NS_CORESTORE"]
    assert DEFAULT_NAMESPACE.hex() == d["DEFAULT_NAMESPACE"]


def test_corestore_key_pair_fixed_store() -> None:
    s = V["corestore"]["fixed_primary_key_store"]
    pk = bytes.fromhex(s["primaryKey"])
    assert corestore_seed(pk, s["name"]).hex() == s["derived_seed"]
    kp = corestore_key_pair(pk, s["name"])
    assert kp.public_key.hex() == s["publicKey"]
    assert kp.secret_key.hex() == s["secretKey"]
    assert encode_id(kp.public_key) == s["publicKey_z32"]
    other = corestore_key_pair(pk, s["name"], b"\x01" * 32)
    assert other.public_key.hex() == s["other_namespace_01x32_publicKey"]


def test_corestore_key_pair_random_and_wal_stores() -> None:
    r = V["corestore"]["random_primary_key_store"]
    kp = corestore_key_pair(bytes.fromhex(r["primaryKey"]), "blind-relay")
    assert kp.public_key.hex() == r["publicKey"]
    assert encode_id(kp.public_key) == r["publicKey_z32"]
    w = V["corestore"]["rocksdict_read_check"]["wal_only_store"]
    kp = corestore_key_pair(bytes.fromhex(w["node_primaryKey"]), "blind-relay")
    assert kp.public_key.hex() == w["node_blind_relay_publicKey"]
