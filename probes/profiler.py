"""Trigger the engine's own profiler for a bounded window and collect its trace files into the bundle.

vLLM (server started with ``--profiler-config '{"profiler": "torch", "torch_profiler_dir": DIR}'``):
``POST /start_profile {"max_iterations": N, "profile_prefix": P}``, then ``POST /stop_profile``. The worker
stops itself after N engine steps; ``/stop_profile`` also ends the frontend (API server) trace and clears the
session. SGLang: ``POST /start_profile {"num_steps": N, "output_dir": DIR, "profile_prefix": P}`` (auto-stops
after N steps), then ``/stop_profile`` (an error there after an auto-stop is only noted).

The window starts ``start_after_s`` into the capture (past warm-up), ends when the first new trace file
appears, ``window_s`` passes or the capture stops, whichever is first. Every HTTP call has a timeout
(a slow ``/stop_profile`` is recorded, never waited for beyond ``stop_timeout_s``), so the capture cannot
hang on the profiler. Files whose name starts with this capture's prefix (or, failing that, that appeared
after the start) are copied into ``artifacts/profiler/`` as kind ``torch_trace`` once their size is stable.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from diagnose.errors import InputError
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Options, ProbeOption, ProbeSetup, ProbeSpec

TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz", ".trace.json", ".trace.json.gz")
TABLE_SUFFIX = ".profiler_out.txt"
_RANK = re.compile(r"(?:rank|TP-)(\d+)")


def classify(name: str) -> tuple[str, int | None]:
    """(role, rank) of a profiler output file from its name."""
    if "async_llm" in name:
        return "frontend", None
    m = _RANK.search(name)
    return "worker", int(m.group(1)) if m else None


def _is_trace(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)


class ProfilerProbe:
    """Probe "profiler": start/stop the engine profiler around a short window, collect the traces."""

    name = "profiler"

    def __init__(self, profiler_dir: str | Path | None, *, iterations: int = 32, start_after_s: float = 2.0,
                 window_s: float = 10.0, start_timeout_s: float = 20.0, stop_timeout_s: float = 35.0,
                 settle_s: float = 5.0, engine: str | None = None, max_bytes: int = 2 * 1024**3) -> None:
        if iterations < 1:
            raise ValueError("profile iterations must be at least 1")
        self.profiler_dir = Path(profiler_dir).expanduser() if profiler_dir is not None else None
        self.iterations = iterations
        self.start_after_s = start_after_s
        self.window_s = window_s
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.settle_s = settle_s
        self.engine = engine
        self.max_bytes = max_bytes

    def available(self, ctx: CaptureContext) -> tuple[bool, str]:
        if self.profiler_dir is None:
            return False, ("no profiler directory given: pass --profiler-dir, the torch_profiler_dir the server "
                           "was started with (vLLM --profiler-config)")
        if self.profiler_dir.exists() and not self.profiler_dir.is_dir():
            return False, f"profiler directory {self.profiler_dir} is not a directory"
        return True, ""

    def _engine(self, ctx: CaptureContext) -> str:
        return (self.engine or ctx.target.engine or "vllm").lower()

    def _start_body(self, engine: str, prefix: str) -> dict[str, str | int]:
        if engine == "sglang":
            return {"num_steps": self.iterations, "output_dir": str(self.profiler_dir), "profile_prefix": prefix}
        return {"max_iterations": self.iterations, "profile_prefix": prefix}

    async def run(self, ctx: CaptureContext) -> ProbeStatus:
        ok, why = self.available(ctx)
        if not ok:
            return ProbeStatus(self.name, "unavailable", why)
        assert self.profiler_dir is not None
        engine = self._engine(ctx)
        prefix = f"diagnose-{ctx.bundle.anchor_unix_ns // 1_000_000}"
        detail: dict[str, Any] = {"engine": engine, "iterations": self.iterations, "prefix": prefix,
                                  "profiler_dir": str(self.profiler_dir)}
        try:
            await asyncio.wait_for(ctx.stop.wait(), self.start_after_s)
            return ProbeStatus(self.name, "skipped",
                               f"the capture ended before the profile window ({self.start_after_s:g} s in)", detail)
        except asyncio.TimeoutError:
            pass
        before = await asyncio.to_thread(_snapshot, self.profiler_dir)
        notes: list[str] = []
        async with aiohttp.ClientSession(headers=ctx.target.headers()) as session:
            t0 = time.monotonic_ns()
            code, text, err = await _post(session, ctx.target.endpoint("/start_profile"),
                                          self._start_body(engine, prefix), self.start_timeout_s)
            detail["start_ms"] = round((time.monotonic_ns() - t0) / 1e6, 1)
            if code == 404:
                return ProbeStatus(self.name, "unavailable", (
                    "the server has no /start_profile (404): start it with --profiler-config "
                    "'{\"profiler\": \"torch\", \"torch_profiler_dir\": \"" + str(self.profiler_dir) + "\"}' "
                    "(SGLang: profiling endpoints are always on)"), detail)
            if err is not None or code is None or code >= 300:
                what = err or f"HTTP {code}: {text[:200]}"
                return ProbeStatus(self.name, "failed", f"/start_profile failed: {what}", detail)
            detail["window_start_ns"] = t0
            await self._wait_window(ctx, before, prefix)
            t1 = time.monotonic_ns()
            detail["window_end_ns"] = t1
            code, text, err = await _post(session, ctx.target.endpoint("/stop_profile"), {}, self.stop_timeout_s)
            t2 = time.monotonic_ns()
            detail["stop_done_ns"] = t2  # the engine may be slowed until here (the frontend trace is written)
            detail["stop_ms"] = round((t2 - t1) / 1e6, 1)
            if err is not None:
                notes.append(f"/stop_profile: {err}")
            elif code is not None and code >= 300:
                notes.append(f"/stop_profile answered HTTP {code}: {text[:120]}"
                             + (" (after the engine's own auto-stop)" if engine == "sglang" else ""))
        files = await self._collect(ctx, before, prefix, detail)
        if not files:
            notes.insert(0, f"no new trace file appeared in {self.profiler_dir} (is it the directory the server "
                            "writes to, on this machine?)")
            return ProbeStatus(self.name, "failed", "; ".join(notes), detail)
        return ProbeStatus(self.name, "ok", "; ".join(notes), detail)

    async def _wait_window(self, ctx: CaptureContext, before: dict[str, int], prefix: str) -> None:
        """Until a new trace file shows up (the engine auto-stopped), window_s passes, or the capture stops."""
        assert self.profiler_dir is not None
        deadline = time.monotonic() + self.window_s
        while time.monotonic() < deadline and not ctx.stop.is_set():
            new = _new_files(await asyncio.to_thread(_snapshot, self.profiler_dir), before, prefix)
            if any(_is_trace(n) and classify(n)[0] == "worker" for n in new):
                return
            try:
                await asyncio.wait_for(ctx.stop.wait(), min(0.5, max(0.0, deadline - time.monotonic())))
            except asyncio.TimeoutError:
                pass

    async def _collect(self, ctx: CaptureContext, before: dict[str, int], prefix: str,
                       detail: dict[str, Any]) -> list[str]:
        """Copy the new, size-stable files into the bundle; wait up to settle_s for them to finish."""
        assert self.profiler_dir is not None
        deadline = time.monotonic() + self.settle_s
        last: dict[str, int] = {}
        stable: dict[str, int] = {}
        while True:
            snap = await asyncio.to_thread(_snapshot, self.profiler_dir)
            new = {n: snap[n] for n in _new_files(snap, before, prefix)}
            stable = {n: s for n, s in new.items() if last.get(n) == s and s > 0}
            if new and len(stable) == len(new) and any(_is_trace(n) for n in new):
                break
            if time.monotonic() >= deadline:
                break
            last = new
            await asyncio.sleep(0.5)
        unstable = sorted(set(last) - set(stable))
        if unstable:
            detail["still_being_written"] = unstable
        copied: list[str] = []
        total = 0
        (ctx.bundle.path / "artifacts" / "profiler").mkdir(parents=True, exist_ok=True)
        for name in sorted(stable):
            if total + stable[name] > self.max_bytes:
                detail.setdefault("skipped_over_size", []).append(name)
                continue
            dest = f"profiler/{name}"
            await asyncio.to_thread(shutil.copyfile, self.profiler_dir / name, ctx.bundle.artifact_path(dest))
            total += stable[name]
            role, rank = classify(name)
            kind = "torch_trace" if _is_trace(name) else "torch_profiler_table"
            ctx.bundle.add_artifact(dest, kind, f"{self._engine(ctx)} profiler output ({role})", role=role,
                                    rank=rank, engine=self._engine(ctx), source_file=name,
                                    window_start_ns=detail.get("window_start_ns"),
                                    window_end_ns=detail.get("window_end_ns"),
                                    stop_done_ns=detail.get("stop_done_ns"), iterations=self.iterations)
            if kind == "torch_trace":
                copied.append(dest)
        detail["files"] = copied
        detail["bytes"] = total
        return copied


def _snapshot(d: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for p in d.iterdir():
            try:
                if p.is_file():
                    out[p.name] = p.stat().st_size
            except OSError:
                continue
    except OSError:
        pass
    return out


def _new_files(snap: dict[str, int], before: dict[str, int], prefix: str) -> list[str]:
    """Files of this capture: named with our prefix, else any that appeared since the start."""
    mine = [n for n in snap if n.startswith(prefix)]
    if mine:
        return mine
    return [n for n in snap if n not in before and (_is_trace(n) or n.endswith(TABLE_SUFFIX))]


async def _post(session: aiohttp.ClientSession, url: str, body: Mapping[str, object], timeout_s: float
                ) -> tuple[int | None, str, str | None]:
    """(status, text, error) of one POST; never raises for network trouble or timeouts."""
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            return r.status, (await r.text())[:500], None
    except asyncio.TimeoutError:
        return None, "", f"no answer within {timeout_s:g} s (the engine may still write the trace)"
    except aiohttp.ClientConnectorError as e:
        return None, "", f"cannot connect to {url} ({e.os_error or e}); did the engine exit?"
    except aiohttp.ClientError as e:
        return None, "", f"{type(e).__name__}: {e}"


# -- attach options -------------------------------------------------------------------------------------
def _build(o: Options, setup: ProbeSetup) -> ProfilerProbe:
    if o["profile_iterations"] < 1:
        raise InputError(f"--profile-iterations {o['profile_iterations']}: must be at least 1")
    if not o["profiler_dir"]:
        raise InputError("--profile-iterations needs --profiler-dir (the engine's torch_profiler_dir)")
    return ProfilerProbe(iterations=o["profile_iterations"], profiler_dir=o["profiler_dir"])


SPEC = ProbeSpec(
    name="profiler", title="Engine profiler (torch.profiler traces)",
    enabled=lambda o: bool(o["profile_iterations"]), build=_build,
    options=(
        ProbeOption("--profile-iterations", type=int,
                    help="Trigger the engine's profiler for this many engine steps."),
        ProbeOption("--profiler-dir", type=Path, help="The engine's profiler output directory."),
    ),
)
