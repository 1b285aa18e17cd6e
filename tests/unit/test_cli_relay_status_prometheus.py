"""`cosmictui relay status` reads `[monitor] prometheus` from the config file, as `monitor` does:
without --prometheus, --storage or --metrics it lists every relay that Prometheus scrapes.

Through `cli.main` with a real config file (the real loader) and a stand-in Prometheus API on loopback.
"""

from __future__ import annotations

import io
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cosmictui import cli

RELAY = {"job": "blind-relay", "instance": "relay-eu:49738"}


def _vector(*series: tuple[dict[str, str], str]) -> bytes:
    result = [{"metric": m, "value": [0, v]} for m, v in series]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


@pytest.fixture
def prometheus() -> Iterator[tuple[str, list[str]]]:
    """A Prometheus API that scrapes one relay, up and joined; (its URL, the queries it was asked)."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.unquote(self.path)
            asked.append(query)
            up_and_joined = "up{" in query or "bootstrapped" in query
            body = _vector((RELAY, "1")) if up_and_joined else _vector()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", asked
    finally:
        srv.shutdown()
        srv.server_close()


def _config(tmp_path: Path, prometheus: str) -> Path:
    cfg = tmp_path / "cosmictui.toml"
    cfg.write_text(f'[relay]\nstorage = "{tmp_path / "relay"}"\n[monitor]\nprometheus = "{prometheus}"\n')
    return cfg


def test_relay_status_uses_the_configured_prometheus_without_the_flag(
    tmp_path: Path, prometheus: tuple[str, list[str]]
) -> None:
    url, asked = prometheus
    out = io.StringIO()
    rc = cli.main(["--config", str(_config(tmp_path, url)), "relay", "status"], out=out)
    lines = out.getvalue().splitlines()
    assert rc == 0, out.getvalue()
    assert asked, "the configured Prometheus was not asked"
    assert lines[0].startswith("▲ UP") and "relay-eu:49738" in lines[0], lines
    assert lines[-1] == "1 relay targets, 0 not up"
    out = io.StringIO()
    assert cli.main(["--config", str(_config(tmp_path, url)), "relay", "status", "--json"], out=out) == 0
    doc = json.loads(out.getvalue())
    assert doc["prometheus"] == url and [r["instance"] for r in doc["relays"]] == ["relay-eu:49738"]
    # a relay named on the command line wins: this machine's by its storage (none runs there)
    asked.clear()
    out = io.StringIO()
    rc = cli.main(["--config", str(_config(tmp_path, url)), "relay", "status", "--storage", str(tmp_path)], out=out)
    assert rc == 1 and asked == [] and "NOT RUNNING" in out.getvalue()


def test_a_bad_configured_prometheus_is_a_usage_error_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["--config", str(_config(tmp_path, "ftp://p:9090")), "relay", "status"], out=io.StringIO())
    assert rc == 2
    assert "[monitor] prometheus" in capsys.readouterr().err
