"""The server's process tree and the /proc counters the pyspy probe samples (Linux).

``engine_tree`` finds the engine's Python processes under the server process and names their serving role;
``read_thread_cpu`` reads each thread's CPU time and run-queue wait (``/proc/<pid>/task/<tid>/stat`` and
``schedstat``: the direct CPU-contention signal); ``read_system_cpu`` reads ``/proc/stat`` (steal).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
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


def engine_tree(root_pid: int) -> list[ProcInfo]:
    """The root process and every Python descendant, with a serving role guessed from its title."""
    root = psutil.Process(root_pid)
    out: list[ProcInfo] = []
    for p in [root, *root.children(recursive=True)]:
        try:
            name, cmd, ppid = p.name(), p.cmdline(), p.ppid()
        except (psutil.Error, OSError):
            continue
        if p.pid != root_pid and (not _is_python(p) or any("resource_tracker" in c for c in cmd[:4])):
            continue  # not Python, or multiprocessing's idle resource tracker
        title = cmd[0] if cmd and cmd[0].startswith("VLLM::") else name
        out.append(ProcInfo(p.pid, ppid, role_of(title, cmd, p.pid == root_pid), title))
    return out


def read_thread_cpu(pid: int) -> list[dict[str, Any]]:
    """Cumulative CPU and run-queue counters of every thread of ``pid`` (empty if it is gone)."""
    rows: list[dict[str, Any]] = []
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
                     "run_ns": int(sched[0]), "wait_ns": int(sched[1]), "slices": int(sched[2])})
    return rows


def read_system_cpu() -> dict[str, Any] | None:
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
