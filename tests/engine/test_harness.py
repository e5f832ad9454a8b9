"""The real-engine harness: a real vLLM CPU server serving the tiny model, and its clean shutdown.

Tests marked ``offline`` check the harness logic without an engine and run in the default unit suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import psutil
import pytest

from harness.engine import EngineError, VllmServer, engine_ready, free_port


async def _stream_completion(
    session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int
) -> tuple[int, int]:
    """One streamed completion; returns (completion_tokens from usage, number of content chunks)."""
    body = {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage_tokens, chunks = -1, 0
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data:") :])
            if event.get("choices") and event["choices"][0].get("text"):
                chunks += 1
            if event.get("usage"):
                usage_tokens = int(event["usage"]["completion_tokens"])
    return usage_tokens, chunks


def _get(url: str) -> tuple[int, str]:
    async def go() -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(url) as resp:
            return resp.status, await resp.text()

    return asyncio.run(go())


# ---- real engine -----------------------------------------------------------------------------------


@pytest.mark.engine
def test_models_lists_tiny_llama(vllm_server: VllmServer) -> None:
    status, text = _get(f"{vllm_server.url}/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(text)["data"]] == ["tiny-llama"]


@pytest.mark.engine
def test_streamed_completion_returns_exact_token_count(vllm_server: VllmServer) -> None:
    async def go() -> tuple[int, int]:
        async with aiohttp.ClientSession() as session:
            return await _stream_completion(session, vllm_server.url, "def fibonacci(n):", 16)

    usage_tokens, chunks = asyncio.run(go())
    assert usage_tokens == 16
    assert 1 <= chunks <= 16


@pytest.mark.engine
def test_metrics_expose_queue_gauge(vllm_server: VllmServer) -> None:
    status, text = _get(f"{vllm_server.url}/metrics")
    assert status == 200
    assert "vllm:num_requests_waiting" in text
    assert 'model_name="tiny-llama"' in text


@pytest.mark.engine
def test_throughput_sanity(vllm_server: VllmServer, capsys: pytest.CaptureFixture[str]) -> None:
    """32 streamed requests at concurrency 8, 64 output tokens each: all complete with exact counts.

    The throughput is printed (a sanity figure for the report), never asserted.
    """
    n_requests, concurrency, max_tokens = 32, 8, 64

    async def go() -> list[tuple[int, int]]:
        sem = asyncio.Semaphore(concurrency)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def one(i: int) -> tuple[int, int]:
                async with sem:  # unique prompts: no prefix-cache hits between requests
                    prompt = f"request {i}: " + " ".join(f"word{i}_{k}" for k in range(40))
                    return await _stream_completion(session, vllm_server.url, prompt, max_tokens)

            return await asyncio.gather(*(one(i) for i in range(n_requests)))

    t0 = time.monotonic()
    results = asyncio.run(go())
    elapsed = time.monotonic() - t0
    assert [u for u, _ in results] == [max_tokens] * n_requests
    total = sum(u for u, _ in results)
    with capsys.disabled():
        print(
            f"\n[harness sanity] {n_requests} req, concurrency {concurrency}, {max_tokens} tok each: "
            f"{elapsed:.2f} s, {total / elapsed:.0f} output tok/s, {n_requests / elapsed:.1f} req/s; "
            f"server ready in {vllm_server.ready_s:.1f} s"
        )


def _engine_tree(server: VllmServer) -> list[psutil.Process]:
    procs = server.processes()
    names = " ".join(p.name() + " " + " ".join(p.cmdline()) for p in procs)
    assert "VLLM::EngineCore" in names, names
    assert "VLLM::Worker" in names, names
    return procs


@pytest.mark.engine
def test_server_that_dies_raises_with_log_tail(start_vllm: Callable[..., VllmServer]) -> None:
    with pytest.raises(EngineError) as info:
        start_vllm(extra_args=["--max-num-seqs", "not-a-number"], startup_timeout_s=120)
    message = str(info.value)
    assert "exited with code" in message
    assert "max-num-seqs" in message or "not-a-number" in message


@pytest.mark.engine
def test_startup_timeout_raises_and_kills_the_tree(tmp_path: Path) -> None:
    server = VllmServer(startup_timeout_s=1.0, log_path=tmp_path / "log")
    with pytest.raises(EngineError, match="not healthy within 1 s"):
        server.start()
    assert not server.running
    leftovers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if f"--port {server.port}" in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []


@pytest.mark.engine
def test_profiler_then_stop_leaves_no_process_behind(
    start_vllm: Callable[..., VllmServer], tmp_path: Path
) -> None:
    """One dedicated server (startups are slow here): profiler endpoints work, then stop() kills the tree."""
    server = start_vllm(profiler_dir=tmp_path / "prof", extra_args=["--max-num-seqs", "4"])

    async def go() -> tuple[int, int]:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{server.url}/start_profile", json={"max_iterations": 2}) as r1:
                start = r1.status
            await _stream_completion(s, server.url, "import os", 4)
            async with s.post(f"{server.url}/stop_profile") as r2:
                return start, r2.status

    assert asyncio.run(go()) == (200, 200)
    assert sorted(p.name for p in (tmp_path / "prof").rglob("*.pt.trace.json*"))

    procs = _engine_tree(server)
    pids = {p.pid for p in procs}
    assert server.pid in pids and len(pids) >= 3
    server.stop()
    alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    assert not server.running and server.pid is None
    assert not server.health_ok(timeout_s=0.5)
    server.stop()  # idempotent


def _group_alive(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of a process group."""
    alive = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                alive.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return alive


