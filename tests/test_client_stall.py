"""Issue 18: the load client's event loop must not stall, and a stall it sees is recorded with its cause.

Mechanism, not speed (benchmarks/client_stall.py measures loop lag over 5-minute captures): nothing on the
loop thread writes to a stream file during a capture (a write() that the kernel throttles blocked the loop
for hundreds of ms), automatic full collections are off while requests stream and run at phase boundaries
instead, the health stream names a GC pause as the cause of the stall it made, and the analysis leaves out
the requests one short stall touched instead of declaring the whole run client-bound.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from diagnose.analysis import Window
from diagnose.capture.workload import WorkloadSpec, build_phases
from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter, StreamWriter
from diagnose.model import ProbeStatus
from diagnose.normalize import client as norm
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.load import LoadProbe
from diagnose.reports.sections.client import sections as client_sections
from diagnose.rules.engine import evaluate
from diagnose.rules.spec import load_rules, load_thresholds
from tests.load_testserver import TestServer


def _spec(concurrency: str = "4", duration_s: float | None = 1.5, **kw: Any) -> WorkloadSpec:
    mode, phases = build_phases(concurrency, None)
    base: dict[str, Any] = {"duration_s": duration_s, "num_requests": None, "input_tokens": 16,
                            "output_tokens": 8, "warmup_requests": 0}
    base.update(kw)
    return WorkloadSpec(mode=mode, phases=phases, **base)


async def _run(spec: WorkloadSpec, out: Path, during: Any = None) -> ProbeStatus:
    srv = TestServer(itl_s=0.005)
    url = await srv.start()
    bw = BundleWriter(out)
    ctx = CaptureContext(bundle=bw, target=Target(url=url), stop=asyncio.Event())
    try:
        task = asyncio.ensure_future(LoadProbe(spec, progress=False).run(ctx))
        if during is not None:
            await during()
        status = await task
    finally:
        await srv.stop()
    bw.set_probe_status(status)
    bw.finish()
    return status


def test_no_stream_write_on_the_event_loop_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record of the capture (health samples and phase records included) reaches its file from the I/O
    thread: a write() blocked by the kernel (dirty-page throttling, a journal commit) stalls only that thread."""
    writes: list[tuple[str, int]] = []
    orig_write, orig_ser = StreamWriter.write, StreamWriter.write_serialized

    def write(self: StreamWriter, record: dict[str, Any]) -> None:
        writes.append((self.path.stem, threading.get_ident()))
        orig_write(self, record)

    def write_serialized(self: StreamWriter, data: bytes, n: int) -> None:
        writes.append((self.path.stem, threading.get_ident()))
        orig_ser(self, data, n)

    monkeypatch.setattr(StreamWriter, "write", write)
    monkeypatch.setattr(StreamWriter, "write_serialized", write_serialized)
    loop_thread = threading.get_ident()  # asyncio.run runs the loop on this thread
    status = asyncio.run(_run(_spec("4", None, num_requests=12), tmp_path / "b"))
    assert status.state == "ok"
    streams = {s for s, _ in writes}
    assert {"requests", "chunks", "phases", "client_health"} <= streams
    on_loop = sorted({s for s, t in writes if t == loop_thread})
    assert on_loop == [], f"written from the event-loop thread: {on_loop}"
    b = open_bundle(tmp_path / "b")
    assert len(b.records("requests")) == 12 and len(b.records("phases")) == 1  # and nothing was lost


