"""A thin ctypes binding to libnftables, the library behind the `nft` command.

Why not run `nft` as a child: a table made with `flags owner` belongs to the netlink socket
that made it and the kernel deletes it when that socket closes. A relay that holds one
libnftables context for its lifetime gets its forwarding rules removed by the kernel when it
exits or is killed, so a crashed relay never leaves pairs forwarded behind it. A child `nft`
would take the table with it on exit. Debian's python3-nftables binding is not on PyPI; the
five calls used here are the library's stable API (nftables(3)).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import socket
import struct
from typing import Any

#: nft_ctx_output_set_flags: JSON output (libnftables.h NFT_CTX_OUTPUT_JSON)
OUTPUT_JSON = 1 << 4


class NftError(Exception):
    """libnftables is missing or refused a command; the message is nft's own error text."""


class Nft:
    """One libnftables context (and its netlink socket) kept for the life of the process."""

    def __init__(self, library: str | None = None) -> None:
        name = library or ctypes.util.find_library("nftables") or "libnftables.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            raise NftError(f"libnftables is not installed ({e}); install the nftables package") from e
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        ctx = lib.nft_ctx_new(0)
        if not ctx:
            raise NftError("libnftables could not make a context")
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        self._lib = lib
        self._ctx: int | None = ctx
        self._json = False

    def run(self, script: str) -> str:
        """Run an nft script (atomic: all of it or none); returns nft's output."""
        return self._run(script, json_out=False)

    def query(self, command: str) -> dict[str, Any]:
        """Run a `list ...` command and return its JSON document."""
        out = self._run(command, json_out=True)
        try:
            doc = json.loads(out)
        except ValueError as e:
            raise NftError(f"nft printed something that is not JSON for {command!r}") from e
        if not isinstance(doc, dict):
            raise NftError(f"nft printed {type(doc).__name__} for {command!r}")
        return doc

    def _run(self, script: str, *, json_out: bool) -> str:
        if self._ctx is None:
            raise NftError("the nftables context is closed")
        if json_out != self._json:
            self._lib.nft_ctx_output_set_flags(self._ctx, OUTPUT_JSON if json_out else 0)
            self._json = json_out
        rc = self._lib.nft_run_cmd_from_buffer(self._ctx, script.encode())
        out = (self._lib.nft_ctx_get_output_buffer(self._ctx) or b"").decode(errors="replace")
        err = (self._lib.nft_ctx_get_error_buffer(self._ctx) or b"").decode(errors="replace")
        if rc != 0:
            raise NftError(err.strip() or f"nft failed ({rc})")
        return out

    def close(self) -> None:
        """Free the context; the kernel drops the tables it owned."""
        if self._ctx is not None:
            self._lib.nft_ctx_free(self._ctx)
            self._ctx = None


# -- reading named counters straight from the kernel ------------------------------------------
#
# Every libnftables `list` command first loads the table into its cache, set elements included:
# ~0.4 s for a relay with 8,192 directions in the kernel, however small the answer. The relay
# reads its three named counters once a second, so it asks the kernel for just those objects
# (one nf_tables GETOBJ dump: linux/netfilter/nf_tables.h, nfnetlink.h).

_NETLINK_NETFILTER = 12
_NFNL_SUBSYS_NFTABLES = 10
_NFT_MSG_NEWOBJ, _NFT_MSG_GETOBJ = 18, 19  # a GETOBJ dump answers with NEWOBJ messages
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_DUMP = 0x1, 0x4, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NFPROTO_IPV4 = 2
#: the family of an `inet` table (IPv4 and IPv6 in one)
NFPROTO_INET = 1
_NFTA_OBJ_TABLE, _NFTA_OBJ_NAME, _NFTA_OBJ_TYPE, _NFTA_OBJ_DATA = 1, 2, 3, 4
_NFT_OBJECT_COUNTER = 1
_NFTA_COUNTER_BYTES, _NFTA_COUNTER_PACKETS = 1, 2
_NLA_F_MASK = 0x3FFF  # attribute type without the nested / byte-order flags
_NLA_F_NESTED = 0x8000
_NFT_MSG_NEWSETELEM, _NFT_MSG_GETSETELEM = 12, 13  # a GETSETELEM dump answers with NEWSETELEM
_NFTA_SET_ELEM_LIST_TABLE, _NFTA_SET_ELEM_LIST_SET, _NFTA_SET_ELEM_LIST_ELEMENTS = 1, 2, 3
_NFTA_LIST_ELEM = 1
_NFTA_SET_ELEM_KEY, _NFTA_SET_ELEM_EXPR, _NFTA_SET_ELEM_EXPRESSIONS = 1, 7, 11
_NFTA_DATA_VALUE = 1
_NFTA_EXPR_NAME, _NFTA_EXPR_DATA = 1, 2


