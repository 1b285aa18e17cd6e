"""Reading a Prometheus server that is not well: every failure is one PrometheusError with a fix,
and nothing hangs or reads without bound. (A real Prometheus: tests/interop/test_interop_prometheus.py.)"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cosmictui.ops.metrics.prometheus import MAX_BODY, PrometheusError, relays_from_prometheus

Respond = Callable[[BaseHTTPRequestHandler], None]


@pytest.fixture
def server() -> Iterator[Callable[[Respond], str]]:
    servers: list[ThreadingHTTPServer] = []

    def start(respond: Respond) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                # the client may give up first (an error reply it need not read): not a failure
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    respond(self)

            def log_message(self, *args: object) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def send(h: BaseHTTPRequestHandler, code: int, body: bytes) -> None:
    h.send_response(code)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def vector(*series: tuple[dict[str, str], str]) -> bytes:
    result = [{"metric": m, "value": [0, v]} for m, v in series]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def test_rows_joined_by_job_and_instance_and_junk_samples_dropped(server: Callable[[Respond], str]) -> None:
    a = {"job": "blind-relay", "instance": "a:49738"}

    def respond(h: BaseHTTPRequestHandler) -> None:
        q = h.path
        if "up%7B" in q:
            send(h, 200, vector((a, "1"), ({"job": "blind-relay-dht", "instance": "b"}, "0")))
        elif "blind_relay_info%7B" in q:
            send(h, 200, vector(({**a, "key": "k", "version": "1"}, "1")))
        elif "bootstrapped" in q:
            send(h, 200, vector((a, "1")))
        elif "resident" in q:
            send(h, 200, vector((a, "250e6")))
        elif "uptime" in q:
            send(h, 200, vector((a, "NaN"), ({"job": "x"}, "oops")))  # not finite / not a number: dropped
        else:
            send(h, 200, vector())

    rows = relays_from_prometheus(server(respond))
    assert [(r.job, r.instance, r.state) for r in rows] == [
        ("blind-relay", "a:49738", "over budget"),
        ("blind-relay-dht", "b", "down"),
    ]
    assert rows[0].key == "k" and rows[0].bootstrapped is True and rows[0].uptime_seconds is None


@pytest.mark.parametrize(
    ("respond", "words"),
    [
        (lambda h: send(h, 200, b"<html>a login page</html>"), "did not answer with the Prometheus API"),
        (lambda h: send(h, 500, b"oops"), "answered HTTP 500"),
        (lambda h: send(h, 200, b'{"status":"error","error":"parse error"}'), "refused the query: parse error"),
        (lambda h: send(h, 200, b"[" + b"1," * (MAX_BODY // 2) + b"1]"), "more than 8 MiB"),
    ],
)
def test_a_server_that_is_not_prometheus_is_one_error_with_a_fix(
    server: Callable[[Respond], str], respond: Respond, words: str
) -> None:
    with pytest.raises(PrometheusError) as e:
        relays_from_prometheus(server(respond))
    assert words in str(e.value) and "--prometheus URL" in e.value.fix


def test_slow_and_absent_servers_fail_in_bounded_time(server: Callable[[Respond], str]) -> None:
    url = server(lambda h: time.sleep(5))
    started = time.monotonic()
    with pytest.raises(PrometheusError):
        relays_from_prometheus(url, timeout=0.5)
    assert time.monotonic() - started < 4.5
    with pytest.raises(PrometheusError) as e:
        relays_from_prometheus("127.0.0.1:9", timeout=2)  # nothing listens on the discard port
    assert "cannot read http://127.0.0.1:9" in str(e.value)
