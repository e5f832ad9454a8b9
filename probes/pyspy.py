"""Host stacks: sample every process of the engine's tree with py-spy, plus per-thread CPU counters.

Finds the server process (``Target.pid``, or the process listening on the target URL's port), walks its
process tree (for vLLM: the API server, ``VLLM::EngineCore``, ``VLLM::Worker``...) and, for the whole
capture:

* runs ``py-spy record --format raw --threads --nolineno`` per Python process in consecutive
  ``window_s`` windows (a dying target or a crashed py-spy loses one window; stacks carry their window),
  active samples only, so a stack's share of a thread's samples is a share of its on-CPU time;
  ``--nonblocking`` by default (the target is never paused);
* reads ``/proc/<pid>/task/<tid>/{stat,schedstat}`` of every thread every ``cpu_interval_s`` (CPU time and
  run-queue wait, the direct CPU-contention signal; an idle thread's unchanged counters are rewritten only
  every 30 s) and the system's ``/proc/stat`` (steal);
* takes a ``py-spy dump --json`` snapshot of each process every ``dump_interval_s`` (which thread holds the
  GIL, which are active).
* every ``foreign_interval_s`` reads ``/proc/<pid>/stat`` of every process on the machine and records the
  ``foreign_top_n`` busiest outside the engine's tree (name and last core only, never a command line), so a
  finding can name the process that took the engine's cores (measured: 1.7 ms of CPU per scan of 68
  processes, benchmarks/results/host_foreign_scan.md).

Stream ``host_samples`` (records by ``kind``; times are CLOCK_MONOTONIC ns):
  process:    {kind, t_ns, pid, ppid, role, name}           role: api_server | engine_core | worker | other
  thread_cpu: {kind, t_ns, pid, tid, comm, state, utime_s, stime_s, run_ns, wait_ns, slices, cpu}
                                                             (cumulative; cpu = core it last ran on)
  system_cpu: {kind, t_ns, ncpu, user, nice, system, idle, iowait, irq, softirq, steal}       (ticks, cumulative)
  stack:      {kind, pid, tid, thread, frames: ["func (file)", ... root first], count, start_ns, end_ns}
  dump:       {kind, t_ns, pid, threads: [{tid, name, active, gil, leaf}]}
  foreign_scan: {kind, t0_ns, t_ns, processes, engine_processes, top_n, min_cores}   one per scan interval
  foreign_cpu:  {kind, t0_ns, t_ns, pid, name, cpu_s, cpu, own}  a busy process outside the engine over the
                interval (cpu = core it last ran on; own = this capture's own process or its children)
  exit:       {kind, t_ns, pid}                              a sampled process disappeared
  pyspy_cost: {kind, pid, mode (record | dump), cpu_s, wall_s, samples, rate_hz, nonblocking, returncode,
               windows}                                      py-spy's own CPU (os.wait4 rusage)
The raw py-spy outputs are kept as artifacts ``pyspy_<pid>.txt`` (flamegraph.pl input).

Cost (issue 17, diagnose/capture/overhead.py): the status detail's ``cost`` holds py-spy's own CPU (records and
dumps) and, with ``--pyspy-blocking``, the time the processes were paused (py-spy's CPU while they were
stopped stands in for it: the cost on the server); the ``host`` probe's is its own CPU for the /proc reads.
Within a capture budget (``attach --overhead-budget``) blocking py-spy measures its pauses before each window
and, when over the budget, lowers the rate of the next windows (to 1 Hz at least) and spaces the dumps out,
and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psutil

from diagnose.capture.overhead import OverheadBudget, budget_of, cost, rate_of
from diagnose.capture.realtime import child_argv
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Options, ProbeOption, ProbeSetup, ProbeSpec
from diagnose.probes.host_procs import (
    ForeignCpu,
    ProcInfo,
    alive,
    engine_tree,
    pid_listening_on,
    port_of,
    python_state,
    read_system_cpu,
    read_thread_cpu,
)

NAME = "pyspy"
HOST_NAME = "host"
# Defaults sized by benchmarks/overhead_host.py on the three vLLM processes: py-spy used 0.036 cores at
# 10 Hz with 30 s windows, 0.076 at 20 Hz with 10 s windows (each restart re-reads symbols), 0.151 at 50 Hz.
DEFAULT_RATE_HZ = 10.0
IDLE_REWRITE_NS = 30_000_000_000
PTRACE_FIX = ("py-spy needs ptrace on the server's processes: run diagnose as the same user as the server "
              "(or root), grant CAP_SYS_PTRACE (docker: --cap-add SYS_PTRACE), or set "
              "/proc/sys/kernel/yama/ptrace_scope to 0 (sysctl kernel.yama.ptrace_scope=0)")
_PERM = re.compile(r"permission denied|operation not permitted|EPERM|ptrace", re.I)
_PERM_DENIED = re.compile(r"permission denied|operation not permitted|EPERM", re.I)
_RAW_LINE = re.compile(r"^thread \((\d+)\)(?::\s*(.*?))?;(.*)\s(\d+)$")


@dataclass
class _Recorder:
    """One process's py-spy recording: consecutive ``--duration window_s`` runs, so a crash or an exiting
    target loses at most the current window, and stacks carry the window they were sampled in."""

    proc: ProcInfo
    artifact: Path
    popen: subprocess.Popen[bytes] | None = None
    cpu_s: float = 0.0
    wall_s: float = 0.0
    samples: int = 0
    windows: int = 0
    returncode: int | None = None
    stderr: str = ""


def pyspy_binary() -> str | None:
    """The py-spy executable: next to this interpreter (the venv) first, then PATH."""
    here = Path(sys.executable).parent / "py-spy"
    if here.exists():
        return str(here)
    return shutil.which("py-spy")


def parse_raw(text: str) -> list[tuple[int, str, list[str], int]]:
    """py-spy ``--format raw --threads`` lines -> (tid, thread name, frames root first, count)."""
    out = []
    for line in text.splitlines():
        m = _RAW_LINE.match(line.strip())
        if not m:
            continue
        tid, tname, stack, count = int(m.group(1)), m.group(2) or "", m.group(3), int(m.group(4))
        out.append((tid, tname, [f for f in stack.split(";") if f], count))
    return out


class PySpyProbe:
    """Host stacks of the engine's process tree (see module docstring for the records)."""

    def __init__(self, *, pid: int | None = None, port: int | None = None, rate_hz: float = DEFAULT_RATE_HZ,
                 nonblocking: bool = True, cpu_interval_s: float = 1.0, dump_interval_s: float = 15.0,
                 binary: str | None = None, stop_timeout_s: float = 10.0, window_s: float = 30.0,
                 rate: float | None = None, foreign_interval_s: float = 5.0, foreign_top_n: int = 5,
                 stacks: bool = True) -> None:
        # stacks=False: the /proc counters and the foreign-process scan only, no py-spy at all (the ``host``
        # probe, probes/host_cpu.py: on by default, since it needs neither ptrace nor a Python target)
        self.stacks = stacks
        self.name = NAME if stacks else HOST_NAME
        self.pid = pid
        self.port = port
        self.rate_hz = float(rate if rate is not None else rate_hz)  # ``rate``: the CLI's name for it
        self.nonblocking = nonblocking
        self.cpu_interval_s = cpu_interval_s
        self.dump_interval_s = dump_interval_s
        self.binary = binary
        self.stop_timeout_s = stop_timeout_s
        self.window_s = max(1.0, window_s)
        self.foreign_interval_s = foreign_interval_s
        self.foreign_top_n = foreign_top_n
        self._foreign: ForeignCpu | None = None
        self._halt = threading.Event()
        self._recorders: list[_Recorder] = []
        self._native = ""  # why py-spy did not apply (a native server), when it did not
        self._dump_cpu_s = 0.0
        self._dump_wall_s = 0.0
        self._dumps = 0
        self._gone: set[int] = set()
        self._last_cpu: dict[tuple[int, int], tuple[int, tuple[float, float, int, int]]] = {}
        self._problems: dict[int, str] = {}
        self._rate_now = self.rate_hz  # lowered within a budget (cost)
        self._factor_now = 1.0  # the budget's factor last read (1: as asked)
        self._dump_every = dump_interval_s
        self._own_cpu_s = 0.0  # the /proc reads and scans (thread CPU)
        self._started = time.monotonic()
        self._adapted: list[str] = []
        self._budget: OverheadBudget | None = None
        self._lock = threading.Lock()

    # -- discovery -----------------------------------------------------------------------------
    def _binary(self) -> str | None:
        if self.binary is not None:
            return self.binary if os.access(self.binary, os.X_OK) else None
        return pyspy_binary()

    def _root_pid(self, ctx: CaptureContext) -> tuple[int | None, str]:
        pid = self.pid or ctx.target.pid
        if pid:
            return (pid, "") if psutil.pid_exists(pid) else (None, f"no process with PID {pid}")
        port = self.port or port_of(ctx.target.url)
        if port is None:
            return None, f"cannot tell the server's port from {ctx.target.safe_url!r}; pass its PID"
        pid = pid_listening_on(port)
        if pid is None:
            return None, (f"no local process visible listening on port {port} (server on another host or "
                          "another user's; pass --pid)")
        return pid, ""

    def available(self, ctx: CaptureContext) -> tuple[bool, str]:
        if self.stacks and self._binary() is None:
            return False, "py-spy is not installed (pip install py-spy)"
        pid, why = self._root_pid(ctx)
        if pid is None:
            return False, why
        if pid == os.getpid():
            return False, f"PID {pid} is diagnose itself, not the server: pass the server's PID"
        if not self.stacks:
            return True, ""
        state = python_state(pid)
        if state == "other":  # a native server (llama.cpp): run() records the /proc counters only, and says so
            return True, ""
        if state == "denied":
            return False, f"cannot inspect PID {pid} ({_proc_name(pid)}): access denied. {PTRACE_FIX}"
        if state == "gone":
            return False, f"no process with PID {pid}"
        return True, ""

    # -- run -----------------------------------------------------------------------------------
    async def run(self, ctx: CaptureContext) -> ProbeStatus:
        ok, why = self.available(ctx)
        if not ok:
            return ProbeStatus(self.name, "unavailable", why)
        root, _ = self._root_pid(ctx)
        assert root is not None
        native = ""
        if self.stacks and python_state(root) == "other":
            self.stacks = False
            native = (f"py-spy does not apply: PID {root} is a native process ({_proc_name(root)}), not Python; "
                      "its threads' CPU and run-queue wait were recorded from /proc instead")
        self._native = native
        self._started = time.monotonic()
        self._budget = budget_of(ctx.shared, ctx.options)
        try:
            procs = engine_tree(root)
        except psutil.AccessDenied as e:
            return ProbeStatus(self.name, "failed", f"cannot read process {root}: {e}. {PTRACE_FIX}")
        except psutil.NoSuchProcess:
            return ProbeStatus(self.name, "failed", f"server process {root} exited before sampling started")
        stream = ctx.bundle.stream("host_samples", "py-spy stacks, per-thread CPU and run-queue counters")
        now = ctx.now_ns()
        stream.write_many([{"kind": "process", "t_ns": now, "pid": p.pid, "ppid": p.ppid, "role": p.role,
                            "name": p.name, "cpus": allowed_cores(p.pid)} for p in procs])
        if self.stacks:
            self._recorders = [_Recorder(p, ctx.bundle.artifact_path(f"pyspy_{p.pid}.txt")) for p in procs]
        loops = [asyncio.create_task(asyncio.to_thread(self._record_loop, ctx, r, stream)) for r in self._recorders]
        if self.foreign_interval_s > 0:
            self._foreign = ForeignCpu(root, top_n=self.foreign_top_n)
        # the counters and the dumps are separate loops: a py-spy dump runs at normal priority and may take
        # its full 5 s timeout per process on a contended host, which must never thin out the counters
        # (seen: 3 counter samples in a 20 s capture with busy processes on the API server's core)
        samplers = [asyncio.create_task(self._sample_loop(ctx, procs, stream))]
        if self.stacks and self.dump_interval_s > 0:
            samplers.append(asyncio.create_task(self._dump_loop(ctx, procs, stream)))
        try:
            await ctx.stop.wait()
        finally:
            self._halt.set()
            for t in samplers:
                t.cancel()
            for t in samplers:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            if self._foreign is not None:  # the last interval up to the stop
                stream.write_many(self._foreign.sample(ctx.now_ns()))
            for r in self._recorders:
                if r.popen is not None:
                    with contextlib.suppress(OSError):
                        r.popen.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            await asyncio.gather(*loops, return_exceptions=True)
        return self._finish(ctx, procs, stream)

    def _record_loop(self, ctx: CaptureContext, r: _Recorder, stream: Any) -> None:
        binary = self._binary()
        assert binary is not None
        out = r.artifact.with_suffix(".window")
        while not self._halt.is_set() and r.proc.pid not in self._gone:
            self._adapt()
            cmd = [binary, "record", "--pid", str(r.proc.pid), "--rate", str(max(1, round(self._rate_now))), "--format", "raw",
                   "--threads", "--nolineno", "--duration", str(int(self.window_s)), "--output", str(out)]
            if self.nonblocking:
                cmd.append("--nonblocking")
            out.unlink(missing_ok=True)
            start_ns = ctx.now_ns()
            try:
                r.popen = subprocess.Popen(child_argv(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                           start_new_session=True)
            except OSError as e:
                self._problems[r.proc.pid] = f"cannot start py-spy: {e}"
                return
            if self._halt.is_set():  # stop arrived while starting: make sure this run ends too
                with contextlib.suppress(OSError):
                    r.popen.send_signal(signal.SIGINT)
            used = _reap(r.popen, self.window_s + self.stop_timeout_s)
            with self._lock:
                r.cpu_s += used
            end_ns = ctx.now_ns()
            r.wall_s += (end_ns - start_ns) / 1e9
            r.returncode = r.popen.returncode
            assert r.popen.stderr is not None
            err = r.popen.stderr.read().decode("utf-8", "replace")
            r.popen.stderr.close()
            text = out.read_text(errors="replace") if out.exists() else ""
            parsed = parse_raw(text)
            r.windows += 1
            r.samples += sum(c for *_, c in parsed)
            stream.write_many([{"kind": "stack", "pid": r.proc.pid, "tid": tid, "thread": tname, "frames": fr,
                                "count": c, "start_ns": start_ns, "end_ns": end_ns}
                               for tid, tname, fr, c in parsed])
            if text:
                with open(r.artifact, "a", encoding="utf-8") as fh:
                    fh.write(text if text.endswith("\n") else text + "\n")
            if not parsed and err.strip() and r.returncode not in (0, None):
                r.stderr = err
                if r.samples == 0 and (r.windows == 1 or _PERM.search(err)):
                    return  # refused or broken from the start: retrying will not help
            if r.returncode not in (0, None) and not alive(r.proc.pid):
                return
        out.unlink(missing_ok=True)

    async def _sample_loop(self, ctx: CaptureContext, procs: list[ProcInfo], stream: Any) -> None:
        next_foreign = time.monotonic()
        while True:
            await asyncio.to_thread(self._sample_cpu, ctx, procs, stream)
            if self._foreign is not None and time.monotonic() >= next_foreign:
                next_foreign = time.monotonic() + self.foreign_interval_s
                stream.write_many(await asyncio.to_thread(self._timed, self._foreign.sample, ctx.now_ns()))
            await asyncio.sleep(self.cpu_interval_s)

    def _timed(self, fn: Any, *args: Any) -> Any:
        """fn(*args) on this thread, its CPU counted as the probe's own."""
        c0 = time.thread_time()
        try:
            return fn(*args)
        finally:
            with self._lock:
                self._own_cpu_s += time.thread_time() - c0

    def _spent_s(self) -> tuple[float, float]:
        """(the target's paused time, this probe's own CPU) so far, in seconds."""
        with self._lock:
            spy = sum(r.cpu_s for r in self._recorders) + self._dump_cpu_s
            return (spy if not self.nonblocking else 0.0), spy + self._own_cpu_s

    def _share(self) -> float:
        """What py-spy costs the server so far, as a share of one core: the time it paused the processes
        (``--pyspy-blocking``; 0 when nonblocking, where py-spy's CPU is its own, reported beside)."""
        paused, _ = self._spent_s()
        return rate_of(paused, time.monotonic() - self._started)

    def _refresh_factor(self) -> None:
        """Tell the budget this probe's share at the settings asked, and read its factor back."""
        assert self._budget is not None
        self._budget.want(self.name, self._share() / self._factor_now)
        self._factor_now = self._budget.factor(self.name)

    def _adapt(self) -> None:
        """Within a budget, before each py-spy window: the rate and the dumps at the budget's factor (the
        rate never under 1 Hz)."""
        if self._budget is None or not self.stacks:
            return
        self._refresh_factor()
        rate = max(1.0, self.rate_hz * self._factor_now)
        if abs(rate - self._rate_now) >= 0.5:
            self._rate_now = rate
            self._dump_every = self.dump_interval_s / self._factor_now if self.dump_interval_s > 0 else 0.0
            if rate < self.rate_hz:
                self._adapted.append(f"{rate:.0f} Hz and a dump every {self._dump_every:.0f} s after "
                                     f"{time.monotonic() - self._started:.0f} s")

    async def _dump_loop(self, ctx: CaptureContext, procs: list[ProcInfo], stream: Any) -> None:
        await asyncio.sleep(min(1.0, self.dump_interval_s))
        while True:
            t0 = time.monotonic()
            await asyncio.to_thread(self._dump_all, ctx, procs, stream)
            await asyncio.sleep(max(0.0, self._dump_every - (time.monotonic() - t0)))

    def _sample_cpu(self, ctx: CaptureContext, procs: list[ProcInfo], stream: Any) -> None:
        self._timed(self._sample_cpu_now, ctx, procs, stream)

    def _sample_cpu_now(self, ctx: CaptureContext, procs: list[ProcInfo], stream: Any) -> None:
        t = ctx.now_ns()
        recs: list[Mapping[str, object]] = []
        sysc = read_system_cpu()
        if sysc is not None:
            recs.append({"kind": "system_cpu", "t_ns": t, **sysc})
        for p in procs:
            if p.pid in self._gone:
                continue
            rows = read_thread_cpu(p.pid)
            if not rows or not alive(p.pid):
                self._gone.add(p.pid)
                recs.append({"kind": "exit", "t_ns": t, "pid": p.pid})
                continue
            for r in rows:
                # an idle thread's counters do not move: write it again only after IDLE_REWRITE_NS, so a
                # worker's dozens of idle runtime threads do not fill the stream (deltas stay exact)
                key = (p.pid, r["tid"])
                sig = (r["utime_s"], r["stime_s"], r["run_ns"], r["wait_ns"])
                last = self._last_cpu.get(key)
                if last is None or last[1] != sig or t - last[0] >= IDLE_REWRITE_NS:
                    self._last_cpu[key] = (t, sig)
                    recs.append({"kind": "thread_cpu", "t_ns": t, "pid": p.pid, **r})
        stream.write_many(recs)

    def _dump_all(self, ctx: CaptureContext, procs: list[ProcInfo], stream: Any) -> None:
        binary = self._binary()
        assert binary is not None
        for p in procs:
            if p.pid in self._gone or p.pid in self._problems:
                continue
            t0 = time.monotonic()
            cmd = [binary, "dump", "--pid", str(p.pid), "--json"] + (["--nonblocking"] if self.nonblocking
                                                                      else [])
            try:
                popen = subprocess.Popen(child_argv(cmd), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            except OSError:
                continue
            t_ns = ctx.now_ns()
            killer = threading.Timer(5.0, popen.kill)
            killer.start()
            assert popen.stdout is not None
            data = popen.stdout.read()
            popen.stdout.close()
            killer.cancel()
            used = _reap(popen, 5.0)
            with self._lock:
                self._dump_cpu_s += used
            self._dump_wall_s += time.monotonic() - t0
            self._dumps += 1
            try:
                threads = orjson.loads(data) if popen.returncode == 0 else None
            except orjson.JSONDecodeError:
                threads = None
            if not isinstance(threads, list):
                continue
            stream.write({"kind": "dump", "t_ns": t_ns, "pid": p.pid, "threads": [
                {"tid": th.get("os_thread_id"), "name": th.get("thread_name") or "",
                 "active": bool(th.get("active")), "gil": bool(th.get("owns_gil")),
                 "leaf": (th.get("frames") or [{}])[0].get("name", "")} for th in threads
                if isinstance(th, dict)]})

    def _finish(self, ctx: CaptureContext, procs: list[ProcInfo], stream: Any) -> ProbeStatus:
        gone = [f"{p.role} {p.pid}" for p in procs if p.pid in self._gone]
        note = f"; process(es) exited during the capture: {', '.join(gone)}" if gone else ""
        window = time.monotonic() - self._started
        paused, own = self._spent_s()
        if not self.stacks:
            detail = {"processes": {str(p.pid): {"role": p.role, "name": p.name, "exited": p.pid in self._gone}
                                    for p in procs}, "cpu_interval_s": self.cpu_interval_s, "stacks": False,
                      "cost": cost(0.0, own, window, True, "server: none (reading /proc never stops it); own: the "
                                                           "/proc reads and scans (thread CPU)")}
            if self._native:
                detail["native"] = True
            return ProbeStatus(self.name, "ok", (self._native + note).lstrip("; "), detail)
        total = 0
        per_proc: dict[str, dict[str, str | int | float]] = {}
        for r in self._recorders:
            p = r.proc
            n = r.samples
            total += n
            stream.write({"kind": "pyspy_cost", "pid": p.pid, "mode": "record", "cpu_s": round(r.cpu_s, 4),
                          "wall_s": round(r.wall_s, 3), "samples": n, "rate_hz": self.rate_hz,
                          "nonblocking": self.nonblocking, "returncode": r.returncode, "windows": r.windows})
            if r.artifact.exists():
                ctx.bundle.add_artifact(r.artifact.name, "pyspy_raw",
                                        f"py-spy raw stacks of {p.role} ({p.pid})", pid=p.pid, role=p.role)
            if n == 0 and r.stderr.strip():
                self._problems[p.pid] = _explain(r.stderr)
            per_proc[str(p.pid)] = {"role": p.role, "name": p.name, "samples": n,
                                    "pyspy_cpu_s": round(r.cpu_s, 4), "exited": p.pid in self._gone,
                                    "problem": self._problems.get(p.pid, "")}
        if self._dumps:
            stream.write({"kind": "pyspy_cost", "pid": 0, "mode": "dump", "cpu_s": round(self._dump_cpu_s, 4),
                          "wall_s": round(self._dump_wall_s, 3), "samples": self._dumps, "rate_hz": 0.0,
                          "nonblocking": self.nonblocking, "returncode": 0})
        spent = sum(r.cpu_s for r in self._recorders) + self._dump_cpu_s
        adapted = (f"the {self._budget.share:.2%} overhead budget lowered py-spy to " + "; then ".join(self._adapted)
                   if self._adapted and self._budget is not None else None)
        detail = {"processes": per_proc, "rate_hz": self.rate_hz, "nonblocking": self.nonblocking,
                  "pyspy_cpu_s": round(spent, 3), "samples": total,
                  "cost": cost(paused * 1e3, own, window, True,
                               "own: py-spy's CPU (os.wait4) and the /proc reads" + (
                                   "" if self.nonblocking else "; server: paused while py-spy read it "
                                                               "(py-spy's CPU stands in for the pause)"),
                               adapted=adapted, rate_hz_last=round(self._rate_now, 2),
                               budget_share=self._budget.share if self._budget is not None else None)}
        if total == 0:
            runs = ", ".join(f"{r.proc.role} {r.proc.pid}: {r.windows} run(s), exit {r.returncode}"
                             for r in self._recorders)
            problems = ("; ".join(f"{k}: {v}" for k, v in self._problems.items())
                        or f"py-spy collected no samples ({runs or 'no process to sample'})")
            return ProbeStatus(self.name, "failed", problems + note, detail)
        missing = [f"{per_proc[str(k)]['role']} {k}: {v}" for k, v in self._problems.items() if str(k) in per_proc]
        reason = (f"no stacks from {'; '.join(missing)}" if missing else "") + note + (f"; {adapted}" if adapted else "")
        return ProbeStatus(self.name, "ok", reason.lstrip("; "), detail)


def _reap(popen: subprocess.Popen[bytes], timeout_s: float) -> float:
    """Wait for a child (killing it after ``timeout_s``) and return the CPU seconds it used (os.wait4)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pid, status, ru = os.wait4(popen.pid, os.WNOHANG)
        except ChildProcessError:
            popen.returncode = popen.returncode if popen.returncode is not None else -1
            return 0.0
        if pid:
            popen.returncode = os.waitstatus_to_exitcode(status)
            return float(ru.ru_utime + ru.ru_stime)
        if time.monotonic() > deadline:
            with contextlib.suppress(OSError):
                popen.kill()
            deadline = time.monotonic() + 5.0
        time.sleep(0.02)


def _proc_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "gone"


def allowed_cores(pid: int) -> int | None:
    """How many cores ``pid`` may run on (its CPU affinity; None when it cannot be read)."""
    try:
        return len(psutil.Process(pid).cpu_affinity() or [])
    except (psutil.Error, OSError, AttributeError):
        return None


def _explain(stderr: str) -> str:
    """py-spy's own reason in one line: its ``Error:`` line, else the panic's message, else its last line.
    A permission problem is blamed only when py-spy says permission was denied, not whenever its message
    mentions ptrace (issue 12, defect 13: a non-Python process was blamed on ptrace, as root)."""
    lines = [s.strip() for s in stderr.splitlines() if s.strip()]
    err = next((s for s in lines if s.lower().startswith("error:")), None)
    panic = next((s for s in lines if "panicked at" in s), None)
    if err is not None:
        line = err.split(":", 1)[1].strip() or err
    elif panic is not None:  # "thread 'main' panicked at src/x.rs:1:2:" then the message on the next line
        i = lines.index(panic)
        after = panic.split("panicked at", 1)[1]
        msg = after.split(":", 3)[-1].strip() if after.count(":") >= 3 else ""
        line = msg or (lines[i + 1] if i + 1 < len(lines) else "py-spy crashed")
        line = f"py-spy crashed: {line}"
    else:
        line = lines[-1] if lines else "py-spy failed"
    line = line[:300]
    if _PERM_DENIED.search(stderr):  # (as root too: a container without CAP_SYS_PTRACE refuses root)
        return f"py-spy was refused ({line}). {PTRACE_FIX}"
    return line if line.startswith("py-spy") else f"py-spy failed: {line}"


# -- attach options -------------------------------------------------------------------------------------
def _build(o: Options, setup: ProbeSetup) -> PySpyProbe:
    return PySpyProbe(pid=o["pid"], rate=o["pyspy_rate"], nonblocking=not o["pyspy_blocking"])


SPEC = ProbeSpec(
    name=NAME, title="Host stacks (py-spy)",
    enabled=lambda o: bool(o["pyspy"]), build=_build,
    options=(
        ProbeOption("--pyspy", flag=True, help="Sample host stacks of every engine process with py-spy."),
        ProbeOption("--pid", type=int, help="Server PID for --pyspy (default: found from the listening port)."),
        ProbeOption("--pyspy-rate", type=int, default=10, show_default=True,
                    help="py-spy samples per second (10 Hz costs about 0.04 of a core; 50 Hz about 4x that)."),
        ProbeOption("--pyspy-blocking", flag=True,
                    help="Pause each process while sampling (exact stacks, more cost); default is nonblocking."),
    ),
)