@pytest.mark.engine
def test_killed_owner_leaves_no_orphans(engine_built: None, tmp_path: Path) -> None:
    """SIGKILL the Python process that started a server while the engine is still starting (no cleanup
    can run there, and vLLM swallows a SIGTERM during startup): the harness's watchdog
    (harness/_reaper.py) still takes down the whole process group, including children spawned later."""
    import signal
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    code = (
        f"import sys; sys.path.insert(0, {str(repo)!r}); from harness.engine import VllmServer; "
        f"VllmServer(log_path={str(tmp_path / 'log')!r}, startup_timeout_s=600).start()"
    )
    owner = subprocess.Popen([sys.executable, "-c", code])
    pgid = -1
    try:
        deadline = time.monotonic() + 480
        names: list[str] = []
        while time.monotonic() < deadline:  # wait until the engine core exists (startup under way)
            tree = psutil.Process(owner.pid).children(recursive=True)
            names = [p.name() for p in tree if p.is_running()]
            servers = [p for p in tree if "vllm.entrypoints" in " ".join(p.cmdline())]
            if servers and "VLLM::EngineCore" in names:
                pgid = servers[0].pid
                break
            time.sleep(0.5)
        assert pgid > 0 and len(_group_alive(pgid)) >= 2, names
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 90
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(1.0)
    survivors = _group_alive(pgid)
    with contextlib.suppress(ProcessLookupError):  # do not leak them even when the test fails
        os.killpg(pgid, signal.SIGKILL)
    assert survivors == []


# ---- offline (no engine needed; runs in the unit suite) --------------------------------------------


@pytest.mark.offline
def test_command_carries_profiler_and_otlp_flags(tmp_path: Path) -> None:
    server = VllmServer(
        port=18123,
        profiler_dir=tmp_path / "p",
        otlp_traces_endpoint="http://127.0.0.1:4317",
        extra_args=["--max-num-seqs", "2"],
        kv_cache_space_gib=3,
        log_path=tmp_path / "log",
    )
    cmd = server.command()
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--port") + 1] == "18123"
    assert cmd[cmd.index("--served-model-name") + 1] == "tiny-llama"
    config = json.loads(cmd[cmd.index("--profiler-config") + 1])
    assert config == {
        "profiler": "torch",
        "torch_profiler_dir": str((tmp_path / "p").resolve()),
        "torch_profiler_with_stack": False,
    }
    assert cmd[cmd.index("--otlp-traces-endpoint") + 1] == "http://127.0.0.1:4317"
    assert cmd[-2:] == ["--max-num-seqs", "2"]
    assert server.environment()["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert server.url == "http://127.0.0.1:18123"


@pytest.mark.offline
def test_plain_command_has_no_optional_flags(tmp_path: Path) -> None:
    cmd = VllmServer(port=free_port(), log_path=tmp_path / "log").command()
    assert "--profiler-config" not in cmd and "--otlp-traces-endpoint" not in cmd


@pytest.mark.offline
def test_missing_engine_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIAGNOSE_ENGINE_VENV", str(tmp_path / "no-venv"))
    monkeypatch.setenv("DIAGNOSE_TINY_MODEL", str(tmp_path / "no-model"))
    assert not engine_ready()
    server = VllmServer(log_path=tmp_path / "log")
    with pytest.raises(EngineError, match="engine not built") as info:
        server.start()
    assert "\n" not in str(info.value)
    assert not server.running


@pytest.mark.offline
def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


@pytest.mark.offline
def test_env_overrides_win(tmp_path: Path) -> None:
    env = VllmServer(port=1, env={"VLLM_CPU_KVCACHE_SPACE": "5", "X": "y"}, log_path=tmp_path / "l")
    merged = env.environment()
    assert merged["VLLM_CPU_KVCACHE_SPACE"] == "5" and merged["X"] == "y"
    assert merged["HF_HUB_OFFLINE"] == "1"
    assert "VIRTUAL_ENV" not in merged


@pytest.mark.engine
def test_ensure_rebuilds_half_built_model_deterministically_once(engine_built: None, tmp_path: Path) -> None:
    """Two concurrent ensure_engine.sh calls on a half-built model folder: the leftover is removed, one
    caller builds (the other waits on the lock and reuses), and the result is byte-identical to the
    cached model (fixed seeds)."""
    import hashlib
    import subprocess

    from harness.engine import ENSURE_SCRIPT, tiny_model_dir

    target = tmp_path / "model"
    target.mkdir()
    (target / "junk.bin").write_bytes(b"half-built")  # no .ready marker
    env = {**os.environ, "DIAGNOSE_TINY_MODEL": str(target)}
    procs = [
        subprocess.Popen(
            ["bash", str(ENSURE_SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    joined = "\n".join(outputs)
    assert joined.count("removing half-built model") == 1
    assert joined.count("generating tiny model") == 1
    assert joined.count("tiny model ready (cached)") == 1
    assert (target / ".ready").is_file() and not (target / "junk.bin").exists()

    def digest(folder: Path, name: str) -> str:
        return hashlib.sha256((folder / name).read_bytes()).hexdigest()

    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert digest(target, name) == digest(tiny_model_dir(), name), name
