"""Host stacks on the real vLLM CPU server (marker: engine): `diagnose attach --pyspy` with load, and
`--observe` (no requests of ours) while another client carries the traffic."""

from __future__ import annotations

import asyncio
import math
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import pytest

from diagnose.analysis import Window
from diagnose.io.bundle import open_bundle
from diagnose.normalize import host
from harness.engine import VllmServer

pytestmark = pytest.mark.engine
DIAG = [sys.executable, "-m", "diagnose"]


def attach(url: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DIAG, "attach", "--url", url, "--no-nvml", "--pyspy", "-o", str(out), *args],
                          capture_output=True, text=True, timeout=400)


def check_three_processes(bundle: Path) -> dict[str, float]:
    b = open_bundle(bundle)
    st = {s.name: s for s in b.probe_statuses()}["pyspy"]
    assert st.state == "ok", st.reason
    t = host.tables(b)
    roles = set(t["host_processes"]["role"])
    assert {"api_server", "engine_core", "worker"} <= roles
    per_role = t["host_stacks"].groupby("role")["samples"].sum()
    for role in ("api_server", "engine_core", "worker"):
        assert per_role.get(role, 0) > 0, f"no py-spy samples from {role}"
    cats = t["host_stacks"].groupby(["role", "category"])["samples"].sum()
    # EngineCore waits for the worker in shm_broadcast's sched_yield loop: recognised as spin-wait
    assert cats.get(("engine_core", "spin_wait"), 0) > 0
    assert cats.get(("worker", "model_forward"), 0) > 0
    sig = {s.name: s.value for s in host.signals(t, Window(0.0, math.inf))}
    assert sig["host_spin_wait_share_ratio"] > 0
    assert "host_cpu_steal_or_contention_ratio" in sig
    assert st.detail["pyspy_cpu_s"] > 0
    return sig


def test_pyspy_collects_all_engine_processes(vllm_server: VllmServer, tmp_path: Path) -> None:
    p = attach(vllm_server.url, tmp_path / "b", "--concurrency", "4", "--duration", "15s", "--warmup", "1",
               "--baseline", "0")
    assert p.returncode == 0, p.stderr[-2000:]
    check_three_processes(tmp_path / "b")


def _traffic(url: str, stop: threading.Event, done: list[float], errors: list[str]) -> None:
    """Someone else's traffic for the observe capture: 3 streams of completions until ``stop``; each
    completed request's end time goes to ``done``, each failed one's error to ``errors`` (and the stream
    goes on after a pause), so a test can tell 'no traffic' from 'no stacks'."""
    async def go() -> None:
        rng = random.Random(7)
        async with aiohttp.ClientSession() as s:
            async def one() -> None:
                while not stop.is_set():
                    body = {"model": "tiny-llama", "prompt": " ".join(f"w{rng.randrange(10**6)}" for _ in range(80)),
                            "max_tokens": 32, "stream": True, "ignore_eos": True}
                    try:
                        async with s.post(url + "/v1/completions", json=body) as r:
                            r.raise_for_status()
                            async for _ in r.content:
                                pass
                        done.append(time.monotonic())
                    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                        errors.append(f"{type(e).__name__}: {e}")
                        await asyncio.sleep(0.5)
            await asyncio.gather(*(one() for _ in range(3)))
    asyncio.run(go())


def test_observe_mode_sends_nothing_and_still_sees_stacks(vllm_server: VllmServer, tmp_path: Path) -> None:
    stop = threading.Event()
    done: list[float] = []
    errors: list[str] = []
    t = threading.Thread(target=_traffic, args=(vllm_server.url, stop, done, errors), daemon=True)
    t.start()
    time.sleep(2)
    try:
        t0 = time.monotonic()
        p = attach(vllm_server.url, tmp_path / "obs", "--observe", "--duration", "12s")
        t1 = time.monotonic()
    finally:
        stop.set()
        t.join(timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    # the traffic ran through the capture (else no stacks is no fault of the probe)
    assert sum(t0 <= d <= t1 for d in done) >= 3, (len(done), errors[-3:])
    b = open_bundle(tmp_path / "obs")
    assert not b.records("requests")  # observe mode: no requests of ours
    check_three_processes(tmp_path / "obs")
