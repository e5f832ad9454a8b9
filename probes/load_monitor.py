"""The load client's self-check (event-loop lag, CPU, in-flight) and its live progress line.

Self-check: a timer that asks to wake every 10 ms; how late it wakes is the event-loop lag (the time any
chunk that arrived meanwhile waited before it could be stamped). Each ``client_health`` record (every
``TICK_S``) keeps the worst lag of its ten wakes, so a stall of a few ms is not missed between samples. CPU is
this process's CPU time over wall time, in percent of one core.

Stall causes (docs/metrics.md, ``client_health``): the same record says what held the loop where that is
known. :class:`GcWatch` times every garbage collection through ``gc.callbacks`` (the longest pause of the
0.1 s and its generation), the load probe notes its own on-loop work (record serialisation: the longest
slice and how many records; end-of-phase bookkeeping) with :meth:`Monitor.note`, and a lag above
``STALL_MS`` is given a ``stall_cause``: the noted work that can explain it (``gc_gen<N>``, ``flush``,
``phase_end``); else where the loop's thread was during it. A timer that is due wakes an idle loop on time,
so the part of a stall the thread did not run was not idle time: the thread's CPU time over the 10 ms
interval that ended with the late wake bounds it from below (``off_cpu_ms`` = lag minus that CPU time).
When at least half the lag was off the CPU, the cause says why where the kernel tells: ``preempted`` (the
thread waited on the run queue behind another task, over that same interval, for at least half that time:
/proc/thread-self/schedstat), ``page_fault`` (the process took a major page fault in that interval: a page
of code or data read back from disk, during which the faulting thread sleeps, holding the GIL if it is
Python's), ``steal`` (the hypervisor ran something else on the client's virtual CPUs in the sample:
/proc/stat steal, in 10 ms ticks), else ``off_cpu``
(blocked in a system call or on the GIL, interrupt work, or a virtual CPU the host did not run while it was
idle: its timer fired late and no steal was counted, benchmarks/results/client_stall.md); when less, ``busy`` (the thread ran through
it: callbacks, the client's or another probe's, and the reads the loop made). Before, a stall was ``busy``
whenever the thread's CPU time over the whole 0.1 s sample reached the lag, which a client at 60% of a core
always does: a stall of 8.4 ms in whose 18 ms interval the thread ran 3.6 ms was called ``busy`` (issue 18).

Progress: one line (rich) on stderr, refreshed twice a second from the event loop itself (no extra
thread), shown only when stderr is a terminal unless forced.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import resource
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from rich.text import Text

TICK_S = 0.1
SUBTICKS = 10  # the loop-lag timer wakes every 10 ms; each 0.1 s record keeps the worst lag of its 10 wakes
STALL_MS = 5.0  # a loop lag above this gets a stall_cause in its health record


class GcSummary(TypedDict):
    """Collections and the longest pause (ms) per generation over the run."""

    collections: list[int]
    max_pause_ms: list[float]


class StallSummary(TypedDict):
    """The load probe status's ``client_stalls``: stalls by cause, the worst lag, the collector's totals."""

    stalls_over_ms: float
    stalls: int
    stall_causes: dict[str, int]
    max_loop_lag_ms: float | None
    gc: GcSummary


class StallFields(TypedDict):
    """A ``client_health`` sample's cause fields (docs/metrics.md): what the loop did during its worst wake."""

    gc_pause_ms: float
    gc_generation: int | None
    gc_collections: int
    flush_max_ms: float
    flush_records: int
    off_cpu_ms: float
    run_wait_ms: float | None
    steal_ms: float | None
    major_faults: int
    stall_cause: str | None