def test_full_gc_deferred_during_capture_and_recorded_as_stall_cause(tmp_path: Path) -> None:
    """While requests stream the oldest generation never collects by itself (set-up objects frozen); a full
    collection that does run over a grown heap shows up in the health stream as the stall's cause, with its
    pause and generation, and in the probe status's stall summary."""
    seen: dict[str, Any] = {}
    before = gc.get_threshold()

    async def during() -> None:
        while gc.get_threshold()[2] < 1_000_000:  # the capture is set up
            await asyncio.sleep(0.01)
        seen["threshold"] = gc.get_threshold()
        seen["frozen"] = gc.get_freeze_count()
        await asyncio.sleep(0.3)
        # a large heap of live objects, built a slice per loop turn (so building it is no stall of its own)
        heap: list[dict[str, Any]] = []
        gc.disable()
        try:
            for k in range(40):
                heap.extend({"i": i, "l": [i]} for i in range(k * 10_000, (k + 1) * 10_000))
                await asyncio.sleep(0)
        finally:
            gc.enable()
        gc.collect()  # a full collection over it: one long pause on the loop
        seen["heap"] = len(heap)
        del heap
        await asyncio.sleep(0.5)

    status = asyncio.run(_run(_spec("4", 3.0), tmp_path / "b", during))
    assert status.state == "ok"
    assert seen["threshold"][2] >= 1_000_000 and seen["frozen"] > 0
    assert gc.get_threshold() == before  # restored after the capture
    health = [h for h in open_bundle(tmp_path / "b").records("client_health") if h["loop_lag_ms"] is not None]
    worst = max(health, key=lambda h: h.get("gc_pause_ms") or 0.0)
    assert worst["gc_generation"] == 2 and worst["gc_pause_ms"] > 5.0
    assert worst["loop_lag_ms"] > 5.0 and worst["stall_cause"] is not None  # the pause was a stall
    assert all("flush_records" in h and "gc_collections" in h and "loop_cpu_ms" in h for h in health)
    summary = status.detail["client_stalls"]
    assert summary["stalls"] >= 1 and summary["gc"]["collections"][2] >= 1
    assert summary["gc"]["max_pause_ms"][2] > 5.0


def test_stall_cause_is_the_noted_work_that_explains_the_lag() -> None:
    """The cause rule on its own (no timing): noted work of at least half the lag is the cause, the longest
    wins; else the loop thread's CPU time up to the late wake tells busy (ran at least half of it) from
    off_cpu."""
    from diagnose.probes.load_monitor import Monitor, RunningStats

    m = Monitor(RunningStats(), lambda: 0, lambda _r: None, lambda: None, progress=False)
    m.gc._cb("start", {"generation": 2})
    m.gc._cb("stop", {"generation": 2})
    m.gc.max_ms, m.gc.max_gen = 40.0, 2  # as if that collection had taken 40 ms
    assert m._causes(45.0, 50.0)["stall_cause"] == "gc_gen2"
    m.note("flush", 30.0, 500)
    out = m._causes(35.0, 40.0)
    assert out["stall_cause"] == "flush" and out["flush_records"] == 500 and out["gc_generation"] is None
    m.note("flush", 1.0, 4)
    assert m._causes(30.0, 40.0)["stall_cause"] == "busy"
    assert m._causes(30.0, 2.0)["stall_cause"] == "off_cpu"
    assert m._causes(3.0, 2.0)["stall_cause"] is None  # not a stall
    s = m.summary()
    assert s["stalls"] == 4 and s["stall_causes"] == {"gc_gen2": 1, "flush": 1, "busy": 1, "off_cpu": 1}
    assert s["gc"]["collections"] == [0, 0, 1]


