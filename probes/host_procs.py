"""The server's process tree and the /proc counters the pyspy probe samples (Linux).

``engine_tree`` finds the engine's Python processes under the server process and names their serving role;
``read_thread_cpu`` reads each thread's CPU time and run-queue wait (``/proc/<pid>/task/<tid>/stat`` and
``schedstat``: the direct CPU-contention signal, and the core it last ran on); ``read_system_cpu`` reads
``/proc/stat`` (steal); ``ForeignCpu`` samples the processes outside the engine that use the most CPU (name
and last core only, never a command line: command lines can hold secrets).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Literal, TypedDict
from urllib.parse import urlparse

import psutil

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class ProcInfo:
    pid: int
    ppid: int
    role: str
    name: str


def port_of(url: str) -> int | None:
    try:
        u = urlparse(url)
        return u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        return None


def pid_listening_on(port: int) -> int | None:
    """PID of the process with a TCP socket listening on ``port`` (None if none is visible to us)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    pids = sorted({c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   and c.pid})
    return pids[0] if pids else None


def role_of(name: str, cmdline: list[str], is_root: bool) -> str:
    text = " ".join([name, *cmdline[:1]])
    if "EngineCore" in text or "EngineCor" in name:
        return "engine_core"
    if "Worker" in text:
        return "worker"
    if is_root:
        return "api_server"
    return "other"


def _is_python(p: psutil.Process) -> bool:
    try:
        exe = os.path.basename(p.exe() or "")
        cmd = p.cmdline()
    except (psutil.Error, OSError):
        return False
    return exe.startswith("python") or bool(cmd and (cmd[0].startswith("VLLM::") or "python" in cmd[0]))


def python_state(pid: int) -> str:
    """"python" when ``pid`` runs a Python interpreter (what py-spy can sample), "other" when it does not,
    "denied" when this process may not look, "gone" when there is no such process."""
    try:
        p = psutil.Process(pid)
        exe = os.path.basename(p.exe() or "")
        cmd = p.cmdline()
    except psutil.NoSuchProcess:
        return "gone"
    except (psutil.AccessDenied, PermissionError):
        return "denied"
    except (psutil.Error, OSError):
        return "gone"
    python = exe.startswith("python") or bool(cmd and (cmd[0].startswith("VLLM::") or "python" in cmd[0]))
    return "python" if python else "other"


def own_tree() -> set[int]:
    """diagnose's own processes, never the server's: this one, its ancestors (what started it) and the helpers
    it started (the metrics parse worker; py-spy is not Python anyway). A server diagnose started itself
    (``diagnose run``) is its child too, and stays in."""
    me = psutil.Process()
    out = {me.pid}
    with contextlib.suppress(psutil.Error):
        out.update(p.pid for p in me.parents())
    with contextlib.suppress(psutil.Error):
        for c in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if any("diagnose.probes." in a for a in c.cmdline()[:4]):
                    out.add(c.pid)
    return out


def engine_tree(root_pid: int) -> list[ProcInfo]:
    """The root process and every Python descendant, with a serving role guessed from its title.

    diagnose's own process and its children are never part of it (``--pid 1`` is everyone's ancestor:
    issue 12, defect 13)."""
    root = psutil.Process(root_pid)
    mine = own_tree() - {root_pid}
    out: list[ProcInfo] = []
    for p in [root, *root.children(recursive=True)]:
        if p.pid in mine:
            continue
        try:
            name, cmd, ppid = p.name(), p.cmdline(), p.ppid()
        except (psutil.Error, OSError):
            continue
        if p.pid != root_pid and (not _is_python(p) or any("resource_tracker" in c for c in cmd[:4])):
            continue  # not Python, or multiprocessing's idle resource tracker
        title = cmd[0] if cmd and cmd[0].startswith("VLLM::") else name
        out.append(ProcInfo(p.pid, ppid, role_of(title, cmd, p.pid == root_pid), title))
    return out


class ThreadCpu(TypedDict):
    """One thread's cumulative counters (a ``thread_cpu`` record's fields, beside kind, t_ns and pid)."""

    tid: int
    comm: str
    state: str
    utime_s: float
    stime_s: float
    run_ns: int
    wait_ns: int
    slices: int
    cpu: int  # the core it last ran on (-1: not known)


class ForeignScan(TypedDict):
    """A ``foreign_scan`` record: one scan of every process, over [t0_ns, t_ns]."""

    kind: Literal["foreign_scan"]
    t0_ns: int
    t_ns: int
    processes: int
    engine_processes: int
    top_n: int
    min_cores: float


class ForeignCpuRecord(TypedDict):
    """A ``foreign_cpu`` record: a busy process outside the engine's tree over [t0_ns, t_ns]."""

    kind: Literal["foreign_cpu"]
    t0_ns: int
    t_ns: int
    pid: int
    name: str
    cpu_s: float
    cpu: int
    own: bool


