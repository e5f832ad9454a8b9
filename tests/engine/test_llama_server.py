"""The second real engine: llama.cpp's llama-server (CPU build of the llama-cpp-python 0.3.36 sdist's vendored
llama.cpp, commit 0c1e57098) serving the tiny model as GGUF (harness/ensure_llama.sh, harness/llama_server.py).

It checks what the tool will read from it: OpenAI-compatible streaming, the ``llamacpp:*`` Prometheus
metrics, ``/props`` and ``/slots``, and the harness's clean shutdown. llama-server starts in well under a
second here, so tests start their own servers freely. Tests marked ``offline`` need no engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from harness.engine import EngineError
from harness.llama_server import (
    LLAMA_CPP_COMMIT,
    LlamaServer,
    ensure_llama,
    llama_server_bin,
    tiny_gguf_path,
)

# Every metric this llama-server version exposes (all of them, from the first scrape on, with --metrics).
# Counters grow when a request *finishes* (prompt_tokens_total, tokens_predicted_total...); n_decode_total,
# n_tokens_max and the two request gauges move while requests run.
LLAMACPP_METRICS = {
    "llamacpp:prompt_tokens_total": "counter",
    "llamacpp:prompt_tokens_cached_total": "counter",
    "llamacpp:prompt_seconds_total": "counter",
    "llamacpp:tokens_predicted_total": "counter",
    "llamacpp:tokens_predicted_seconds_total": "counter",
    "llamacpp:n_decode_total": "counter",
    "llamacpp:n_tokens_max": "counter",
    "llamacpp:spec_decode_num_draft_tokens_total": "counter",
    "llamacpp:spec_decode_num_accepted_tokens_total": "counter",
    "llamacpp:spec_decode_num_drafts_total": "counter",
    "llamacpp:prompt_tokens_seconds": "gauge",
    "llamacpp:predicted_tokens_seconds": "gauge",
    "llamacpp:requests_processing": "gauge",
    "llamacpp:requests_deferred": "gauge",
    "llamacpp:n_busy_slots_per_decode": "gauge",
}


@pytest.fixture(scope="module")
def llama_built() -> None:
    """llama-server and the tiny GGUF exist (built on first use, ~10 min on 2 cores; a failure fails)."""
    ensure_llama()


@pytest.fixture(scope="module")
def llama(llama_built: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    with LlamaServer(n_parallel=2, log_path=log_path) as server:
        yield server


def _session() -> aiohttp.ClientSession:
    """A client session that opens a connection per request: llama-server closes the connection after a
    streamed response although it sent ``Keep-Alive``, so a pooled connection reused after a stream fails
    ("Can not write request body"); see test_connection_closed_after_streamed_response."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


def _get_json(url: str) -> Any:
    async def go() -> Any:
        async with _session() as s, s.get(url) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()

    return asyncio.run(go())


def _metrics(url: str) -> tuple[dict[str, float], dict[str, str]]:
    """``GET /metrics`` -> ({name: value}, {name: TYPE}) for the unlabelled samples."""

    async def go() -> str:
        async with _session() as s, s.get(f"{url}/metrics") as resp:
            assert resp.status == 200, await resp.text()
            return await resp.text()

    values: dict[str, float] = {}
    types: dict[str, str] = {}
    for line in asyncio.run(go()).splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line and not line.startswith("#") and "{" not in line:
            name, value = line.split()
            values[name] = float(value)
    return values, types


