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
import json
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