def test_off_cpu_stall_says_why_the_thread_did_not_run() -> None:
    """The rule on its own: off the CPU for at least half the stall, the run-queue wait (ns-exact) names
    ``preempted`` before the coarse steal ticks name ``steal``; neither: ``off_cpu``. The record carries the
    three figures either way."""
    from diagnose.probes.load_monitor import Monitor, RunningStats

    m = Monitor(RunningStats(), lambda: 0, lambda _r: None, lambda: None, progress=False)
    out = m._causes(12.0, 3.0, run_wait_ms=8.0, steal_ms=10.0)
    assert out["stall_cause"] == "preempted" and out["off_cpu_ms"] == 9.0 and out["run_wait_ms"] == 8.0
    assert m._causes(12.0, 3.0, run_wait_ms=0.2, steal_ms=10.0)["stall_cause"] == "steal"
    assert m._causes(12.0, 3.0, run_wait_ms=0.2, steal_ms=0.0)["stall_cause"] == "off_cpu"
    assert m._causes(12.0, 3.0)["stall_cause"] == "off_cpu"  # no kernel counters (not Linux)
    assert m._causes(12.0, 3.0, run_wait_ms=0.2, steal_ms=10.0, major_faults=3)["stall_cause"] == "page_fault"
    assert m._causes(12.0, 3.0, run_wait_ms=8.0, major_faults=3)["stall_cause"] == "preempted"
    assert m._causes(12.0, 7.0, run_wait_ms=0.0, steal_ms=10.0)["stall_cause"] == "busy"  # ran most of it
    quiet = m._causes(2.0, 0.5, run_wait_ms=1.0, steal_ms=0.0)
    assert quiet["stall_cause"] is None and quiet["off_cpu_ms"] == 1.5 and quiet["steal_ms"] == 0.0
    from diagnose.normalize.client_stalls import cause_text

    assert "hypervisor" in cause_text("steal") and "another task" in cause_text("preempted")  # the report's words


def _monitor_records(pattern: Any, seconds: float, until: Any = None) -> list[dict[str, Any]]:
    """The health records of a real :class:`Monitor` on an event loop that runs ``pattern(loop)`` (which
    schedules the loop's work) for ``seconds``, or until ``await until(records so far)`` returns."""
    from diagnose.probes.load_monitor import Monitor, RunningStats

    recs: list[dict[str, Any]] = []

    async def main() -> None:
        m = Monitor(RunningStats(), lambda: 0, recs.append, lambda: None, progress=False)
        m.start()
        pattern(asyncio.get_running_loop())
        await (asyncio.sleep(seconds) if until is None else until(recs))
        await m.stop()

    asyncio.run(main())
    return [r for r in recs if r.get("loop_lag_ms") is not None]


def _spin(ms: float, clock: Any = time.monotonic_ns) -> None:
    end = clock() + int(ms * 1e6)
    while clock() < end:
        pass


def test_stall_in_a_blocking_call_is_off_cpu_even_in_a_busy_sample() -> None:
    """A 20 ms blocking call on the loop, with 3 ms callbacks every 5 ms for 50 ms before and after it (apart
    from it by more than the 10 ms interval the lag's CPU time is read over): the
    thread's CPU time over the sample can exceed the lag, so the old rule (CPU over the whole 0.1 s sample)
    called such a stall ``busy``; the thread did not run during it, and the record now says so (at least half
    the lag off the CPU; ``off_cpu``, or ``preempted`` on a loaded machine where it then waited to run).
    Spinning through a stall stays ``busy``."""
    starts: list[float] = []
    sleeps = [0.1 + 0.3 * k for k in range(5)]  # five times, 0.3 s apart

    def pattern(loop: asyncio.AbstractEventLoop) -> None:
        starts.append(time.monotonic())  # the loop's clock: loop.call_later counts from it
        for s in sleeps:
            for j in range(10):  # 3 ms busy every 5 ms, [s-75, s-27] and [s+32, s+80] ms
                loop.call_later(s - 0.075 + 0.005 * j, _spin, 3.0)
                loop.call_later(s + 0.032 + 0.005 * j, _spin, 3.0)
            loop.call_later(s, time.sleep, 0.020)
        loop.call_later(1.8, _spin, 20.0, time.thread_time_ns)  # a stall the thread ran through (20 ms of CPU)

    recs = _monitor_records(pattern, 2.1)

    def covering(t_s: float) -> dict[str, Any]:  # the sample whose wakes include the one at t_s
        return next(r for r in recs if r["t_ns"] / 1e9 >= starts[0] + t_s)

    blocked = [covering(s + 0.0195) for s in sleeps]
    for r in blocked:
        assert r["loop_lag_ms"] > 9.0 and r["off_cpu_ms"] >= 0.5 * r["loop_lag_ms"], r
        assert r["stall_cause"] in ("off_cpu", "preempted", "steal"), r
    assert any(r["loop_cpu_ms"] >= r["loop_lag_ms"] for r in blocked)  # the old rule's "busy"
    spun = covering(1.8195)
    assert spun["loop_lag_ms"] > 9.0, spun
    # busy; on a loaded machine the 20 ms of CPU can take twice as long, half of it waiting to run
    assert (spun["stall_cause"] == "busy" and spun["off_cpu_ms"] < 0.5 * spun["loop_lag_ms"]) or \
        (spun["stall_cause"] == "preempted" and spun["run_wait_ms"] > 5.0), spun


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise to drop a file's cached pages")
def test_stall_waiting_for_pages_read_back_from_disk_is_a_page_fault(tmp_path: Path) -> None:
    """The loop touches, in one callback, every page of a file mapping whose pages were just dropped from
    the page cache (read-ahead off): each touch is a major fault that sleeps on a disk read. The stall says
    ``page_fault``, with the faults counted."""
    import mmap

    path = tmp_path / "cold.bin"
    size = 8 << 20  # 2,048 pages: ~80 µs a fault here, ~0.2 s in all
    with open(path, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())  # clean pages can be dropped
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED)
        mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        mm.madvise(mmap.MADV_RANDOM)  # one page per fault, no read-ahead
        seen: list[int] = []

        def touch() -> None:
            seen.append(sum(mm[i] for i in range(0, size, mmap.PAGESIZE)))

        recs = _monitor_records(lambda loop: loop.call_later(0.15, touch), 1.5)  # and the samples after it
        mm.close()
    finally:
        os.close(fd)
    assert seen
    worst = max(recs, key=lambda r: r["loop_lag_ms"])
    assert worst["major_faults"] > 100, worst  # the pages came back from disk
    if worst["loop_lag_ms"] > 5.0 and worst["off_cpu_ms"] >= 0.5 * worst["loop_lag_ms"]:
        assert worst["stall_cause"] in ("page_fault", "preempted"), worst
    else:  # a disk fast enough that the faults cost more CPU than waiting: the thread ran through them
        assert worst["stall_cause"] in (None, "busy"), worst


@pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists(), reason="needs Linux schedstat")
def test_stall_behind_another_task_on_the_cpu_is_preempted() -> None:
    """The loop's thread at SCHED_IDLE, on the CPU of a process that spins at normal priority for a second:
    it waits on the run queue, and its stalls say ``preempted`` with the wait measured (no privilege needed
    to lower one's own priority; scheduling policy and affinity are per thread on Linux)."""
    cpu = min(os.sched_getaffinity(0))
    recs: list[dict[str, Any]] = []
    hog = subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c",
                            "import time\nend = time.time() + 1.0\nwhile time.time() < end: pass"])

    async def watch(so_far: list[dict[str, Any]]) -> None:
        t_end = time.monotonic() + 20.0
        # the whole time the hog spins, and until two samples are out however little the thread runs
        while hog.poll() is None or (sum(r.get("loop_lag_ms") is not None for r in so_far) < 2
                                     and time.monotonic() < t_end):
            await asyncio.sleep(0.05)

    def loop_thread() -> None:
        os.sched_setaffinity(0, {cpu})
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        recs.extend(_monitor_records(lambda _loop: None, 0.0, watch))

    try:
        time.sleep(0.1)  # the hog runs
        t = threading.Thread(target=loop_thread)
        t.start()
        t.join(60)
    finally:
        hog.kill()
        hog.wait()
    stalls = [r for r in recs if r["loop_lag_ms"] > 5.0]  # _monitor_records keeps the samples with a lag
    assert stalls, recs
    assert sum(r["stall_cause"] == "preempted" for r in stalls) >= 0.8 * len(stalls), \
        [(r["loop_lag_ms"], r["off_cpu_ms"], r["run_wait_ms"], r["stall_cause"]) for r in stalls]
    assert max(r["run_wait_ms"] for r in stalls) > 5.0


