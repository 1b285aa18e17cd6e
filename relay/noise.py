"""Noise XX and IK exactly as Holepunch speaks them (noise-handshake 4.2 + noise-curve-ed 2.1).

secret-stream runs XX (empty prologue, empty payloads) when it owns the handshake; hyperdht
runs IK with prologue `NS.PEER_HANDSHAKE` and carries the two messages inside its DHT
`PEER_HANDSHAKE` requests. Both use Ed25519 key pairs for static *and* ephemeral keys, with
DH = `crypto_scalarmult_ed25519_noclamp(clamp(SHA-512(seed)[:32]), peer_pk)` — not X25519 —
and BLAKE2b-512 / ChaCha20-Poly1305 for the symmetric state. The class is a pure state
machine: bytes in, bytes out, no I/O. Proven against `vectors/streams.json` (`primitives`,
`noise.xx`, `noise.ik`) and `vectors/dht.json` (`noiseIK`) and live against the npm package.

Public API (stable):

- `NoiseHandshake(pattern: "XX"|"IK", initiator: bool, static: KeyPair | None,
  remote_static: bytes | None = None, prologue: bytes = b"", ephemeral: KeyPair | None = None)`
  - `.send(payload=b"") -> bytes`: the next handshake message to put on the wire.
  - `.recv(message) -> bytes`: consume the peer's message, return its (decrypted) payload.
  - `.complete`, and once complete `.tx`, `.rx` (32 bytes each), `.hash` (64 bytes),
    `.remote_static` (peer's Ed25519 public key; known after its `s` token).
  - `.static` (own KeyPair), `.initiator`, `.pattern`; `.h`/`.ck` expose the symmetric state
    (tests compare them with the JS transcript).
  - `ephemeral` is a test hook: noise-handshake only draws `e` when it is unset.
  - `.my_turn` says whether `send` (True) or `recv` (False) is expected next.
- `NoiseError`: every failure — short or tampered message, bad point, wrong turn, message
  too long. The handshake is dead after one; build a new one.
- Building blocks (also used by the dht layer): `dh(public_key, key_pair)`,
  `hmac_blake2b(key, data)`, `hkdf(ck, ikm) -> (out1, out2)`, `protocol_name(pattern)`.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Literal

from nacl.bindings import (
    crypto_aead_chacha20poly1305_ietf_decrypt,
    crypto_aead_chacha20poly1305_ietf_encrypt,
    crypto_hash_sha512,
    crypto_scalarmult_ed25519_noclamp,
)
from nacl.bindings import crypto_generichash_blake2b_salt_personal as _generichash
from nacl.exceptions import CryptoError

from relay.keys import KeyPair, key_pair

__all__ = [
    "HASHLEN",
    "NoiseError",
    "NoiseHandshake",
    "dh",
    "hkdf",
    "hmac_blake2b",
    "protocol_name",
]

HASHLEN = 64
PKLEN = 32
MACLEN = 16
MAX_MESSAGE = 65535

Pattern = Literal["XX", "IK"]

# Each pattern: (pre-message "responder static known to initiator", message token lists)
_PATTERNS: dict[str, tuple[bool, tuple[tuple[str, ...], ...]]] = {
    "XX": (False, (("e",), ("e", "ee", "s", "es"), ("s", "se"))),
    "IK": (True, (("e", "es", "s", "ss"), ("e", "ee", "se"))),
}


class NoiseError(Exception):
    """The Noise handshake failed; the message says what the peer (or caller) did wrong."""


def protocol_name(pattern: str) -> bytes:
    return f"Noise_{pattern}_Ed25519_ChaChaPoly_BLAKE2b".encode()


def _hash(data: bytes) -> bytes:
    return _generichash(data, digest_size=HASHLEN)


def hmac_blake2b(key: bytes, data: bytes) -> bytes:
    """HMAC over BLAKE2b-512 (block 128), as noise-handshake's hmac.js."""
    return hmac.new(key, data, hashlib.blake2b).digest()