def _attr(kind: int, payload: bytes) -> bytes:
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * (-n % 4)


def _attrs(data: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    i = 0
    while i + 4 <= len(data):
        n, kind = struct.unpack_from("=HH", data, i)
        if n < 4:
            break
        out[kind & _NLA_F_MASK] = data[i + 4 : i + n]
        i += (n + 3) & ~3
    return out


def _attr_list(data: bytes) -> list[tuple[int, bytes]]:
    """The attributes of a nest in order (a list nest repeats one type)."""
    out: list[tuple[int, bytes]] = []
    i = 0
    while i + 4 <= len(data):
        n, kind = struct.unpack_from("=HH", data, i)
        if n < 4:
            break
        out.append((kind & _NLA_F_MASK, data[i + 4 : i + n]))
        i += (n + 3) & ~3
    return out


def _element_counter(elem: dict[int, bytes]) -> tuple[int, int] | None:
    """(packets, bytes) of a set element's counter expression, None without one."""
    exprs = [elem[_NFTA_SET_ELEM_EXPR]] if _NFTA_SET_ELEM_EXPR in elem else []
    exprs += [e for _k, e in _attr_list(elem.get(_NFTA_SET_ELEM_EXPRESSIONS, b""))]
    for raw in exprs:
        e = _attrs(raw)
        if e.get(_NFTA_EXPR_NAME, b"").rstrip(b"\0") == b"counter":
            c = _attrs(e.get(_NFTA_EXPR_DATA, b""))
            if _NFTA_COUNTER_PACKETS in c and _NFTA_COUNTER_BYTES in c:
                return struct.unpack(">Q", c[_NFTA_COUNTER_PACKETS][:8])[0], struct.unpack(
                    ">Q", c[_NFTA_COUNTER_BYTES][:8]
                )[0]
    return None


def read_element_counters(
    table: str, set_name: str, family: int = NFPROTO_INET, keys: list[bytes] | None = None, timeout: float = 2.0
) -> dict[bytes, tuple[int, int]]:
    """{key: (packets, bytes)} of the elements of `set_name` (a set with `counter`), keyed by
    their raw key bytes (a concatenation's fields each padded to 4 bytes). With `keys`, only
    those elements (one GET each, no dump: what a direction leaving the kernel needs); a key
    not in the set is left out. Raises NftError. No libnftables: its cache would load the whole
    table first."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
    except OSError as e:
        raise NftError(f"no netfilter netlink socket: {e}") from e
    kind = (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_GETSETELEM
    answer = (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWSETELEM
    head = (
        struct.pack("=BBH", family, 0, 0)
        + _attr(_NFTA_SET_ELEM_LIST_TABLE, table.encode() + b"\0")
        + _attr(_NFTA_SET_ELEM_LIST_SET, set_name.encode() + b"\0")
    )
    out: dict[bytes, tuple[int, int]] = {}
    with sock:
        sock.settimeout(timeout)
        if keys is None:
            requests = [(head, _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_DUMP)]
        else:
            requests = [
                (
                    head
                    + _attr(
                        _NFTA_SET_ELEM_LIST_ELEMENTS | _NLA_F_NESTED,
                        _attr(
                            _NFTA_LIST_ELEM | _NLA_F_NESTED,
                            _attr(_NFTA_SET_ELEM_KEY | _NLA_F_NESTED, _attr(_NFTA_DATA_VALUE, k)),
                        ),
                    ),
                    _NLM_F_REQUEST | _NLM_F_ACK,
                )
                for k in keys
            ]
        for seq, (body, flags) in enumerate(requests, 1):
            sock.sendto(struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body, (0, 0))
            for payload in _replies(sock, answer, table, missing_ok=keys is not None):
                a = _attrs(payload)
                for _k, raw in _attr_list(a.get(_NFTA_SET_ELEM_LIST_ELEMENTS, b"")):
                    elem = _attrs(raw)
                    key = _attrs(elem.get(_NFTA_SET_ELEM_KEY, b"")).get(_NFTA_DATA_VALUE)
                    got = _element_counter(elem)
                    if key is not None and got is not None:
                        out[key] = got
    return out


def _replies(sock: socket.socket, answer: int, table: str, *, missing_ok: bool = False) -> list[bytes]:
    """The payloads (after nfgenmsg) of the `answer` messages to the request just sent, up to its
    DONE or ACK. `missing_ok`: ENOENT (a GET for an element that is not there) is no error."""
    out: list[bytes] = []
    while True:
        try:
            data = sock.recv(1 << 17)
        except OSError as e:
            raise NftError(f"reading the relay's counters: {e}") from e
        i = 0
        while i + 16 <= len(data):
            n, mtype, _flags, _seq, _pid = struct.unpack_from("=IHHII", data, i)
            if n < 16:
                raise NftError("a malformed netlink reply")
            if mtype == _NLMSG_DONE:
                return out
            if mtype == _NLMSG_ERROR:
                err = -struct.unpack_from("=i", data, i + 16)[0]
                if err == 0 or (missing_ok and err == errno.ENOENT):
                    return out  # the ACK ends a request that is no dump
                raise NftError(f"the kernel refused to list the counters of {table}: {os.strerror(err)}")
            if mtype == answer:
                out.append(data[i + 16 + 4 : i + n])
            i += (n + 3) & ~3


def element_key(ip: str, port: int, stream_id: int) -> bytes:
    """A direction's key in the relay's pair sets as the kernel stores it (source address, then
    port and the stream id's wire bytes, each field padded to 4 bytes)."""
    addr = socket.inet_pton(socket.AF_INET6 if ":" in ip else socket.AF_INET, ip)
    return addr + struct.pack(">HH", port, 0) + struct.pack("<I", stream_id & 0xFFFFFFFF)


def read_counters(table: str, family: int = _NFPROTO_IPV4, timeout: float = 2.0) -> dict[str, tuple[int, int]]:
    """{name: (packets, bytes)} of the named counters in `table`; raises NftError."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_NETFILTER)
    except OSError as e:
        raise NftError(f"no netfilter netlink socket: {e}") from e
    with sock:
        sock.settimeout(timeout)
        body = struct.pack("=BBH", family, 0, 0)
        body += _attr(_NFTA_OBJ_TABLE, table.encode() + b"\0") + _attr(
            _NFTA_OBJ_TYPE, struct.pack(">I", _NFT_OBJECT_COUNTER)
        )
        kind = (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_GETOBJ
        answer = (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWOBJ
        sock.sendto(
            struct.pack("=IHHII", 16 + len(body), kind, _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_DUMP, 1, 0) + body, (0, 0)
        )
        out: dict[str, tuple[int, int]] = {}
        for payload in _replies(sock, answer, table):
            a = _attrs(payload)
            name = a.get(_NFTA_OBJ_NAME, b"").rstrip(b"\0").decode(errors="replace")
            c = _attrs(a.get(_NFTA_OBJ_DATA, b""))
            if name and _NFTA_COUNTER_PACKETS in c and _NFTA_COUNTER_BYTES in c:
                packets = struct.unpack(">Q", c[_NFTA_COUNTER_PACKETS][:8])[0]
                nbytes = struct.unpack(">Q", c[_NFTA_COUNTER_BYTES][:8])[0]
                out[name] = (packets, nbytes)
        return out