def test_full_gc_runs_at_each_phase_boundary_only(tmp_path: Path) -> None:
    """The deferred full collection runs once per phase end (no request of the phase in flight), not during
    the phase: a sweep of two levels sees exactly two."""
    status = asyncio.run(_run(_spec("1,2", None, num_requests=6), tmp_path / "b"))
    assert status.state == "ok"
    assert status.detail["client_stalls"]["gc"]["collections"][2] == 2
    assert len(open_bundle(tmp_path / "b").records("phases")) == 2


# -- analysis: a short stall marks the requests it touched --------------------------------------------
def _bundle(tmp_path: Path, stalls_at: list[float], stall_ms: float) -> Path:
    """An open-loop run at 20 req/s for 10 s (100 ms requests) whose client stalled at ``stalls_at`` (s)
    for ``stall_ms``: requests due meanwhile were sent when the stall ended."""
    out = tmp_path / "b"
    bw = BundleWriter(out, workload={"mode": "rate", "warmup_requests": 0})
    a = bw.anchor_mono_ns
    ns = 1_000_000_000
    req = bw.stream("requests")
    for i in range(200):
        intended = 0.05 * i
        sent = intended
        for s in stalls_at:
            if s - stall_ms / 1e3 <= intended < s:
                sent = s
        req.write({"rid": f"r{i}", "phase": 0, "warmup": False, "intended_ns": a + int(intended * ns),
                   "sent_ns": a + int(sent * ns), "first_token_ns": a + int((sent + 0.02) * ns),
                   "end_ns": a + int((sent + 0.1) * ns), "ok": True, "error": None, "output_tokens_chunks": 8,
                   "n_chunks": 8, "prompt_tokens": 16, "capped": False})
    health = bw.stream("client_health")
    for k in range(1, 101):
        t = 0.1 * k
        lag = next((stall_ms for s in stalls_at if s < t <= s + 0.1 + 1e-9), 0.5)  # the sample after it
        health.write({"t_ns": a + int(t * ns), "loop_lag_ms": lag, "in_flight": 2, "cpu_percent": 10.0,
                      "gc_pause_ms": lag * 0.95 if lag > 1 else 0.0, "gc_generation": 2 if lag > 1 else None,
                      "flush_records": 0, "stall_cause": "gc_gen2" if lag > 1 else None})
    bw.stream("phases").write({"phase": 0, "name": "r=20", "mode": "rate", "rate": 20, "role": "measure",
                               "start_ns": a, "end_ns": a + 10 * ns})
    bw.finish()
    return out


def _signals(path: Path) -> tuple[dict[str, float], dict[str, Any]]:
    tables = norm.tables(open_bundle(path))
    return {s.name: s.value for s in norm.signals(tables, Window(-1e18, 1e18))}, tables


def _client_bound(tables: dict[str, Any]) -> bool:
    """Whether rule VAL001 (the client-bound judgement) fires on these tables' run signals."""
    sigs = {s.name: s for s in norm.signals(tables, Window(-1e18, 1e18))}
    res = evaluate([s for s in load_rules() if s.id == "VAL001"], sigs, load_thresholds())
    return any(f.rule_id == "VAL001" for f in res.findings)


def test_one_short_stall_marks_its_requests_instead_of_invalidating_the_run(tmp_path: Path) -> None:
    sig, tables = _signals(_bundle(tmp_path, [5.0], 500.0))
    st = tables["client_stalls"]
    assert len(st) == 1 and bool(st["marked"].iloc[0]) and st["cause"].iloc[0] == "gc_gen2"
    n = int(tables["requests"]["client_stall"].sum())
    assert 0 < n <= 20  # the requests due during the stall and those in flight across it
    assert sig["requests_excluded_client_stall"] == n
    assert sig["requests_measured"] == 200 - n
    assert sig["client_schedule_lag_p99_ms"] < 10.0  # the late sends are the stall's, left out
    assert sig["client_loop_lag_p99_ms"] < 10.0
    assert not _client_bound(tables)
    rows = {r[0]: r[1] for s in client_sections(tables) if s.id == "client_self_check" for r in s.payload.rows}
    assert rows["longest client stall (cause gc_gen2: a garbage collection of generation 2)"].value == 500.0
    assert rows["requests touched by a client stall, excluded from statistics"] == n


