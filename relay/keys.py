"""Keys as Holepunch's Node stack makes them: Ed25519 pairs, BLAKE2b namespaces, z32 ids.

A Python relay must present the *same* public key a Node relay would for the same storage,
and print it in the same z-base-32 spelling, so every function here mirrors one npm
function byte for byte (hypercore-crypto 3.7, z32 1.1, hypercore-id-encoding 1.3,
corestore 7.12 `createKeyPair`). Proven against `vectors/streams.json` (`keys`, `z32`,
`corestore`).

Public API (stable):

- `KeyPair(public_key, secret_key)`: 32-byte Ed25519 public key, 64-byte libsodium secret
  key (`seed ‖ public_key`). `KeyPair.seed` gives the 32-byte seed.
- `key_pair(seed=None) -> KeyPair`: hypercore-crypto `keyPair(seed)`.
- `namespace(name, count_or_ids) -> list[bytes]`: hypercore-crypto `namespace`.
- `discovery_key(key) -> bytes`: hypercore-crypto `discoveryKey`.
- `blake2b(data, size=32, key=None) -> bytes`: libsodium `crypto_generichash`.
- `z32_encode(b) -> str`, `z32_decode(s) -> bytes`: the z32 package.
- `encode_id(key) -> str`, `decode_id(s) -> bytes`, `normalize_id(x) -> str`,
  `is_valid_id(x) -> bool`: hypercore-id-encoding (z32 or hex, `pear://` links).
- `corestore_key_pair(primary_key, name, ns=DEFAULT_NAMESPACE) -> KeyPair`: corestore's
  `createKeyPair(name)`; `corestore_seed(...)` gives the derived seed alone.
- `NS_CORESTORE`, `DEFAULT_NAMESPACE`.
- `KeyEncodingError` (a `DecodeError`): every malformed id or key ends up here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from nacl.bindings import (
    crypto_generichash_blake2b_salt_personal as _generichash,
)
from nacl.bindings import (
    crypto_sign_keypair,
    crypto_sign_seed_keypair,
)

from relay.encoding import DecodeError

__all__ = [
    "DEFAULT_NAMESPACE",
    "NS_CORESTORE",
    "KeyEncodingError",
    "KeyPair",
    "blake2b",
    "corestore_key_pair",
    "corestore_seed",
    "decode_id",
    "discovery_key",
    "encode_id",
    "is_valid_id",
    "key_pair",
    "namespace",
    "normalize_id",
    "z32_decode",
    "z32_encode",
]


class KeyEncodingError(DecodeError):
    """A key or id string that hypercore-id-encoding / z32 would refuse."""


class KeyPair(NamedTuple):
    """An Ed25519 signing pair in libsodium layout; also the Noise static/ephemeral key."""

    public_key: bytes
    secret_key: bytes

    @property
    def seed(self) -> bytes:
        return self.secret_key[:32]

    def __repr__(self) -> str:  # never print secrets into logs
        return f"KeyPair(public_key={self.public_key.hex()})"


def blake2b(data: bytes, size: int = 32, key: bytes | None = None) -> bytes:
    """libsodium `crypto_generichash` (BLAKE2b, optional key up to 64 bytes)."""
    return _generichash(data, digest_size=size, key=key or b"")


def key_pair(seed: bytes | None = None) -> KeyPair:
    """hypercore-crypto `keyPair(seed)`: deterministic from a 32-byte seed, else random."""
    if seed is None:
        pk, sk = crypto_sign_keypair()
    else:
        if len(seed) != 32:
            raise ValueError(f"Ed25519 seed must be 32 bytes, got {len(seed)}")
        pk, sk = crypto_sign_seed_keypair(bytes(seed))
    return KeyPair(pk, sk)


def namespace(name: str | bytes, count: int | Iterable[int]) -> list[bytes]:
    """hypercore-crypto `namespace`: `BLAKE2b-256(BLAKE2b-256(name) ‖ byte(id))` per id."""
    ids = range(count) if isinstance(count, int) else list(count)
    base = blake2b(name.encode() if isinstance(name, str) else bytes(name))
    out = []
    for i in ids:
        if not 0 <= i <= 255:
            raise ValueError(f"namespace id {i} does not fit one byte")
        out.append(blake2b(base + bytes((i,))))
    return out


def discovery_key(key: bytes) -> bytes:
    """hypercore-crypto `discoveryKey`: `BLAKE2b-256("hypercore"; key=key)`."""
    return blake2b(b"hypercore", key=key)


# --- z-base-32 (z32 package) -------------------------------------------------------------

Z32_ALPHABET = "ybndrfg8ejkmcpqxot1uwisza345h769"
_Z32_REVERSE = {c: i for i, c in enumerate(Z32_ALPHABET)}
# bytes produced by a tail of r characters (z32/index.js `decode`)
_Z32_TAIL_BYTES = (0, 1, 1, 2, 2, 3, 4, 4)


def z32_encode(data: bytes) -> str:
    """z32 `encode`: 5-bit groups MSB first, last group zero-padded, no padding character."""
    n = len(data)
    if n == 0:
        return ""
    bits = n * 8
    value = int.from_bytes(data, "big")
    groups = -(-bits // 5)
    value <<= groups * 5 - bits
    return "".join(Z32_ALPHABET[(value >> (5 * (groups - 1 - i))) & 31] for i in range(groups))


def z32_decode(text: str) -> bytes:
    """z32 `decode`: case-sensitive; surplus low bits of the last character are ignored."""
    if not isinstance(text, str):
        raise KeyEncodingError(f"z32 input must be a string, got {type(text).__name__}")
    q, r = divmod(len(text), 8)
    nbytes = q * 5 + _Z32_TAIL_BYTES[r]
    value = 0
    for pos, ch in enumerate(text):
        v = _Z32_REVERSE.get(ch)
        if v is None:
            raise KeyEncodingError(f'Invalid character in base32 input: "{ch}" at position {pos}')
        value = value << 5 | v
    # pad to whole 8-character blocks, as the JS reads missing quintets as 0
    value <<= 5 * ((8 - r) % 8)
    full = (q + (1 if r else 0)) * 5
    return value.to_bytes(full, "big")[:nbytes]


# --- hypercore-id-encoding -----------------------------------------------------------------


def encode_id(key: bytes) -> str:
    """hypercore-id-encoding `encode`: a 32-byte key as 52 z32 characters."""
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise KeyEncodingError("Key must be a Buffer")
    if len(key) != 32:
        raise KeyEncodingError(f"Key must be 32-bytes long, got {len(key)}")
    return z32_encode(bytes(key))


def decode_id(key: str | bytes) -> bytes:
    """hypercore-id-encoding `decode`: 32 raw bytes, 52-char z32, 64-char hex or `pear://`."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        if len(key) != 32:
            raise KeyEncodingError(f"ID must be 32-bytes long, got {len(key)}")
        return bytes(key)
    if isinstance(key, str):
        s = key
        if s.startswith("pear://"):
            s = s[7:].split("/")[0]
        if len(s) == 52:
            return z32_decode(s)
        if len(s) == 64:
            try:
                raw = bytes.fromhex(s)
            except ValueError:
                raw = b""
            if len(raw) == 32:  # fromhex skips spaces; Node's hex decoder stops at them
                return raw
    raise KeyEncodingError(f"Invalid Hypercore key: {key!r}")


