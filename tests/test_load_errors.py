"""Bad input for the load probe: every failure is a recorded category or a failed probe status with its
reason, never an exception; whatever finished before stays on disk."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from diagnose.probes.http_client import HttpClient, RequestFailed
from diagnose.probes.sse import StreamResult
from tests.load_testserver import TestServer
from tests.test_load_probe import run_probe, spec_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("url, category", [
    ("http://nonexistent.invalid:8000", "connect"),
    (None, "refused"),
])
def test_unreachable_or_refused_fails_the_probe_with_a_reason(tmp_path: Path, url: str | None, category: str) -> None:
    url = url or f"http://127.0.0.1:{free_port()}"
    status, b = asyncio.run(run_probe(TestServer(), spec_for("2"), tmp_path / "b", url=url))
    assert status is not None and status.state == "failed"
    assert status.reason.startswith(f"cannot reach {url}")
    assert status.detail["errors_by_category"] == {category: 1}
    assert status.detail["requests_ok"] == 0
    assert b.records("requests") == []


@pytest.mark.parametrize("code, category", [(400, "http_4xx"), (404, "http_4xx"), (429, "http_429"),
                                            (500, "http_5xx"), (503, "http_5xx")])
def test_http_error_statuses_are_recorded_per_request(tmp_path: Path, code: int, category: str) -> None:
    status, b = asyncio.run(run_probe(TestServer("status", status=code), spec_for("2", num_requests=5),
                                      tmp_path / "b"))
    assert status is not None and status.state == "failed"
    assert status.reason.startswith("no request succeeded") and category in status.reason
    assert status.detail["requests_ok"] == 0 and status.detail["requests_failed"] == 5
    assert status.detail["errors_by_category"] == {category: 5}
    recs = b.records("requests")
    assert len(recs) == 5
    for r in recs:
        assert not r["ok"] and r["error"] == category and r["http_status"] == code
        assert r["error_detail"].startswith(f"HTTP {code}") and "on purpose" in r["error_detail"]


def test_connection_reset_mid_stream_keeps_the_chunks_seen(tmp_path: Path) -> None:
    status, b = asyncio.run(run_probe(TestServer("reset"), spec_for("2", num_requests=4), tmp_path / "b"))
    assert status is not None and status.state == "failed"
    recs = b.records("requests")
    assert len(recs) == 4 and all(r["error"] == "reset" and r["n_chunks"] == 2 for r in recs)
    assert all(r["first_token_ns"] is not None for r in recs)


def test_server_that_stops_streaming_times_out(tmp_path: Path) -> None:
    spec = spec_for("2", num_requests=2, request_timeout_s=0.5)
    status, b = asyncio.run(run_probe(TestServer("stall"), spec, tmp_path / "b"))
    assert status is not None and status.state == "failed"
    recs = b.records("requests")
    assert len(recs) == 2
    for r in recs:
        assert r["error"] == "timeout" and r["n_chunks"] == 2
        assert 0.45 <= (r["end_ns"] - r["sent_ns"]) / 1e9 < 2.0


@pytest.mark.parametrize("mode", ["malformed", "nonsse"])
def test_malformed_event_stream(tmp_path: Path, mode: str) -> None:
    status, b = asyncio.run(run_probe(TestServer(mode), spec_for("1", num_requests=2), tmp_path / "b"))
    assert status is not None and status.state == "failed"
    recs = b.records("requests")
    assert len(recs) == 2 and all(r["error"] == "malformed_sse" for r in recs)
    assert "not JSON" in recs[0]["error_detail"] or "not an event stream" in recs[0]["error_detail"]


def test_server_dying_mid_run_stops_the_run_and_keeps_what_finished(tmp_path: Path) -> None:
    async def scenario() -> tuple[object, list[dict[str, object]]]:
        srv = TestServer(itl_s=0.002)
        url = await srv.start()

        async def kill_later() -> None:
            while len(srv.bodies) < 10:  # let some requests finish first
                await asyncio.sleep(0.01)
            await srv.stop()

        killer = asyncio.ensure_future(kill_later())
        status, b = await run_probe(TestServer(), spec_for("2", num_requests=None, duration_s=20.0),
                                    tmp_path / "b", url=url)
        await killer
        return status, b.records("requests")

    status, recs = asyncio.run(scenario())
    assert getattr(status, "state", None) == "failed"
    assert "stopped accepting connections" in getattr(status, "reason", "")
    ok = [r for r in recs if r["ok"]]
    refused = [r for r in recs if r["error"] == "refused"]
    assert len(ok) >= 5 and len(refused) >= 50


def _run_on(loop_kind: str, coro: Any) -> Any:
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_stale_pooled_connection_is_retried_once(loop_kind: str) -> None:
    async def scenario() -> tuple[StreamResult, StreamResult]:
        srv = TestServer()
        url = await srv.start()
        client = HttpClient(url)
        body = b'{"model": "tiny", "prompt": "a", "max_tokens": 3, "stream": true}'
        first = await client.stream("/v1/completions", body, StreamResult())
        for conn in list(client._idle):  # the idle keep-alive connection dies just as it is reused
            assert conn.transport is not None
            conn.transport.close()
        second = await client.stream("/v1/completions", body, StreamResult())
        await client.close()
        await srv.stop()
        return first, second

    first, second = _run_on(loop_kind, scenario())
    assert first.ok and second.ok and len(second.t_ns) == 3


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_connection_the_server_drops_before_the_request_is_written_is_a_reset(loop_kind: str) -> None:
    """A server being killed accepts a connection and drops it before the client's task resumes to write the
    request: connection_lost has run by then. uvloop's write raises RuntimeError on such a transport ('the
    handler is closed'); it ended the load probe in CI (stop 41) instead of being counted as a failed request."""
    async def scenario() -> list[StreamResult]:
        async def drop(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.transport.abort()

        srv = await asyncio.start_server(drop, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        client = HttpClient(f"http://127.0.0.1:{port}", request_timeout_s=2)
        connect = client._connect

        async def late_connect() -> Any:  # the task resumes only after the drop has reached the protocol,
            conn = await connect()  # as on a starved host
            for _ in range(100):
                if conn.closed:
                    break
                await asyncio.sleep(0.01)
            assert conn.closed
            return conn

        client._connect = late_connect  # type: ignore[method-assign]
        body = b'{"model": "tiny", "prompt": "a", "max_tokens": 3, "stream": true}'
        out = [await client.stream("/v1/completions", body, StreamResult()) for _ in range(3)]
        with pytest.raises(RequestFailed):
            await client.request("GET", "/v1/models")
        await client.close()
        srv.close()
        await srv.wait_closed()
        return out

    results = _run_on(loop_kind, scenario())
    assert all(r.error == "reset" and r.end_ns >= r.sent_ns > 0 for r in results), \
        [(r.error, r.error_detail) for r in results]