def test_many_stalls_still_make_the_run_client_bound(tmp_path: Path) -> None:
    sig, tables = _signals(_bundle(tmp_path, [1.5, 3.5, 5.5, 7.5, 9.0], 300.0))
    st = tables["client_stalls"]
    assert len(st) == 5 and not st["marked"].any()
    assert not tables["requests"]["client_stall"].any()
    assert "requests_excluded_client_stall" not in sig
    assert _client_bound(tables)


def test_stall_rule_constants_are_consistent() -> None:
    from diagnose.normalize import client_stalls

    # a stall is exactly what the client-bound rule's loop-lag gate would count (rules/thresholds.yaml)
    assert client_stalls.LAG_KEY == "client_loop_lag_max_ms"
    for key in (client_stalls.COUNT_KEY, client_stalls.SPAN_KEY, client_stalls.SHARE_KEY):
        assert key in load_thresholds()


def test_stall_marking_follows_threshold_overrides(tmp_path: Path) -> None:
    # the stall rule's numbers are thresholds (rules/thresholds.yaml), so --threshold reaches them
    from diagnose.pipeline import analyze

    path = _bundle(tmp_path, [5.0], 500.0)
    assert analyze(path).signals["requests_excluded_client_stall"].value > 0
    strict = analyze(path, threshold_overrides={"client_stall_max_count": 0})
    assert "requests_excluded_client_stall" not in strict.signals  # nothing marked: judged as a whole


# -- bounded work per loop turn (issue 18, second round: benchmarks/results/client_stall.md) ---------------
def test_reads_are_parsed_a_budget_per_loop_turn() -> None:
    """Reads stamped in one poll are parsed until RX_BUDGET_NS is spent, the rest on later turns, in arrival
    order; a closing connection's drain (budget=False) parses everything at once. Parsed all in one callback,
    hundreds of reads held the loop for 4 ms and more."""
    import time

    from diagnose.probes.http_client import RX_BUDGET_NS, HttpClient

    parsed: list[int] = []
    per_read_ns = RX_BUDGET_NS // 5  # five reads fill a turn's budget

    class Conn:
        def _on_data(self, data: bytes, t: int) -> None:
            end = time.perf_counter_ns() + per_read_ns
            while time.perf_counter_ns() < end:
                pass
            parsed.append(t)

    async def go() -> list[int]:
        client = HttpClient("http://127.0.0.1:9")
        conns = [Conn() for _ in range(4)]
        for i in range(100):
            client.rx_pending.append((conns[i % 4], i, b"x"))  # type: ignore[arg-type]
        client.schedule_rx()
        per_turn = []
        while len(parsed) < 100:
            before = len(parsed)
            await asyncio.sleep(0)  # one loop turn: the scheduled drain runs before this task resumes
            per_turn.append(len(parsed) - before)
        for i in range(100, 140):
            client.rx_pending.append((conns[i % 4], i, b"x"))  # type: ignore[arg-type]
        client.drain_rx(budget=False)
        return per_turn

    per_turn = asyncio.run(go())
    assert per_turn[0] == 8  # the budget is checked every 8 reads: 8 x 0.2 ms is past 1 ms
    assert len(per_turn) >= 12 and max(per_turn) == 8
    assert parsed == list(range(140))  # arrival order kept across turns; the unbudgeted drain took all 40


def _load_run(tmp_path: Path) -> Any:
    from diagnose.probes.load import _LoadRun

    bw = BundleWriter(tmp_path / "b")
    ctx = CaptureContext(bundle=bw, target=Target(url="http://127.0.0.1:9"), stop=asyncio.Event())
    return _LoadRun(_spec("4"), ctx, False)