def normalize_id(key: str | bytes) -> str:
    """hypercore-id-encoding `normalize`: any accepted spelling → z32."""
    return encode_id(decode_id(key))


def is_valid_id(key: object) -> bool:
    try:
        decode_id(key)  # type: ignore[arg-type]
    except KeyEncodingError:
        return False
    return True


# --- corestore ------------------------------------------------------------------------------

NS_CORESTORE = namespace("corestore", 1)[0]
DEFAULT_NAMESPACE = bytes(32)


def corestore_seed(primary_key: bytes, name: str | bytes, ns: bytes = DEFAULT_NAMESPACE) -> bytes:
    """corestore `deriveSeed`: `BLAKE2b-256(NS_CORESTORE ‖ ns ‖ name; key=primary_key)`."""
    if len(primary_key) != 32:
        raise ValueError(f"corestore primary key must be 32 bytes, got {len(primary_key)}")
    raw_name = name.encode() if isinstance(name, str) else bytes(name)
    return blake2b(NS_CORESTORE + bytes(ns) + raw_name, key=bytes(primary_key))


def corestore_key_pair(primary_key: bytes, name: str | bytes, ns: bytes = DEFAULT_NAMESPACE) -> KeyPair:
    """corestore `createKeyPair(name)`; blind-relay-service's key is `(primary, "blind-relay")`."""
    return key_pair(corestore_seed(primary_key, name, ns))