def read_thread_cpu(pid: int) -> list[ThreadCpu]:
    """Cumulative CPU and run-queue counters of every thread of ``pid`` (empty if it is gone)."""
    rows: list[ThreadCpu] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return rows
    for t in tids:
        base = f"/proc/{pid}/task/{t}"
        try:
            with open(f"{base}/stat") as fh:
                stat = fh.read()
            with open(f"{base}/schedstat") as fh:
                sched = fh.read().split()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        rest = stat[stat.rfind(")") + 2:].split()
        rows.append({"tid": int(t), "comm": comm, "state": rest[0],
                     "utime_s": int(rest[11]) / _CLK_TCK, "stime_s": int(rest[12]) / _CLK_TCK,
                     "run_ns": int(sched[0]), "wait_ns": int(sched[1]), "slices": int(sched[2]),
                     "cpu": int(rest[36]) if len(rest) > 36 else -1})
    return rows


def read_all_processes() -> dict[int, tuple[str, int, float, int]]:
    """pid -> (name, ppid, cumulative CPU seconds user + system, last core) of every visible process, from
    ``/proc/<pid>/stat`` (one read each: 0.15x the CPU of psutil.process_iter for the same fields,
    benchmarks/results/host_foreign_scan.md). The name is the kernel's 15-character ``comm``."""
    out: dict[int, tuple[str, int, float, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for d in entries:
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue  # exited while we looked, or not ours to read
        end = stat.rfind(b")")
        rest = stat[end + 2:].split()
        if len(rest) < 37:
            continue
        name = stat[stat.find(b"(") + 1:end].decode("utf-8", "replace")
        out[int(d)] = (name, int(rest[1]), (int(rest[11]) + int(rest[12])) / _CLK_TCK, int(rest[36]))
    return out


def descendants(roots: Collection[int], ppid_of: dict[int, int]) -> set[int]:
    """``roots`` and every process below them, from a pid -> ppid map."""
    kids: dict[int, list[int]] = {}
    for pid, ppid in ppid_of.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo.extend(kids.get(pid, ()))
    return out


@dataclass
class ForeignCpu:
    """The busiest processes outside the engine's tree, for naming who competes for the engine's cores.

    Each ``sample`` reads every process's CPU counters (``read_all_processes``) and returns, for the
    interval since the previous sample, one ``foreign_scan`` record and a ``foreign_cpu`` record for each of
    the ``top_n`` processes outside the engine's tree that used at least ``min_cores`` of a core: pid, name,
    CPU seconds and the core it last ran on. Processes of this capture itself (diagnose, its py-spy
    children) carry ``own: true``: the load generator competing with the engine is a finding too."""

    engine_root: int
    top_n: int = 5
    min_cores: float = 0.05
    own_root: int = field(default_factory=os.getpid)
    _prev: tuple[int, dict[int, tuple[str, int, float, int]]] | None = None

    def sample(self, t_ns: int) -> list[ForeignScan | ForeignCpuRecord]:
        now = read_all_processes()
        prev, self._prev = self._prev, (t_ns, now)
        if prev is None or t_ns <= prev[0]:
            return []
        dt = (t_ns - prev[0]) / 1e9
        ppid_of = {pid: v[1] for pid, v in now.items()}
        engine = descendants([self.engine_root], ppid_of)
        own = descendants([self.own_root], ppid_of) - engine
        used = []
        for pid, (name, _, cpu_s, core) in now.items():
            before = prev[1].get(pid)
            if pid in engine or before is None or before[0] != name or before[2] > cpu_s:
                continue  # engine, new since the last scan, or a reused pid
            d = max(0.0, cpu_s - before[2])
            if d / dt >= self.min_cores:
                used.append((d, pid, name, core))
        used.sort(reverse=True)
        t0 = prev[0]
        recs: list[ForeignScan | ForeignCpuRecord] = [{"kind": "foreign_scan", "t0_ns": t0, "t_ns": t_ns, "processes": len(now),
                                       "engine_processes": len(engine), "top_n": self.top_n,
                                       "min_cores": self.min_cores}]
        recs += [{"kind": "foreign_cpu", "t0_ns": t0, "t_ns": t_ns, "pid": pid, "name": name, "cpu_s": round(d, 4),
                  "cpu": core, "own": pid in own} for d, pid, name, core in used[:self.top_n]]
        return recs


def read_system_cpu() -> dict[str, int] | None:
    """``ncpu`` and the machine's cumulative CPU ticks from ``/proc/stat`` (user ... steal); None where unreadable."""
    try:
        with open("/proc/stat") as fh:
            first = fh.readline().split()
    except OSError:
        return None
    keys = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]
    vals = [int(v) for v in first[1:9]] + [0] * (8 - len(first[1:9]))
    return {"ncpu": os.cpu_count() or 1, **dict(zip(keys, vals, strict=False))}


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (exited, not yet reaped by its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:stat.rfind(")") + 3] not in ("Z", "X")