def hkdf(chaining_key: bytes, ikm: bytes) -> tuple[bytes, bytes]:
    """noise-handshake's two-output HKDF (empty info); each output is 64 bytes."""
    prk = hmac_blake2b(chaining_key, ikm)
    t1 = hmac_blake2b(prk, b"\x01")
    t2 = hmac_blake2b(prk, t1 + b"\x02")
    return t1, t2


def _scalar(kp: KeyPair) -> bytes:
    s = bytearray(crypto_hash_sha512(kp.secret_key[:32])[:32])
    s[0] &= 248
    s[31] &= 127
    s[31] |= 64
    return bytes(s)


def dh(public_key: bytes, kp: KeyPair) -> bytes:
    """noise-curve-ed `dh`: Ed25519 point multiply by the clamped seed scalar."""
    if len(public_key) != PKLEN:
        raise NoiseError(f"public key must be {PKLEN} bytes, got {len(public_key)}")
    try:
        return crypto_scalarmult_ed25519_noclamp(_scalar(kp), bytes(public_key))
    except Exception as e:  # nacl raises RuntimeError/ValueError for bad points
        raise NoiseError(f"DH with peer key {bytes(public_key).hex()} failed: invalid Ed25519 point") from e


class NoiseHandshake:
    """One Noise handshake, either role; call `send`/`recv` alternately until `complete`."""

    def __init__(
        self,
        pattern: Pattern,
        initiator: bool,
        static: KeyPair | None = None,
        remote_static: bytes | None = None,
        prologue: bytes = b"",
        ephemeral: KeyPair | None = None,
    ) -> None:
        if pattern not in _PATTERNS:
            raise NoiseError(f"unsupported Noise pattern {pattern!r} (XX or IK)")
        pre_rs, messages = _PATTERNS[pattern]
        self.pattern = pattern
        self.initiator = initiator
        self.static = static if static is not None else key_pair()
        self.e: KeyPair | None = ephemeral
        self.re: bytes | None = None
        self.remote_static: bytes | None = None
        self.complete = False
        self.tx: bytes | None = None
        self.rx: bytes | None = None
        self.hash: bytes | None = None
        self._messages = list(messages)
        self._index = 0
        self._failed: str | None = None
        self._k: bytes | None = None
        self._n = 0

        name = protocol_name(pattern)
        self.h = name.ljust(HASHLEN, b"\x00") if len(name) <= HASHLEN else _hash(name)
        self.ck = self.h
        self._mix_hash(bytes(prologue))
        if pre_rs:
            if initiator:
                if remote_static is None or len(remote_static) != PKLEN:
                    raise NoiseError("IK initiator needs the responder's 32-byte static public key")
                self.remote_static = bytes(remote_static)
                self._mix_hash(self.remote_static)
            else:
                self._mix_hash(self.static.public_key)

    # --- turn-taking ----------------------------------------------------------------------

    @property
    def my_turn(self) -> bool:
        """True when the next message is ours to send (initiator sends the even ones)."""
        return (self._index % 2 == 0) == self.initiator

    def _next_tokens(self, sending: bool) -> tuple[str, ...]:
        if self._failed is not None:
            raise NoiseError(f"handshake already failed: {self._failed}")
        if self.complete or self._index >= len(self._messages):
            raise NoiseError("handshake is already complete")
        if self.my_turn != sending:
            raise NoiseError(
                f"out of turn: expected to {'send' if self.my_turn else 'receive'} message {self._index + 1}"
            )
        tokens = self._messages[self._index]
        self._index += 1
        return tokens

    # --- symmetric state ------------------------------------------------------------------

    def _mix_hash(self, data: bytes) -> None:
        self.h = _hash(self.h + data)

    def _mix_key(self, ikm: bytes) -> None:
        self.ck, temp_k = hkdf(self.ck, ikm)
        self._k = temp_k[:32]
        self._n = 0

    def _nonce(self) -> bytes:
        return b"\x00\x00\x00\x00" + self._n.to_bytes(8, "little")

    def _encrypt_and_hash(self, plaintext: bytes) -> bytes:
        if self._k is None:
            c = plaintext
        else:
            c = crypto_aead_chacha20poly1305_ietf_encrypt(plaintext, self.h, self._nonce(), self._k)
            if len(c) > MAX_MESSAGE:
                raise NoiseError(f"ciphertext length of {len(c)} exceeds maximum Noise message length of {MAX_MESSAGE}")
            self._n += 1
        self._mix_hash(c)
        return c

    def _decrypt_and_hash(self, c: bytes) -> bytes:
        if self._k is None:
            p = c
        else:
            if len(c) > MAX_MESSAGE:
                raise NoiseError(f"ciphertext length of {len(c)} exceeds maximum Noise message length of {MAX_MESSAGE}")
            if len(c) < MACLEN:
                raise NoiseError(f"encrypted field of {len(c)} bytes is shorter than its {MACLEN}-byte tag")
            try:
                p = crypto_aead_chacha20poly1305_ietf_decrypt(c, self.h, self._nonce(), self._k)
            except CryptoError:
                raise NoiseError(f"message {self._index} failed authentication (tampered or wrong keys)") from None
            self._n += 1
        self._mix_hash(c)
        return p

    def _dh_token(self, token: str) -> None:
        # es: initiator uses (e, rs), responder (s, re); se mirrors it; ee/ss obvious.
        local_static = token == "ss" or (token == "es" and not self.initiator) or (token == "se" and self.initiator)
        remote_static = token == "ss" or (token == "es" and self.initiator) or (token == "se" and not self.initiator)
        local = self.static if local_static else self.e
        remote = self.remote_static if remote_static else self.re
        if local is None or remote is None:
            raise NoiseError(f"token {token} before the keys it needs are known")
        self._mix_key(dh(remote, local))

    def _split(self) -> None:
        t1, t2 = hkdf(self.ck, b"")
        k1, k2 = t1[:32], t2[:32]
        self.tx, self.rx = (k1, k2) if self.initiator else (k2, k1)
        self.hash = self.h
        self.complete = True
        self._k = None
        self.e = None
        self.re = None
        self.ck = b""

    # --- messages -------------------------------------------------------------------------

    def send(self, payload: bytes = b"") -> bytes:
        """Write our next handshake message carrying `payload`."""
        try:
            return self._send(payload)
        except NoiseError as e:
            self._fail(e)
            raise

    def recv(self, message: bytes) -> bytes:
        """Read the peer's next handshake message; returns its payload."""
        try:
            return self._recv(message)
        except NoiseError as e:
            self._fail(e)
            raise

    def _fail(self, e: NoiseError) -> None:
        if self._failed is None and not str(e).startswith(("out of turn", "handshake already")):
            self._failed = str(e)

    def _send(self, payload: bytes) -> bytes:
        tokens = self._next_tokens(sending=True)
        out = bytearray()
        for token in tokens:
            if token == "e":
                if self.e is None:
                    self.e = key_pair()
                self._mix_hash(self.e.public_key)
                out += self.e.public_key
            elif token == "s":
                out += self._encrypt_and_hash(self.static.public_key)
            else:
                self._dh_token(token)
        out += self._encrypt_and_hash(bytes(payload))
        if self._index == len(self._messages):
            self._split()
        return bytes(out)

    def _recv(self, message: bytes) -> bytes:
        tokens = self._next_tokens(sending=False)
        msg = bytes(message)
        pos = 0
        for token in tokens:
            if token == "e":
                if len(msg) - pos < PKLEN:
                    raise NoiseError(f"message {self._index} too short: no room for the ephemeral key")
                self.re = msg[pos : pos + PKLEN]
                pos += PKLEN
                self._mix_hash(self.re)
            elif token == "s":
                klen = PKLEN + MACLEN if self._k is not None else PKLEN
                if len(msg) - pos < klen:
                    raise NoiseError(f"message {self._index} too short: no room for the static key")
                self.remote_static = self._decrypt_and_hash(msg[pos : pos + klen])
                pos += klen
            else:
                self._dh_token(token)
        payload = self._decrypt_and_hash(msg[pos:])
        if self._index == len(self._messages):
            self._split()
        return payload