class GcWatch:
    """Times the collector's pauses (``gc.callbacks``); :meth:`take` returns the worst of the interval.

    Runs on whichever thread collects (the GIL is held throughout a collection, so the pause is the loop's
    too); the callback itself is two clock reads."""

    def __init__(self) -> None:
        self._t0 = 0
        self.max_ms = 0.0
        self.max_gen: int | None = None
        self.total_ms = 0.0
        self.count = 0
        self.by_gen = [0, 0, 0]  # collections per generation over the whole run
        self.worst_ms = [0.0, 0.0, 0.0]  # longest pause per generation over the whole run

    def _cb(self, phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
            return
        ms = (time.perf_counter_ns() - self._t0) / 1e6
        gen = int(info.get("generation", 0))
        self.total_ms += ms
        self.count += 1
        if 0 <= gen < 3:
            self.by_gen[gen] += 1
            self.worst_ms[gen] = max(self.worst_ms[gen], ms)
        if ms >= self.max_ms:
            self.max_ms, self.max_gen = ms, gen

    def start(self) -> None:
        if self._cb not in gc.callbacks:
            gc.callbacks.append(self._cb)

    def stop(self) -> None:
        if self._cb in gc.callbacks:
            gc.callbacks.remove(self._cb)

    def take(self) -> tuple[float, int | None, float, int]:
        """(longest pause ms, its generation, total ms, collections) since the last call; resets them."""
        out = (self.max_ms, self.max_gen, self.total_ms, self.count)
        self.max_ms, self.max_gen, self.total_ms, self.count = 0.0, None, 0.0, 0
        return out

    def summary(self) -> GcSummary:
        return {"collections": list(self.by_gen), "max_pause_ms": [round(x, 3) for x in self.worst_ms]}


class HostClock:
    """Where the loop's thread was, from the kernel's counters. :meth:`thread` gives its CPU time and its
    run-queue wait so far (ns; the wait from ``/proc/thread-self/schedstat``, read in a µs; elsewhere than
    Linux the CPU time alone); :meth:`steal_ms` the steal time of the CPUs it may run on since the last call
    (``/proc/stat``, in clock ticks of 10 ms: coarse, so a sample with steal says only that the hypervisor
    took those CPUs at some point of it; None where the kernel does not say). Opened on the loop's thread
    (``thread-self`` is the opener's)."""

    def __init__(self) -> None:
        self._sched: Any = None
        self._stat: Any = None
        self._tick_ms = 10.0
        try:
            self._sched = open("/proc/thread-self/schedstat", "rb", buffering=0)  # noqa: SIM115 - kept open
            self._stat = open("/proc/stat", "rb", buffering=0)  # noqa: SIM115 - kept open, read each tick
            self._tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            self.close()
        self._steal = self._read_steal()

    def thread(self) -> tuple[int, int | None, int]:
        """(CPU time ns, run-queue wait ns or None) of the calling thread (the opener) so far, and the
        process's major page faults (a page read from disk: the faulting thread sleeps on the read). The CPU
        time is the clock's (schedstat's own lags by up to a scheduler tick while the thread runs)."""
        cpu = time.thread_time_ns()
        majflt = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        if self._sched is not None:
            try:
                self._sched.seek(0)
                return cpu, int(self._sched.read().split()[1]), majflt
            except (OSError, ValueError, IndexError):
                self._sched = None
        return cpu, None, majflt

    def _read_steal(self) -> int | None:
        if self._stat is None:
            return None
        try:
            self._stat.seek(0)
            cpus = {f"cpu{c}".encode() for c in os.sched_getaffinity(0)}
            steal = 0
            for line in self._stat.read().split(b"\n"):
                f = line.split()
                if f and f[0] in cpus and len(f) > 8:
                    steal += int(f[8])
            return steal
        except (OSError, ValueError):
            return None

    def steal_ms(self) -> float | None:
        now = self._read_steal()
        before, self._steal = self._steal, now
        return (now - before) * self._tick_ms if now is not None and before is not None else None

    def close(self) -> None:
        for f in (self._sched, self._stat):
            if f is not None:
                f.close()
        self._sched = self._stat = None


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

    def __init__(self, stats: RunningStats, in_flight: Callable[[], int], write: Callable[[Mapping[str, object]], None],
                 on_tick: Callable[[], None], progress: bool | None) -> None:
        self.stats = stats
        self.in_flight = in_flight
        self.write = write
        self.on_tick = on_tick
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.lag_ms: list[float] = []
        self.cpu_percent: list[float] = []
        self.gc = GcWatch()
        self.stalls = 0  # samples with a lag above STALL_MS
        self.stall_causes: dict[str, int] = {}
        self._notes: dict[str, tuple[float, int]] = {}  # cause -> (longest ms, its size) this tick
        self._task: asyncio.Task[None] | None = None

    def note(self, cause: str, ms: float, size: int = 0) -> None:
        """On-loop work the caller did (``flush``: serialising ``size`` records; ``phase_end``): kept per tick
        so a stall can be attributed to it."""
        old = self._notes.get(cause)
        if old is None or ms > old[0]:
            self._notes[cause] = (ms, size)

    def start(self) -> None:
        self.gc.start()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self.gc.stop()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def _causes(self, lag: float, wake_cpu_ms: float = math.inf, run_wait_ms: float | None = None,
                steal_ms: float | None = None, major_faults: int = 0) -> StallFields:
        """The health record's cause fields for this tick (and resets the tick's notes). ``wake_cpu_ms``: the
        loop thread's CPU time over the 10 ms interval that ended with the sample's worst wake;
        ``run_wait_ms`` / ``major_faults``: the thread's run-queue wait and the process's major page faults
        over that same interval; ``steal_ms``: its CPUs' steal over the sample (:class:`HostClock`)."""
        gc_ms, gc_gen, _gc_total, gc_n = self.gc.take()
        flush_ms, flush_n = self._notes.get("flush", (0.0, 0))
        off_ms = max(0.0, lag - wake_cpu_ms)  # at least this much of the stall the thread did not run
        out: StallFields = {"gc_pause_ms": round(gc_ms, 3), "gc_generation": gc_gen,
                               "gc_collections": gc_n, "flush_max_ms": round(flush_ms, 3), "flush_records": flush_n,
                               "off_cpu_ms": round(off_ms, 3),
                               "run_wait_ms": None if run_wait_ms is None else round(run_wait_ms, 3),
                               "steal_ms": None if steal_ms is None else round(steal_ms, 1),
                               "major_faults": major_faults, "stall_cause": None}
        if lag > STALL_MS:
            # the longest noted pause, if it explains at least half of the lag (a timer due during a pause
            # of P ms wakes up to P ms late)
            cands = [(gc_ms, f"gc_gen{gc_gen}")] if gc_gen is not None else []
            cands += [(ms, cause) for cause, (ms, _n) in self._notes.items()]
            best = max(cands) if cands else (0.0, "unknown")
            cause = best[1] if best[0] >= 0.5 * lag else "unknown"
            if cause == "unknown":
                # none of the noted work: did the thread run through the stall, or was it off the CPU for at
                # least half of it (and then: taken by the hypervisor, waiting behind another task, or else)?
                if off_ms < 0.5 * lag:
                    cause = "busy"
                elif run_wait_ms is not None and run_wait_ms >= 0.5 * off_ms:  # ns-exact: asked first
                    cause = "preempted"
                elif major_faults:
                    cause = "page_fault"
                elif steal_ms:
                    cause = "steal"
                else:
                    cause = "off_cpu"
            out["stall_cause"] = cause
            self.stalls += 1
            self.stall_causes[cause] = self.stall_causes.get(cause, 0) + 1
        self._notes.clear()
        return out

    def summary(self) -> StallSummary:
        """Run totals for the probe status: stalls by cause, collections and worst pause per generation."""
        return {"stalls_over_ms": STALL_MS, "stalls": self.stalls, "stall_causes": dict(self.stall_causes),
                "max_loop_lag_ms": round(max(self.lag_ms), 3) if self.lag_ms else None, "gc": self.gc.summary()}

    async def _run(self) -> None:
        live = None
        if self.progress:
            from rich.console import Console
            from rich.live import Live

            live = Live(Text(""), console=Console(stderr=True), auto_refresh=False, transient=False)
            live.start()
        wall0, cpu0 = time.monotonic_ns(), time.process_time_ns()
        host = HostClock()  # on the loop's thread: its schedstat is this thread's
        wake_cpu, wake_wait, wake_flt = host.thread()  # this (the loop's) thread, as of its last wake
        try:
            n = 0
            sub_ns = int(TICK_S / SUBTICKS * 1e9)
            while True:
                tick_cpu = wake_cpu
                lag = 0.0
                lag_cpu_ms, lag_wait_ms, lag_flt = math.inf, None, 0
                for _ in range(SUBTICKS):  # short stalls hit bursts of chunks: sample often, keep the worst
                    due = time.monotonic_ns() + sub_ns
                    await asyncio.sleep(sub_ns / 1e9)
                    woke = time.monotonic_ns()
                    c, w, f = host.thread()
                    if (woke - due) / 1e6 > lag:  # the worst wake: the thread's CPU time, wait, faults up to it
                        lag, lag_cpu_ms, lag_flt = (woke - due) / 1e6, (c - wake_cpu) / 1e6, f - wake_flt
                        lag_wait_ms = (w - wake_wait) / 1e6 if w is not None and wake_wait is not None else None
                    wake_cpu, wake_wait, wake_flt = c, w, f
                t = time.monotonic_ns()
                cpu = time.process_time_ns()
                pct = 100.0 * (cpu - cpu0) / max(1, t - wall0)
                wall0, cpu0 = t, cpu
                self.lag_ms.append(lag)
                self.cpu_percent.append(pct)
                inflight = self.in_flight()
                self.stats.in_flight = inflight
                loop_cpu_ms = (wake_cpu - tick_cpu) / 1e6  # the sample's ten wakes, end to end
                self.write({"t_ns": t, "loop_lag_ms": round(lag, 3), "in_flight": inflight,
                            "cpu_percent": round(pct, 1), "loop_cpu_ms": round(loop_cpu_ms, 3),
                            **self._causes(lag, lag_cpu_ms, lag_wait_ms, host.steal_ms(), lag_flt)})
                self.on_tick()
                n += 1
                if live is not None and n % 5 == 0:
                    live.update(Text(self.stats.line()), refresh=True)
        finally:
            host.close()
            # a last sample (CPU since the last tick; no lag measured) so even a short run has one
            t = time.monotonic_ns()
            pct = 100.0 * (time.process_time_ns() - cpu0) / max(1, t - wall0)
            self.write({"t_ns": t, "loop_lag_ms": None, "in_flight": self.in_flight(), "cpu_percent": round(pct, 1)})
            if live is not None:
                live.update(Text(self.stats.line()), refresh=True)
                live.stop()
