"""The cold-start check (``--launch`` only): process start, healthy, first token; cold requests against warm ones.

diagnose starts the server command itself (in its own process group, every process tagged, stopped as
``diagnose experiment`` stops its servers: :class:`diagnose.runs.experiment.Launched`) and times:

* ``healthy_s``: from the process start to the first ``GET /health`` answering 200 (polled every
  ``POLL_S``; a server without ``/health``, 404, is healthy when ``/v1/models`` answers 200);
* ``first_token_s``: from the process start to the first token of the first request, sent as soon as the
  server is healthy;
* ``cold_ttft_ms``: the first ``cold`` requests' TTFTs, one at a time (the first one included): what the first
  users of a fresh replica see (kernel compilation, CUDA graph capture, allocator and cache warm-up);
* ``warm_ttft_ms``: the TTFTs of ``warm`` requests sent one at a time after ``warmup`` more (not measured).

Cold and warm are reported apart (the method: "cold and warm apart"); the card judges the first request's TTFT
against the warm median and, when an SLO on TTFT is given, against it.
"""

from __future__ import annotations

import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Required, TypedDict

from diagnose.probes.sse import StreamResult
from diagnose.readiness.target import Target, failure, ttft_ms
from diagnose.runs.experiment import Launched, LaunchError, _tail, spawn

POLL_S = 0.05


@dataclass(frozen=True)
class ColdPlan:
    cold: int = 4
    warmup: int = 8
    warm: int = 8
    max_tokens: int = 16
    startup_timeout_s: float = 600.0
    time_limit_s: float = 120.0  # for all the requests after healthy: the rest are not sent past it


def _ok(url: str) -> int | None:
    """The status of a GET (None: nothing answered)."""
    try:
        with urllib.request.urlopen(url, timeout=2.0) as r:  # noqa: S310 - the user's URL
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def start(argv: Sequence[str], url: str, log_path: Path, timeout_s: float,
          log: Callable[[str], None] = lambda _m: None) -> tuple[Launched, float]:
    """Start the server command; return it and the seconds from its start to healthy. A :class:`LaunchError`
    (exit 3, one line with its log's tail) when it exits or is not healthy within ``timeout_s``."""
    t0 = time.monotonic()
    server = spawn(argv, log_path, log)
    proc = server.proc
    deadline = t0 + timeout_s
    health = True
    while True:
        if proc.poll() is not None:
            server.stop()
            raise LaunchError(f"the server command exited with status {proc.returncode} before it was healthy "
                              f"(log {log_path}: {_tail(log_path)})")
        status = _ok(f"{url}/health") if health else None
        if status == 404:
            health = False
        if status == 200 or (not health and _ok(f"{url}/v1/models") == 200):
            return server, time.monotonic() - t0
        if time.monotonic() > deadline:
            server.stop()
            raise LaunchError(f"the server at {url} was not healthy within {timeout_s:.0f} s "
                              f"(log {log_path}: {_tail(log_path)})")
        time.sleep(POLL_S)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


class ColdStart(TypedDict, total=False):
    """The cold-start check's measurements (readiness.json ``measurements.cold_start``): times in seconds from
    the process's start, TTFTs in ms; ``failed``: the first five failures' categories."""

    healthy_s: Required[float]
    stopped: str
    first_request_failed: str
    first_token_s: float
    cold_ttft_ms: list[float]
    warm_ttft_ms: list[float]
    cold_ttft_p50_ms: float | None
    warm_ttft_p50_ms: float | None
    first_ttft_ms: float | None
    first_vs_warm_ratio: float | None
    cold_vs_warm_ratio: float | None
    failed: list[str]
    failed_count: int


async def measure(target: Target, plan: ColdPlan, since_start_s: float, t_healthy: float) -> ColdStart:
    """The requests after healthy (``t_healthy``: the monotonic time it was seen healthy, ``since_start_s``
    seconds after the process started)."""
    out: ColdStart = {"healthy_s": round(since_start_s, 4)}
    cold: list[float] = []
    warm: list[float] = []
    failed: list[str] = []
    # one phase of the bundle; each request tagged cold (timed), warmup (not timed) or warm (timed)
    with target.recorder.phase("cold start", "cold-start", concurrency=1, healthy_s=out["healthy_s"]):
        deadline = time.monotonic() + plan.time_limit_s
        for i in range(plan.cold + plan.warmup + plan.warm):
            if time.monotonic() > deadline:
                out["stopped"] = f"after {i} requests: the {plan.time_limit_s:g} s limit passed"
                break
            res = StreamResult()
            part = "cold" if i < plan.cold else "warmup" if i < plan.cold + plan.warmup else "warm"
            await target.stream(f"Cold start request {i}: tell me about the sea.", plan.max_tokens, res,
                                tags={"part": part})
            t = ttft_ms(res)
            if t is None:
                failed.append(failure(res))
                if i == 0:
                    out["first_request_failed"] = failure(res)
                continue
            if i == 0:
                out["first_token_s"] = round(since_start_s + (res.t_ns[0] / 1e9 - t_healthy), 4)
            if i < plan.cold:
                cold.append(t)
            elif i >= plan.cold + plan.warmup:
                warm.append(t)
    out["cold_ttft_ms"] = [round(x, 3) for x in cold]
    out["warm_ttft_ms"] = [round(x, 3) for x in warm]
    out["cold_ttft_p50_ms"] = _median(cold)
    out["warm_ttft_p50_ms"] = _median(warm)
    out["first_ttft_ms"] = cold[0] if cold and "first_request_failed" not in out else None
    w = out["warm_ttft_p50_ms"]
    out["first_vs_warm_ratio"] = out["first_ttft_ms"] / w if out["first_ttft_ms"] is not None and w else None
    out["cold_vs_warm_ratio"] = out["cold_ttft_p50_ms"] / w if out["cold_ttft_p50_ms"] is not None and w else None
    out["failed"] = failed[:5]
    out["failed_count"] = len(failed)
    return out