def test_send_gate_sizes_its_turns_by_the_measured_setup_time(tmp_path: Path) -> None:
    """As many requests are set up per turn as fit SEND_BUDGET_MS at the measured set-up time (at least one,
    at most SEND_BATCH): 16 new connections in one turn at a phase's start held the loop for 6-14 ms."""
    from diagnose.probes.load import SEND_BATCH, SEND_BUDGET_MS, SETUP_MS_START

    run = _load_run(tmp_path)
    assert run.setup_ms == SETUP_MS_START
    assert run._turn_quota() == int(SEND_BUDGET_MS / SETUP_MS_START) == 2
    run.setup_ms = 0.01
    assert run._turn_quota() == SEND_BATCH
    run.setup_ms = 3.0
    assert run._turn_quota() == 1
    run.setup_ms = 0.5
    for _ in range(60):  # set-ups measured at 0.08 ms (gate passed -> request written)
        run._setup_done(1_000_000, 1_080_000)
    assert abs(run.setup_ms - 0.08) < 0.002 and run._turn_quota() == 12
    before = run.setup_ms
    run._setup_done(0, 1_000_000_000)  # a connect that hung for a second counts as 5 ms at most
    assert abs(run.setup_ms - (before + 0.1 * (5.0 - before))) < 1e-9

    async def go() -> list[int]:
        run.setup_ms = 0.25  # 4 per turn
        gates = [run._send_gate() for _ in range(40)]
        open_now = sum(g is None for g in gates)
        waiting = [g for g in gates if g is not None]
        released = [open_now]
        while any(not g.done() for g in waiting):
            before = sum(g.done() for g in waiting)
            await asyncio.sleep(0)
            released.append(sum(g.done() for g in waiting) - before)
        return released

    released = asyncio.run(go())
    assert released[0] == 4 and max(released) == 4 and sum(released) == 40
    run._io.shutdown(wait=True)


def test_closed_loop_workers_start_a_batch_per_turn() -> None:
    """A closed loop's workers are started SEND_BATCH per loop turn: each worker's first step (256 at a
    phase's start at c=256) all in one turn held the loop for 10 ms and more. Every worker still runs to
    its end, and a cancelled phase cancels those already started."""
    from diagnose.probes.load import SEND_BATCH, _run_workers

    created = [0]
    seen_at_first_step: list[int] = []

    async def worker() -> None:
        seen_at_first_step.append(created[0])
        await asyncio.sleep(0.01)

    def make() -> Any:
        created[0] += 1
        return worker()

    asyncio.run(_run_workers(make, 40))
    assert len(seen_at_first_step) == 40
    assert seen_at_first_step[0] == SEND_BATCH  # the first batch ran before the second was created
    assert max(seen_at_first_step[:SEND_BATCH]) == SEND_BATCH and seen_at_first_step[-1] == 40

    started: list[asyncio.Task[Any]] = []

    async def forever() -> None:
        task = asyncio.current_task()
        assert task is not None
        started.append(task)
        await asyncio.sleep(3600)

    async def cancel_it() -> None:
        t = asyncio.ensure_future(_run_workers(forever, 40))
        while len(started) < SEND_BATCH:
            await asyncio.sleep(0)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t

    asyncio.run(cancel_it())
    assert started and all(t.cancelled() for t in started)


def test_what_survives_each_health_tick_is_frozen(tmp_path: Path) -> None:
    """During a phase, what survives each 0.1 s health tick is frozen, so the collector's young generations
    only scan what the last tick allocated (unfrozen they scanned every in-flight request's objects again:
    pauses of 0.2-4 ms at c=256). Everything is unfrozen when the capture ends."""
    seen: dict[str, int] = {}

    async def during() -> None:
        while gc.get_threshold()[2] < 1_000_000:  # the capture is set up (set-up objects frozen)
            await asyncio.sleep(0.005)
        seen["at_start"] = gc.get_freeze_count()
        await asyncio.sleep(0.6)
        seen["later"] = gc.get_freeze_count()

    status = asyncio.run(_run(_spec("8", 1.5), tmp_path / "b", during))
    assert status.state == "ok"
    assert seen["later"] > seen["at_start"]  # ticks froze the requests' objects
    assert gc.get_freeze_count() == 0
