"""The engine profiler's window: a stretch of the capture left out of the latency and throughput statistics.

While ``attach --profile-iterations`` has the engine's profiler on, the engine is slowed by it (starting the
torch profiler stalls a vLLM CPU engine for seconds, and profiled steps and the trace export are slower), so
requests in flight during the window do not describe the server. The profiler probe records the window in
its status detail (CLOCK_MONOTONIC ns): ``window_start_ns`` (just before ``/start_profile``),
``window_end_ns`` (just before ``/stop_profile``) and ``stop_done_ns`` (when ``/stop_profile`` answered or
gave up). The excluded span is [``window_start_ns``, ``stop_done_ns``] (``window_end_ns`` when the stop time
is missing; the end of the capture when both are). A request overlaps it when it was sent before the span
ended and ended after it began. docs/metrics.md states the rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from diagnose.io.manifest import Manifest


def _num(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
        return float(v)
    return None


def profiler_windows(manifest: Manifest) -> list[tuple[float, float]]:
    """Excluded spans [(start_ns, end_ns)] (CLOCK_MONOTONIC ns) of the profiler window, or [] when none ran.

    Read from the profiler probe's status detail; a bundle without it (older writers) falls back to the
    window stamped on its ``torch_trace`` artifacts. ``end_ns`` is ``inf`` when the capture stopped with the
    profiler still on and no end was recorded.
    """
    detail = manifest.probe_detail("profiler")
    cands: list[tuple[Any, Any, Any]] = [(detail.get("window_start_ns"), detail.get("stop_done_ns"),
                                          detail.get("window_end_ns"))]
    if _num(cands[0][0]) is None:
        cands = [(a.window_start_ns, a.stop_done_ns, a.window_end_ns) for a in manifest.artifacts.values()
                 if a.kind == "torch_trace"]
    out: list[tuple[float, float]] = []
    for first, stop_done, window_end in cands:
        start = _num(first)
        if start is None:
            continue
        ends = [e for e in (_num(stop_done), _num(window_end)) if e is not None]
        end = max(ends) if ends else math.inf
        if end >= start and (start, end) not in out:
            out.append((start, end))
    return sorted(out)


def overlaps(sent: float, end: float, windows: Sequence[tuple[float, float]]) -> bool:
    """Whether a request [sent, end] (same unit as the windows) overlaps any window; a request without an
    end counts from its send time only."""
    if not math.isfinite(sent):
        return False
    stop = end if math.isfinite(end) else sent
    return any(sent <= w_end and stop >= w_start for w_start, w_end in windows)


def excluded_note(n: int, length_s: float | None = None) -> str:
    """The sentence every report table uses for the ``n`` requests left out for overlapping the window."""
    what = f"the profiler window ({length_s:.1f} s)" if length_s is not None else "the profiler window"
    return (f"{n} request{'s' if n != 1 else ''} overlapping {what} excluded from statistics "
            "(the profiler slows the engine)")
