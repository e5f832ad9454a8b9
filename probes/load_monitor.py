"""The load client's self-check (event-loop lag, CPU, in-flight) and its live progress line.

Self-check: a timer that asks to wake every 10 ms; how late it wakes is the event-loop lag (the time any
chunk that arrived meanwhile waited before it could be stamped). Each ``client_health`` record (every
``TICK_S``) keeps the worst lag of its ten wakes, so a stall of a few ms is not missed between samples. CPU is
this process's CPU time over wall time, in percent of one core.

Progress: one line (rich) on stderr, refreshed twice a second from the event loop itself (no extra
thread), shown only when stderr is a terminal unless forced.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rich.text import Text

TICK_S = 0.1
SUBTICKS = 10  # the loop-lag timer wakes every 10 ms; each 0.1 s record keeps the worst lag of its 10 wakes


class RunningStats:
    """Counters and recent latencies the progress line shows."""

    def __init__(self) -> None:
        self.done = 0
        self.errors = 0
        self.in_flight = 0
        self.ttft_ms: deque[float] = deque(maxlen=512)
        self.itl_ms: deque[float] = deque(maxlen=512)
        self.phase_label = ""
        self.phase_end_s: float | None = None  # monotonic seconds when the current phase stops issuing
        self.started_s = time.monotonic()

    def line(self) -> str:
        now = time.monotonic()
        el = now - self.started_s
        rem = "" if self.phase_end_s is None else f" left {max(0.0, self.phase_end_s - now):4.0f}s"
        ttft = f"{statistics.median(self.ttft_ms):.1f}" if self.ttft_ms else "-"
        itl = f"{statistics.median(self.itl_ms):.2f}" if self.itl_ms else "-"
        return (f"{self.phase_label} {el:5.0f}s{rem} | done {self.done} in-flight {self.in_flight} | "
                f"TTFT p50 {ttft} ms ITL p50 {itl} ms | errors {self.errors}")


class Monitor:
    """Runs the health ticks (and the progress line) until stopped; ``on_tick`` lets the caller flush."""

    def __init__(self, stats: RunningStats, in_flight: Callable[[], int], write: Callable[[dict[str, Any]], None],
                 on_tick: Callable[[], None], progress: bool | None) -> None:
        self.stats = stats
        self.in_flight = in_flight
        self.write = write
        self.on_tick = on_tick
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.lag_ms: list[float] = []
        self.cpu_percent: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        live = None
        if self.progress:
            from rich.console import Console
            from rich.live import Live

            live = Live(Text(""), console=Console(stderr=True), auto_refresh=False, transient=False)
            live.start()
        wall0, cpu0 = time.monotonic_ns(), time.process_time_ns()
        try:
            n = 0
            sub_ns = int(TICK_S / SUBTICKS * 1e9)
            while True:
                lag = 0.0
                for _ in range(SUBTICKS):  # short stalls hit bursts of chunks: sample often, keep the worst
                    due = time.monotonic_ns() + sub_ns
                    await asyncio.sleep(sub_ns / 1e9)
                    lag = max(lag, (time.monotonic_ns() - due) / 1e6)
                t = time.monotonic_ns()
                cpu = time.process_time_ns()
                pct = 100.0 * (cpu - cpu0) / max(1, t - wall0)
                wall0, cpu0 = t, cpu
                self.lag_ms.append(lag)
                self.cpu_percent.append(pct)
                inflight = self.in_flight()
                self.stats.in_flight = inflight
                self.write({"t_ns": t, "loop_lag_ms": round(lag, 3), "in_flight": inflight,
                            "cpu_percent": round(pct, 1)})
                self.on_tick()
                n += 1
                if live is not None and n % 5 == 0:
                    live.update(Text(self.stats.line()), refresh=True)
        finally:
            # a last sample (CPU since the last tick; no lag measured) so even a short run has one
            t = time.monotonic_ns()
            pct = 100.0 * (time.process_time_ns() - cpu0) / max(1, t - wall0)
            self.write({"t_ns": t, "loop_lag_ms": None, "in_flight": self.in_flight(), "cpu_percent": round(pct, 1)})
            if live is not None:
                live.update(Text(self.stats.line()), refresh=True)
                live.stop()