async def _stream(
    session: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any]
) -> list[dict[str, Any]]:
    """POST a streaming request; the decoded ``data:`` events up to ``[DONE]``."""
    events: list[dict[str, Any]] = []
    async with session.post(f"{url}{path}", json={**body, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        async for raw in resp.content:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                break
            if line.startswith("data:"):
                events.append(json.loads(line[len("data:") :]))
    return events


@pytest.mark.engine
def test_streaming_completions_and_chat(llama: LlamaServer) -> None:
    async def go() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with _session() as s:
            completion = await _stream(s, llama.url, "/v1/completions", {
                "model": "tiny-llama", "prompt": "def main(", "max_tokens": 16, "ignore_eos": True,
                "stream_options": {"include_usage": True},
            })  # fmt: skip
            chat = await _stream(s, llama.url, "/v1/chat/completions", {
                "model": "tiny-llama", "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 8, "ignore_eos": True,
            })  # fmt: skip
            return completion, chat

    completion, chat = asyncio.run(go())
    texts = [c["text"] for e in completion for c in e["choices"] if c.get("text")]
    assert len(texts) >= 8, completion  # one event per token (a partial UTF-8 token may come empty)
    assert completion[-1]["choices"][0]["finish_reason"] == "length"
    assert completion[-1]["usage"]["completion_tokens"] == 16
    assert completion[-1]["model"] == "tiny-llama"
    assert completion[-1]["timings"]["predicted_n"] == 16  # llama.cpp's own per-request timings
    deltas = [c["delta"]["content"] for e in chat for c in e["choices"] if c.get("delta", {}).get("content")]
    assert len(deltas) >= 4, chat
    assert chat[0]["object"] == "chat.completion.chunk"
    assert chat[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.engine
def test_metrics_names_and_counters(llama: LlamaServer) -> None:
    async def one() -> None:
        async with _session() as s:
            await _stream(s, llama.url, "/v1/completions",
                          {"prompt": "import os", "max_tokens": 16, "ignore_eos": True})  # fmt: skip

    before, types = _metrics(llama.url)
    assert {name: types.get(name) for name in LLAMACPP_METRICS} == LLAMACPP_METRICS
    assert set(before) == set(LLAMACPP_METRICS)  # nothing else, no labelled series (no speculative decoding)
    asyncio.run(one())
    after, _ = _metrics(llama.url)
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 16
    assert after["llamacpp:prompt_tokens_total"] > before["llamacpp:prompt_tokens_total"]
    assert after["llamacpp:n_decode_total"] >= before["llamacpp:n_decode_total"] + 16
    assert after["llamacpp:requests_processing"] == 0 and after["llamacpp:requests_deferred"] == 0


@pytest.mark.engine
def test_busy_slots_and_deferred_requests(llama: LlamaServer) -> None:
    """Eight long requests on two slots: two process, the rest wait (requests_deferred), and /slots shows it;
    closing the streams frees the slots and drops the waiting requests.

    The server generates whether or not the client reads, so a poll must land while it still works: with four
    requests of 1,500 tokens (~2 s of work) a client starved of CPU that long (CI: 90% of the test's time
    stalled) polled only before and after, and saw no slot busy. Eight of 1,900 tokens keep it busy ~11 s on an
    idle machine; the test stops the streams as soon as it has seen the three states, so it costs no more."""
    want = {"llamacpp:requests_processing": 2.0, "llamacpp:requests_deferred": 1.0, "busy_slots": 2.0}
    seen = dict.fromkeys(want, 0.0)

    async def poll(s: aiohttp.ClientSession) -> dict[str, float]:
        now: dict[str, float] = {}
        async with s.get(f"{llama.url}/metrics") as r:
            for line in (await r.text()).splitlines():
                name, _, value = line.partition(" ")
                if name in want:
                    now[name] = float(value)
        async with s.get(f"{llama.url}/slots") as r:
            now["busy_slots"] = sum(bool(x["is_processing"]) for x in await r.json())
        return now

    async def go() -> dict[str, float]:
        async with _session() as s:
            body = {"prompt": "class A:", "max_tokens": 1900, "ignore_eos": True}
            tasks = [asyncio.create_task(_stream(s, llama.url, "/v1/completions", body)) for _ in range(8)]
            while not all(t.done() for t in tasks) and any(seen[k] < v for k, v in want.items()):
                for k, v in (await poll(s)).items():
                    seen[k] = max(seen[k], v)
                await asyncio.sleep(0.01)
            for t in tasks:  # closes their connections: llama-server stops a slot whose client has gone
                t.cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(d, asyncio.CancelledError) or d[-1]["usage"]["completion_tokens"] == 1900
                       for d in done)
            deadline = time.monotonic() + 60
            while (after := await poll(s)) != dict.fromkeys(want, 0.0) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return after

    after = asyncio.run(go())
    assert seen["llamacpp:requests_processing"] == 2
    assert seen["llamacpp:requests_deferred"] >= 1
    assert seen["busy_slots"] == 2
    assert after == dict.fromkeys(want, 0.0)  # idle again: no slot kept generating for a closed stream


@pytest.mark.engine
def test_props_slots_and_models(llama: LlamaServer) -> None:
    props = _get_json(f"{llama.url}/props")
    assert props["total_slots"] == 2
    assert props["default_generation_settings"]["n_ctx"] == 2048  # per slot: -c 4096 split over -np 2
    assert props["model_alias"] == "tiny-llama"
    assert props["model_path"] == str(tiny_gguf_path())
    assert props["model_ftype"] == "F16"
    assert (
        props["build_info"] == f"b0-{LLAMA_CPP_COMMIT}"
    )  # b<build number>-<commit>; the sdist has no git count
    assert props["endpoint_metrics"] is True and props["endpoint_slots"] is True
    assert props["bos_token"] == "<s>" and props["eos_token"] == "</s>"
    assert "<|assistant|>" in props["chat_template"]

    slots = _get_json(f"{llama.url}/slots")
    assert [s["id"] for s in slots] == [0, 1]
    assert all(s["n_ctx"] == 2048 for s in slots)
    assert all(s["is_processing"] is False for s in slots)

    models = _get_json(f"{llama.url}/v1/models")
    (model,) = models["data"]
    assert model["id"] == "tiny-llama" and model["owned_by"] == "llamacpp"
    meta = model["meta"]
    assert (meta["n_vocab"], meta["n_ctx_train"], meta["n_embd"]) == (4096, 2048, 256)


@pytest.mark.engine
def test_connection_closed_after_streamed_response(llama: LlamaServer) -> None:
    """Records a behaviour clients must handle: after a streamed (chunked) response llama-server closes the
    connection although its headers say ``Keep-Alive: timeout=5, max=100``; a non-streamed response keeps
    it open. A pooling client that reuses the connection gets a reset on its next request."""

    async def exchange(stream: bool) -> tuple[bytes, bool]:
        reader, writer = await asyncio.open_connection("127.0.0.1", llama.port)
        body = json.dumps({"prompt": "x", "max_tokens": 4, "stream": stream}).encode()
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        closed = False
        with contextlib.suppress(asyncio.TimeoutError):
            # the body is small: reading on for 3 s either hits EOF (server closed) or times out (kept open)
            while await asyncio.wait_for(reader.read(65536), 3):
                pass
            closed = True
        writer.close()
        return head, closed

    head, closed = asyncio.run(exchange(stream=True))
    assert b"Transfer-Encoding: chunked" in head and b"Keep-Alive:" in head
    assert closed
    head, closed = asyncio.run(exchange(stream=False))
    assert b"Content-Length:" in head
    assert not closed


@pytest.mark.engine
def test_stop_leaves_nothing_and_bad_model_raises(llama_built: None, tmp_path: Path) -> None:
    server = LlamaServer(n_parallel=1, log_path=tmp_path / "one.log").start()
    assert server.ready_s is not None and server.ready_s < 60
    procs = server.processes()
    assert [p.pid for p in procs] == [server.pid]
    server.stop()
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)
    assert not server.running and not server.health_ok(timeout_s=0.5)
    server.stop()  # idempotent

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(EngineError, match="exited with code"):
        LlamaServer(model_path=bad, log_path=tmp_path / "bad.log", startup_timeout_s=60).start()


@pytest.mark.engine
def test_killed_owner_leaves_no_orphans(llama_built: None, tmp_path: Path) -> None:
    """SIGKILL the Python process that started a server: the _reaper.py watchdog takes the server down."""
    repo = Path(__file__).resolve().parents[2]
    code = (
        f"import sys, time; sys.path.insert(0, {str(repo)!r}); from harness.llama_server import LlamaServer; "
        f"s = LlamaServer(log_path={str(tmp_path / 'log')!r}).start(); print(s.pid, flush=True); time.sleep(120)"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = -1
    try:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        assert psutil.Process(pid).cmdline()[0] == str(llama_server_bin())
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and psutil.pid_exists(pid):
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.2)
    alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    if alive:
        with contextlib.suppress(ProcessLookupError):  # do not leak it even when the test fails
            os.killpg(pid, signal.SIGKILL)
    assert not alive


# ---- offline (no engine needed; runs in the unit suite) --------------------------------------------


@pytest.mark.offline
def test_command_line_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_ARG_N_PARALLEL", "8")  # llama-server reads LLAMA_ARG_* as flags
    server = LlamaServer(port=18123, n_parallel=3, extra_args=["--no-warmup"], log_path=tmp_path / "log")
    cmd = server.command()
    assert cmd[0] == str(llama_server_bin())
    pairs = dict(zip(cmd[1:-3:2], cmd[2:-3:2], strict=True))
    assert pairs == {
        "-m": str(tiny_gguf_path()), "--alias": "tiny-llama", "--host": "127.0.0.1", "--port": "18123",
        "-np": "3", "-c": str(3 * 2048), "-t": "2",
    }  # fmt: skip
    assert cmd[-3:] == ["--metrics", "--slots", "--no-warmup"]
    env = server.environment()
    assert "LLAMA_ARG_N_PARALLEL" not in env and env["HF_HUB_OFFLINE"] == "1"
    assert (
        LlamaServer(port=1, metrics=False, slots=False, log_path=tmp_path / "l2").command()[-1]
        == "--no-slots"
    )


@pytest.mark.engine
def test_attach_captures_llama_server_without_failed_requests(llama: LlamaServer, tmp_path: Path) -> None:
    """diagnose attach against llama-server, 2 slots at concurrency 4: every request succeeds (its closed
    connections once failed 13% of them), the engine is detected with its version, and the llamacpp
    metrics are scraped."""
    out = tmp_path / "b"
    p = subprocess.run([sys.executable, "-m", "diagnose", "attach", "--url", llama.url, "-c", "4", "-n", "40",
                        "--baseline", "4", "--no-nvml", "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    failed = [(r["error"], r["error_detail"]) for r in rows if not r["ok"]]
    assert len(rows) >= 44 and failed == [], failed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"]["engine"] == "llamacpp", manifest["target"]
    assert "llamacpp:requests_deferred" in (out / "metric_families.jsonl").read_text()
