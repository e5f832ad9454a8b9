"""Host evidence (stream ``host_samples`` from probes/pyspy.py) -> tables and signals (report sections:
reports/sections/host.py).

Tables (t_s = seconds since the clock anchor):

* ``host_processes``: ``pid, ppid, role, name, cpus`` (the cores its CPU affinity allows; NaN in older bundles).
* ``host_threads``: one row per thread per /proc sampling interval: ``t0_s, t_s, pid, tid, role, comm,
  cpu_ratio`` (cores used over the interval), ``run_ratio``, ``wait_ratio`` (schedstat run / run-queue wait
  per wall second), ``cpu_s, run_s, wait_s`` (seconds in the interval), ``core`` (the core it last ran on
  at the interval's end; -1 where the probe did not record it).
* ``host_foreign``: the busiest processes outside the engine, one row per process per scan interval:
  ``t0_s, t_s, pid, name, cpu_s, cpu_ratio, core, own`` (own: this capture's own processes).
* ``host_foreign_scans``: ``t0_s, t_s, processes`` (one row per scan; present when the probe scanned).
* ``host_system``: ``t0_s, t_s, steal_ratio, busy_ratio, ncpu`` (whole machine, from /proc/stat; ``ncpu``: its
  cores as the probe's host counted them).
* ``host_stacks``: ``t0_s, t_s`` (the py-spy window), ``pid, tid, role, thread, stack`` (frames
  ";"-joined, root first), ``leaf, category, samples`` (py-spy active samples in that window).
* ``host_dumps``: ``t_s, pid, tid, name, active, gil`` (py-spy dump snapshots).
* ``host_pyspy_cost``: ``pid, mode, cpu_s, wall_s, samples, rate_hz, nonblocking``.

Who decides contention (``thread_wait``): each engine thread over a window is ``work`` (it does the model
work or serves the API), ``poll_loop`` (a loop that polls or yields the CPU by design: every thread of vLLM's
``EngineCore`` process, whose busy loop calls sched_yield so that its run-queue wait is high on an idle
machine too, threads named as a messaging library's pollers (``ZMQbg/*``, ``gloo_tcp_loop``), and any thread
whose py-spy samples are mostly ``spin_wait``/``waiting``) or ``idle`` (runnable under 5% of the time, or
on a CPU under 2% of a core: background threads whose few wake-ups wait long and say nothing). Only ``work`` threads decide contention; the victim is the work
thread that lost the most time waiting, and the competitor the process outside the engine that used the most
of the victim's core.

CPU by category: each thread's CPU seconds (from /proc) are split over categories by the shares of its
py-spy samples; threads without Python stacks (OpenMP/BLAS pools) count as ``native`` (``model_forward``
in a ``worker`` process, whose native threads run the model's kernels). py-spy records
in windows of ``window_s`` (default 30 s): a signal window takes the stack windows that overlap it.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from diagnose.analysis import Window
from diagnose.io.bundle import Bundle
from diagnose.model import Signal, Source
from diagnose.normalize import TableContext
from diagnose.normalize.host_stacks import CATEGORIES, CATEGORY_TEXT, categorize

SOURCE: Source = "host"
BUSY_THREAD_MIN_RATIO = 0.05  # threads runnable (running or waiting) less than this are left out of contention
# a thread on a CPU less than this share of a core is a background poller, not a working thread (real vLLM
# runs: ZMQ and gloo threads 0.001-0.007 cores; the worker's main thread 0.22 when starved, 0.85-0.92 when not)
WORK_THREAD_MIN_CORES = 0.02
# a thread whose py-spy samples are at least this share spin_wait + waiting is a poll/yield loop (real vLLM:
# EngineCore main thread 0.72-0.82, worker main thread 0.20-0.30)
POLL_LOOP_MIN_SHARE = 0.5
# threads known by name to be pollers of a messaging library (ZMQ's I/O threads, gloo's TCP loops): they wake
# briefly and often, so the little they run waits long; they never do the model's or the API's work
POLL_THREADS = re.compile(r"^(ZMQbg/|gloo_tcp_loop|pt_gloo_runloop)")
POLL_ROLES = {"engine_core": "vLLM EngineCore process: its busy loop yields the CPU by design, its other threads poll sockets"}
_COLS = {
    "host_processes": ["pid", "ppid", "role", "name", "cpus"],
    "host_threads": ["t0_s", "t_s", "pid", "tid", "role", "comm", "cpu_ratio", "run_ratio", "wait_ratio",
                     "cpu_s", "run_s", "wait_s", "core"],
    "host_foreign": ["t0_s", "t_s", "pid", "name", "cpu_s", "cpu_ratio", "core", "own"],
    "host_foreign_scans": ["t0_s", "t_s", "processes"],
    "host_system": ["t0_s", "t_s", "steal_ratio", "busy_ratio", "ncpu"],
    "host_stacks": ["t0_s", "t_s", "pid", "tid", "role", "thread", "stack", "leaf", "category", "samples"],
    "host_dumps": ["t_s", "pid", "tid", "name", "active", "gil"],
    "host_pyspy_cost": ["pid", "mode", "cpu_s", "wall_s", "samples", "rate_hz", "nonblocking"],
}


def _empty() -> dict[str, pd.DataFrame]:
    return {k: pd.DataFrame(columns=v) for k, v in _COLS.items()}


class ProcessRow(TypedDict):
    """A row of ``host_processes``: an engine process the probe found."""

    pid: int
    ppid: int
    role: str
    name: str
    cpus: float  # its CPU affinity's size (NaN: not recorded)


class ThreadRow(TypedDict):
    """A row of ``host_threads``: one thread's CPU use between two samples."""

    t0_s: float
    t_s: float
    pid: int
    tid: int
    role: str
    comm: str
    cpu_ratio: float
    run_ratio: float
    wait_ratio: float
    cpu_s: float
    run_s: float
    wait_s: float
    core: int


class ForeignRow(TypedDict):
    """A row of ``host_foreign``: a busy process outside the engine over one scan."""

    t0_s: float
    t_s: float
    pid: int
    name: str
    cpu_s: float
    cpu_ratio: float
    core: int
    own: bool


class SystemRow(TypedDict):
    """A row of ``host_system``: the whole host's CPU between two samples."""

    t0_s: float
    t_s: float
    steal_ratio: float
    busy_ratio: float
    ncpu: float


def _thread_rows(cpu: list[dict[str, Any]], anchor: int, roles: dict[int, str]) -> list[ThreadRow]:
    prev: dict[tuple[int, int], dict[str, Any]] = {}
    rows: list[ThreadRow] = []
    for r in sorted(cpu, key=lambda r: r["t_ns"]):
        key = (int(r["pid"]), int(r["tid"]))
        p = prev.get(key)
        prev[key] = r
        if p is None:
            continue
        dt = (r["t_ns"] - p["t_ns"]) / 1e9
        if dt <= 0:
            continue
        cpu_s = max(0.0, (r["utime_s"] + r["stime_s"]) - (p["utime_s"] + p["stime_s"]))
        run_s = max(0.0, (r["run_ns"] - p["run_ns"]) / 1e9)
        wait_s = max(0.0, (r["wait_ns"] - p["wait_ns"]) / 1e9)
        rows.append({"t0_s": (p["t_ns"] - anchor) / 1e9, "t_s": (r["t_ns"] - anchor) / 1e9, "pid": key[0],
                     "tid": key[1], "role": roles.get(key[0], "other"), "comm": str(r.get("comm", "")),
                     "cpu_ratio": cpu_s / dt, "run_ratio": run_s / dt, "wait_ratio": wait_s / dt,
                     "cpu_s": cpu_s, "run_s": run_s, "wait_s": wait_s, "core": int(r.get("cpu", -1))})
    return rows


def _foreign_rows(recs: list[dict[str, Any]], anchor: int) -> list[ForeignRow]:
    rows: list[ForeignRow] = []
    for r in recs:
        dt = (int(r["t_ns"]) - int(r["t0_ns"])) / 1e9
        if dt <= 0:
            continue
        cpu_s = float(r.get("cpu_s", 0.0))
        rows.append({"t0_s": (int(r["t0_ns"]) - anchor) / 1e9, "t_s": (int(r["t_ns"]) - anchor) / 1e9,
                     "pid": int(r.get("pid", 0)), "name": str(r.get("name", "")), "cpu_s": cpu_s,
                     "cpu_ratio": cpu_s / dt, "core": int(r.get("cpu", -1)), "own": bool(r.get("own"))})
    return rows


def _system_rows(sysc: list[dict[str, Any]], anchor: int) -> list[SystemRow]:
    rows: list[SystemRow] = []
    keys = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    srt = sorted(sysc, key=lambda r: r["t_ns"])
    for p, r in zip(srt, srt[1:], strict=False):
        d = {k: max(0, int(r.get(k, 0)) - int(p.get(k, 0))) for k in keys}
        total = sum(d.values())
        if total <= 0:
            continue
        rows.append({"t0_s": (p["t_ns"] - anchor) / 1e9, "t_s": (r["t_ns"] - anchor) / 1e9,
                     "steal_ratio": d["steal"] / total,
                     "busy_ratio": 1.0 - (d["idle"] + d["iowait"]) / total,
                     "ncpu": float(r["ncpu"]) if isinstance(r.get("ncpu"), int) and r["ncpu"] > 0 else math.nan})
    return rows


def tables(bundle: Bundle, ctx: TableContext | None = None) -> dict[str, pd.DataFrame]:
    if not bundle.has_stream("host_samples"):
        return _empty()
    anchor = bundle.anchor_mono_ns
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in bundle.iter_records("host_samples"):
        by_kind[str(r.get("kind", ""))].append(r)
    procs: list[ProcessRow] = [
        {"pid": int(r["pid"]), "ppid": int(r.get("ppid", 0)), "role": str(r.get("role", "other")),
         "name": str(r.get("name", "")), "cpus": float(r["cpus"]) if isinstance(r.get("cpus"), int) else math.nan}
        for r in by_kind["process"] if "pid" in r]
    roles: dict[int, str] = {int(p["pid"]): str(p["role"]) for p in procs}
    cpu = [r for r in by_kind["thread_cpu"] if {"t_ns", "pid", "tid", "utime_s", "stime_s", "run_ns",
                                                     "wait_ns"} <= r.keys()]
    stacks = []
    for r in by_kind["stack"]:
        frames = [str(f) for f in r.get("frames") or []]
        pid = int(r.get("pid", 0))
        t0 = (int(r.get("start_ns", anchor)) - anchor) / 1e9
        t1 = (int(r.get("end_ns", r.get("start_ns", anchor))) - anchor) / 1e9
        stacks.append({"t0_s": t0, "t_s": t1, "pid": pid, "tid": int(r.get("tid", 0)), "role": roles.get(pid, "other"),
                       "thread": str(r.get("thread", "")), "stack": ";".join(frames),
                       "leaf": frames[-1] if frames else "", "category": categorize(frames),
                       "samples": int(r.get("count", 0))})
    dumps = [{"t_s": (r["t_ns"] - anchor) / 1e9, "pid": int(r["pid"]), "tid": th.get("tid"),
              "name": th.get("name", ""), "active": bool(th.get("active")), "gil": bool(th.get("gil"))}
             for r in by_kind["dump"] if "t_ns" in r for th in r.get("threads") or [] if isinstance(th, dict)]
    cost = [{k: r.get(k) for k in _COLS["host_pyspy_cost"]} for r in by_kind["pyspy_cost"]]
    data = {"host_processes": procs, "host_threads": _thread_rows(cpu, anchor, roles),
            "host_system": _system_rows([r for r in by_kind["system_cpu"] if "t_ns" in r], anchor),
            "host_stacks": stacks, "host_dumps": dumps, "host_pyspy_cost": cost,
            "host_foreign": _foreign_rows([r for r in by_kind["foreign_cpu"] if {"t0_ns", "t_ns"} <= r.keys()],
                                          anchor),
            "host_foreign_scans": [{"t0_s": (int(r["t0_ns"]) - anchor) / 1e9, "t_s": (int(r["t_ns"]) - anchor) / 1e9,
                                    "processes": int(r.get("processes", 0))}
                                   for r in by_kind["foreign_scan"] if {"t0_ns", "t_ns"} <= r.keys()]}
    return {k: pd.DataFrame(v, columns=_COLS[k]) for k, v in data.items()}


def _in_window(df: pd.DataFrame, w: Window) -> pd.DataFrame:
    if df.empty:
        return df
    return df[(df["t_s"] > w.start_s) & (df["t0_s"] < w.end_s)]


def thread_categories(t: dict[str, pd.DataFrame], w: Window | None = None) -> pd.DataFrame:
    """Per (pid, tid, category): the share of that thread's samples (columns pid, tid, category, frac)."""
    st = t.get("host_stacks", pd.DataFrame(columns=_COLS["host_stacks"]))
    st = _in_window(st, w) if w is not None else st
    if st.empty:
        return pd.DataFrame(columns=["pid", "tid", "category", "frac"])
    g = st.groupby(["pid", "tid", "category"], as_index=False)["samples"].sum()
    g["frac"] = g["samples"] / g.groupby(["pid", "tid"])["samples"].transform("sum")
    return g[["pid", "tid", "category", "frac"]]


def category_cpu(t: dict[str, pd.DataFrame], w: Window | None = None,
                 fr: pd.DataFrame | None = None) -> dict[str, float]:
    """CPU seconds per category over the window (thread CPU time split by its samples' categories; ``fr``:
    ``thread_categories(t, w)`` where the caller has it)."""
    th = t.get("host_threads", pd.DataFrame(columns=_COLS["host_threads"]))
    th = _in_window(th, w) if w is not None else th
    fr = thread_categories(t, w) if fr is None else fr
    out = dict.fromkeys(CATEGORIES, 0.0)
    if th.empty:  # no /proc counters: fall back to sample counts
        st = t.get("host_stacks", pd.DataFrame(columns=_COLS["host_stacks"]))
        st = _in_window(st, w) if w is not None else st
        for cat, n in st.groupby("category")["samples"].sum().items():
            out[str(cat)] += float(n)
        return out
    per_thread = th.groupby(["pid", "tid", "role"], as_index=False)["cpu_s"].sum()
    fmap: dict[tuple[int, int], list[tuple[str, float]]] = defaultdict(list)
    for r in fr.itertuples(index=False):
        fmap[(int(r.pid), int(r.tid))].append((str(r.category), float(r.frac)))
    for r in per_thread.itertuples(index=False):
        shares = fmap.get((int(r.pid), int(r.tid)))
        if shares:
            for cat, f in shares:
                out[cat] += float(r.cpu_s) * f
        else:
            out["model_forward" if r.role == "worker" else "native"] += float(r.cpu_s)
    return out


def _spin_frac(fr: pd.DataFrame) -> dict[tuple[int, int], float]:
    sp = fr[fr["category"] == "spin_wait"]
    return {(int(r.pid), int(r.tid)): float(r.frac) for r in sp.itertuples(index=False)}


def _thread_label(t: dict[str, pd.DataFrame], pid: int, tid: int, comm: str) -> str:
    st = t.get("host_stacks", pd.DataFrame(columns=_COLS["host_stacks"]))
    names = st[(st["pid"] == pid) & (st["tid"] == tid)]["thread"]
    name = str(names.iloc[0]) if not names.empty and names.iloc[0] else comm
    procs = t.get("host_processes", pd.DataFrame(columns=_COLS["host_processes"]))
    role = procs[procs["pid"] == pid]["role"]
    return f"{role.iloc[0] if not role.empty else 'process'} {pid} thread {name!r} ({tid})"


def signals(t: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    th = _in_window(t.get("host_threads", pd.DataFrame(columns=_COLS["host_threads"])), window)
    st = _in_window(t.get("host_stacks", pd.DataFrame(columns=_COLS["host_stacks"])), window)
    out: list[Signal] = []
    fr = thread_categories(t, window)  # once per window: category_cpu, the spin share and thread_wait read it
    if not st.empty:
        cats = category_cpu(t, window, fr)
        total = sum(cats.values())
        if total > 0:
            for cat, v in cats.items():
                out.append(Signal(f"host_{cat}_cpu_share_ratio", v / total, "ratio", SOURCE,
                                  f"share of the engine processes' CPU time in {CATEGORY_TEXT[cat]}"))
            out.append(Signal("host_spin_wait_share_ratio", cats["spin_wait"] / total, "ratio", SOURCE,
                              "share of the engine processes' CPU time spent spin-waiting"))
    if not th.empty:
        out.extend(_thread_signals(t, th, fr))
    out.extend(_contention_signals(t, th, window, fr))
    out.extend(_gil_signals(t, window))
    return out


def _thread_signals(t: dict[str, pd.DataFrame], th: pd.DataFrame, fr: pd.DataFrame) -> list[Signal]:
    spin = _spin_frac(fr)
    cpu_a, t0_a, t1_a = (th[c].to_numpy(dtype=float) for c in ("cpu_s", "t0_s", "t_s"))
    comm_a = th["comm"].to_numpy()
    # per thread (groupby order): CPU seconds over its span (spin-wait included), and without the spin-wait
    span = []
    for pid, tid, idx in _groups(th):
        busy = float(cpu_a[idx].sum()) / max(float(t1_a[idx].max() - t0_a[idx].min()), 1e-9)
        span.append((pid, tid, idx, busy, busy * (1.0 - spin.get((pid, tid), 0.0)), str(comm_a[idx[0]])))
    out = []
    pid, tid, _, busy, _, comm = max(span, key=lambda r: r[3])  # the first of a tie, as idxmax
    out.append(Signal("host_thread_busy_max_ratio", busy, "ratio", SOURCE,
                      f"busiest engine thread's CPU share of one core, spin-wait included: "
                      f"{_thread_label(t, pid, tid, comm)}"))
    pid, tid, idx, _, useful, comm = max(span, key=lambda r: r[4])
    sp = 1.0 - spin.get((pid, tid), 0.0)
    ts_a, ratio_a = th["t_s"].to_numpy(dtype=float), th["cpu_ratio"].to_numpy(dtype=float)
    series = tuple((float(ts_a[i]), float(ratio_a[i]) * sp) for i in idx)
    out.append(Signal("host_thread_saturated_max_ratio", useful, "ratio", SOURCE,
                      f"busiest engine thread's on-CPU share of one core, spin-wait excluded: "
                      f"{_thread_label(t, pid, tid, comm)}", series))
    total = th.groupby("t_s")["cpu_ratio"].sum()
    cpus = t.get("host_processes", pd.DataFrame(columns=_COLS["host_processes"])).get("cpus")
    if cpus is not None and cpus.notna().any():
        out.append(Signal("host_engine_cores_allowed", float(cpus.max()), "cores", SOURCE,
                          "cores the engine's processes may run on (CPU affinity; the most any one of them may use)"))
    out.append(Signal("host_engine_cpu_cores_mean", float(th["cpu_s"].sum() / max(1e-9, th["t_s"].max()
                      - th["t0_s"].min())), "cores", SOURCE, "CPU used by all engine processes (cores)",
                      tuple((float(k), float(v)) for k, v in total.items())))
    return out


THREAD_WAIT_COLS = ["pid", "tid", "role", "process", "thread", "cpu_s", "run_s", "wait_s", "dur_s", "run_ratio",
                    "runnable_ratio", "wait_share", "core", "loop_share", "kind", "why"]


def _groups(th: pd.DataFrame) -> list[tuple[int, int, np.ndarray]]:
    """The rows of each (pid, tid) of ``th``, in the order of ``th.groupby(["pid", "tid"])`` (keys ascending,
    rows in table order within a group): one pandas groupby per thread costs a millisecond, these are a slice."""
    pid, tid = th["pid"].to_numpy(), th["tid"].to_numpy()
    order = np.lexsort((tid, pid))  # stable: a group's rows keep their order
    sp, st = pid[order], tid[order]
    cut = np.flatnonzero((sp[1:] != sp[:-1]) | (st[1:] != st[:-1])) + 1
    return [(int(sp[a]), int(st[a]), order[a:b]) for a, b in zip([0, *cut], [*cut, len(order)], strict=True)]


def thread_wait(t: dict[str, pd.DataFrame], w: Window | None = None, fr: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per engine thread over the window: run-queue wait and what the thread is (module docstring).

    ``wait_share`` = wait / (run + wait); ``runnable_ratio`` = (run + wait) per wall second; ``core`` the core
    it ran on most often (-1 unknown); ``loop_share`` the share of its py-spy samples in spin_wait/waiting
    (NaN without samples); ``kind`` work | poll_loop | idle, and ``why`` in words. ``fr``:
    ``thread_categories(t, w)`` where the caller has it."""
    th = t.get("host_threads", pd.DataFrame(columns=_COLS["host_threads"]))
    th = _in_window(th, w) if w is not None else th
    if th.empty:
        return pd.DataFrame(columns=THREAD_WAIT_COLS)
    if "core" not in th.columns:
        th = th.assign(core=-1)
    dur = max(1e-9, float(th["t_s"].max() - th["t0_s"].min()))
    fr = thread_categories(t, w) if fr is None else fr
    loop = fr[fr["category"].isin(["spin_wait", "waiting"])].groupby(["pid", "tid"])["frac"].sum().to_dict()
    sampled = set(zip(fr["pid"].astype(int), fr["tid"].astype(int), strict=False))
    st = t.get("host_stacks", pd.DataFrame(columns=_COLS["host_stacks"]))
    names = st[st["thread"] != ""].groupby(["pid", "tid"])["thread"].first().to_dict() if not st.empty else {}
    procs = t.get("host_processes", pd.DataFrame(columns=_COLS["host_processes"]))
    pname = dict(zip(procs["pid"].astype(int), procs["name"].astype(str), strict=False))
    run_a, wait_a, cpu_a = (th[c].to_numpy(dtype=float) for c in ("run_s", "wait_s", "cpu_s"))
    core_a, role_a, comm_a = th["core"].to_numpy(), th["role"].to_numpy(), th["comm"].to_numpy()
    rows = []
    for pid, tid, idx in _groups(th):
        # the sums as pandas takes them over one group (numpy's sum of the group's values in table order)
        run, wait, cpu = float(run_a[idx].sum()), float(wait_a[idx].sum()), float(cpu_a[idx].sum())
        cores = core_a[idx]
        known = cores[cores >= 0]
        if len(known):
            vals, counts = np.unique(known, return_counts=True)
            core = int(vals[int(np.argmax(counts))])  # the most frequent; the smallest of a tie, as Series.mode
        else:
            core = -1
        first = int(idx[0])
        role, comm = str(role_a[first]), str(comm_a[first])
        lshare = float(loop.get((pid, tid), 0.0)) if (pid, tid) in sampled else math.nan
        runnable, run_ratio = (run + wait) / dur, run / dur
        thread = str(names.get((pid, tid)) or comm)
        if role in POLL_ROLES:
            kind, why = "poll_loop", POLL_ROLES[role]
        elif POLL_THREADS.match(thread) or POLL_THREADS.match(comm):
            kind, why = "poll_loop", "a messaging library's polling thread (by name)"
        elif lshare >= POLL_LOOP_MIN_SHARE:
            kind, why = "poll_loop", f"{lshare:.0%} of its py-spy samples spin or wait"
        elif runnable < BUSY_THREAD_MIN_RATIO:
            kind, why = "idle", f"runnable {runnable:.0%} of the time"
        elif run_ratio < WORK_THREAD_MIN_CORES:
            kind, why = "idle", f"on a CPU {run_ratio:.1%} of a core: a background poller"
        else:
            kind, why = "work", ""
        rows.append({"pid": pid, "tid": tid, "role": role, "process": pname.get(pid, ""),
                     "thread": thread, "cpu_s": cpu, "run_s": run,
                     "wait_s": wait, "dur_s": dur, "run_ratio": run_ratio, "runnable_ratio": runnable,
                     "wait_share": wait / (run + wait) if run + wait > 0 else math.nan, "core": core,
                     "loop_share": lshare, "kind": kind, "why": why})
    return pd.DataFrame(rows, columns=THREAD_WAIT_COLS)


def _share(df: pd.DataFrame) -> float | None:
    run, wait = float(df["run_s"].sum()), float(df["wait_s"].sum())
    return wait / (run + wait) if run + wait > 0 else None


def _kahan(values: Any) -> float:
    """A sum as pandas' groupby takes it (compensated), so that a group's total is the same to the last bit."""
    total = comp = 0.0
    for v in values:
        if v == v:  # NaN is left out
            y = float(v) - comp
            s = total + y
            comp = s - total - y
            total = s
    return total


def process_wait(tw: pd.DataFrame) -> pd.DataFrame:
    """Per engine process: the run-queue wait share of its working threads (columns pid, role, process,
    wait_share, run_s, wait_s, threads), worst first."""
    cols = ["pid", "role", "process", "run_s", "wait_s", "threads"]
    wk = tw[tw["kind"] == "work"]
    if wk.empty:
        return pd.DataFrame(columns=["pid", "role", "process", "wait_share", "run_s", "wait_s", "threads"])
    groups: dict[tuple[Any, Any, Any], list[int]] = defaultdict(list)
    for i, key in enumerate(zip(wk["pid"], wk["role"], wk["process"], strict=True)):
        groups[key].append(i)
    run_a, wait_a = wk["run_s"].to_numpy(dtype=float), wk["wait_s"].to_numpy(dtype=float)
    g = pd.DataFrame([(*k, _kahan(run_a[ix]), _kahan(wait_a[ix]), len(ix)) for k, ix in sorted(groups.items())],
                     columns=cols)
    g["wait_share"] = g["wait_s"] / (g["run_s"] + g["wait_s"]).clip(lower=1e-12)
    return g.sort_values(["wait_share", "wait_s"], ascending=False).reset_index(drop=True)


def victim(tw: pd.DataFrame) -> pd.Series | None:
    """The working thread that lost the most time waiting for a CPU (None without working threads)."""
    wk = tw[tw["kind"] == "work"]
    if wk.empty:
        return None
    return wk.sort_values(["wait_s", "wait_share"], ascending=False).iloc[0]


def foreign_on_core(t: dict[str, pd.DataFrame], w: Window | None, core: int) -> pd.DataFrame:
    """Processes outside the engine over the window, busiest on ``core`` first (columns pid, name, own,
    cores (of all cores), core_ratio (share of ``core``; all its CPU when ``core`` is -1), core (most
    frequent)). Empty when the probe did not scan; one row per process seen."""
    fo = t.get("host_foreign", pd.DataFrame(columns=_COLS["host_foreign"]))
    sc = t.get("host_foreign_scans", pd.DataFrame(columns=_COLS["host_foreign_scans"]))
    if w is not None:
        fo, sc = _in_window(fo, w), _in_window(sc, w)
    cols = ["pid", "name", "own", "cores", "core_ratio", "core"]
    if sc.empty or fo.empty:
        return pd.DataFrame(columns=cols)
    span = max(1e-9, float(sc["t_s"].max() - sc["t0_s"].min()))
    rows = []
    for (pid, name), g in fo.groupby(["pid", "name"]):
        on = g if core < 0 else g[g["core"] == core]
        rows.append({"pid": int(pid), "name": str(name), "own": bool(g["own"].any()),
                     "cores": float(g["cpu_s"].sum()) / span, "core_ratio": float(on["cpu_s"].sum()) / span,
                     "core": int(g["core"].mode().iloc[0])})
    return pd.DataFrame(rows, columns=cols).sort_values(["core_ratio", "cores"], ascending=False).reset_index(drop=True)


def _who(r: Any) -> str:
    return f"thread {r.thread!r} (tid {int(r.tid)}) of {r.role} process {int(r.pid)} ({r.process or '?'})"


def _contention_signals(t: dict[str, pd.DataFrame], th: pd.DataFrame, window: Window,
                        fr: pd.DataFrame) -> list[Signal]:
    out = []
    series: list[tuple[float, float]] = []
    ratio = None
    if not th.empty:
        out.extend(_all_threads_wait(th))
        tw = thread_wait(t, window, fr)
        pw = process_wait(tw)
        loops = tw[(tw["kind"] == "poll_loop") & (tw["runnable_ratio"] >= BUSY_THREAD_MIN_RATIO)]
        lw = _share(loops)
        if lw is not None:
            top = loops.sort_values("runnable_ratio", ascending=False)
            more = f"; and {len(top) - 3} more" if len(top) > 3 else ""
            out.append(Signal("host_poll_loop_wait_ratio", lw, "ratio", SOURCE,
                              "run-queue wait / (run + wait) of the engine's poll/yield loops (not judged: "
                              "they yield the CPU by design): " + "; ".join(
                                  f"{_who(r)} {r.wait_share:.0%}" for r in top.head(3).itertuples(index=False))
                              + more))
        for role, name in (("worker", "host_worker_wait_ratio"), ("api_server", "host_api_server_wait_ratio")):
            pr = pw[pw["role"] == role]
            if not pr.empty:
                out.append(Signal(name, float(pr["wait_share"].max()), "ratio", SOURCE,
                                  f"run-queue wait / (run + wait) of the {role} process's working threads "
                                  f"(process {int(pr['pid'].iloc[0])}, {pr['process'].iloc[0]})"))
        if not loops.empty and not _in_window(t.get("host_foreign_scans", pd.DataFrame(
                columns=_COLS["host_foreign_scans"])), window).empty:
            out.extend(_loop_competitor(t, window, loops))
        v = victim(tw)
        work = tw[tw["kind"] == "work"]
        ratio = _share(work)
        if v is not None and ratio is not None:
            where = f" on core {int(v.core)}" if v.core >= 0 else ""
            desc = ("run-queue wait / (run + wait) of the engine's working threads (poll/yield loops and background "
                    "pollers excluded): " + ", ".join(f"{r.role} {int(r.pid)} {r.wait_share:.0%}"
                                                      for r in pw.itertuples(index=False)))
            working = set(zip(work["pid"], work["tid"], strict=False))
            one = th[[(int(p), int(i)) in working for p, i in zip(th["pid"], th["tid"], strict=False)]]
            per_t = one.groupby("t_s")[["run_s", "wait_s"]].sum()
            tot = per_t["run_s"] + per_t["wait_s"]
            series = [(float(k), float(w / s)) for k, w, s in zip(per_t.index, per_t["wait_s"], tot, strict=False)
                      if s > 0]
            out.append(Signal("host_work_wait_ratio", ratio, "ratio", SOURCE, desc, tuple(series)))
            out.append(Signal("host_victim_wait_ratio", float(v.wait_share), "ratio", SOURCE,
                              f"{_who(v)} waited {v.wait_share:.0%} of its runnable time for a CPU{where} "
                              f"(ran {v.run_ratio:.2f} of a core, waited {v.wait_s / v.dur_s:.2f} s/s)"))
            fo = foreign_on_core(t, window, int(v.core))
            sc = t.get("host_foreign_scans", pd.DataFrame(columns=_COLS["host_foreign_scans"]))
            if not _in_window(sc, window).empty:
                out.extend(_competitor_signals(fo, v, where))
    sysdf = _in_window(t.get("host_system", pd.DataFrame(columns=_COLS["host_system"])), window)
    steal = None
    if not sysdf.empty:
        steal = float(sysdf["steal_ratio"].mean())
        out.append(Signal("host_cpu_steal_ratio", steal, "ratio", SOURCE,
                          "CPU time stolen by the hypervisor, share of all CPU time"))
        out.append(Signal("host_cpu_busy_ratio", float(sysdf["busy_ratio"].mean()), "ratio", SOURCE,
                          "whole machine CPU busy share (all processes)"))
        ncpu = sysdf["ncpu"].dropna() if "ncpu" in sysdf.columns else pd.Series(dtype=float)
        if len(ncpu):
            out.append(Signal("host_cores", float(ncpu.max()), "cores", SOURCE,
                              "cores of the server's machine (the host probe's count, beside /proc/stat)"))
    if ratio is not None or steal is not None:
        val = max(v for v in (ratio, steal) if v is not None)
        out.append(Signal("host_cpu_steal_or_contention_ratio", val, "ratio", SOURCE,
                          "max of host_work_wait_ratio (run-queue wait of the engine's working threads, poll/yield "
                          "loops excluded) and hypervisor steal: time the engine's work was ready to run but had "
                          "no CPU", tuple(series)))
    return out


def _loop_competitor(t: dict[str, pd.DataFrame], window: Window, loops: pd.DataFrame) -> list[Signal]:
    """The poll/yield loop (EngineCore's busy loop...) that shares its core with the busiest process outside the
    engine: a loop's own wait is high by design, so it is never judged alone, but a foreign process that takes a
    large share of the very core the loop runs on is contention all the same (the scheduler loop is late)."""
    best: tuple[float, Any, Any] | None = None
    for r in loops[loops["core"] >= 0].itertuples(index=False):
        fo = foreign_on_core(t, window, int(r.core))
        if fo.empty:
            continue
        c = next(fo.itertuples(index=False))
        if best is None or float(c.core_ratio) > best[0]:
            best = (float(c.core_ratio), r, c)
    if best is None or best[0] <= 0:
        return [Signal("host_loop_competitor_core_ratio", 0.0, "ratio", SOURCE,
                       "no process outside the engine used the core of any of its poll/yield loops")]
    share, r, c = best
    own = ", this capture's own process" if c.own else ""
    return [Signal("host_loop_competitor_core_ratio", share, "ratio", SOURCE,
                   f"process {int(c.pid)} ({c.name}{own}) took {share:.0%} of core {int(r.core)} that the poll loop "
                   f"{_who(r)} runs on (it waited {r.wait_share:.0%} of its runnable time)")]


def _competitor_signals(fo: pd.DataFrame, v: Any, where: str) -> list[Signal]:
    core = f"core {int(v.core)}" if v.core >= 0 else "a core (the victim's core was not recorded)"
    total = float(fo["cores"].sum()) if not fo.empty else 0.0
    out = [Signal("host_foreign_cpu_cores", total, "cores", SOURCE,
                  "CPU used by the busiest processes outside the engine (the probe's top consumers per scan): "
                  + (", ".join(f"{int(r.pid)} ({r.name}{', this capture' if r.own else ''}) {r.cores:.2f}"
                               for r in fo.head(5).itertuples(index=False)) or "none above 5% of a core"))]
    if fo.empty or float(fo["core_ratio"].iloc[0]) <= 0:
        out.append(Signal("host_competitor_core_ratio", 0.0, "ratio", SOURCE,
                          f"no process outside the engine used {core} that {_who(v)} needed"))
        return out
    c = next(fo.itertuples(index=False))
    own = ", this capture's own process" if c.own else ""
    out.append(Signal("host_competitor_core_ratio", float(c.core_ratio), "ratio", SOURCE,
                      f"process {int(c.pid)} ({c.name}{own}) took {c.core_ratio:.0%} of {core} that {_who(v)} needed"
                      f" (it waited {v.wait_share:.0%} of its runnable time{where})"))
    return out


def _all_threads_wait(th: pd.DataFrame) -> list[Signal]:
    """The run-queue wait of every runnable engine thread, poll loops included (kept for comparison)."""
    dur = max(1e-9, th["t_s"].max() - th["t0_s"].min())
    # threads that wanted a CPU (on it or waiting for it) at least 5% of the time: a thread starved by
    # contention uses little CPU, so selecting by CPU alone would drop exactly the victims
    g = th.groupby(["pid", "tid"])
    runnable = (g["run_s"].sum() + g["wait_s"].sum()) / dur
    busy = set(runnable[runnable >= BUSY_THREAD_MIN_RATIO].index)
    bt = th[[(int(p), int(i)) in busy for p, i in zip(th["pid"], th["tid"], strict=False)]]
    r = _share(bt) if not bt.empty else None
    if r is None:
        return []
    return [Signal("host_run_queue_wait_ratio", r, "ratio", SOURCE,
                   "run-queue wait / (run + wait) of every engine thread runnable at least 5% of the time, poll "
                   "loops included (not judged: see host_work_wait_ratio)")]


def _gil_signals(t: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    d = t.get("host_dumps", pd.DataFrame(columns=_COLS["host_dumps"]))
    if d.empty:
        return []
    d = d[(d["t_s"] >= window.start_s) & (d["t_s"] <= window.end_s)]
    if d.empty:
        return []
    # per snapshot (pid, t_s): a thread held the GIL; threads active. Per process: the shares of its snapshots
    snap: dict[tuple[int, float], list[int]] = {}
    for pid, ts, gil, active in zip(d["pid"], d["t_s"], d["gil"], d["active"], strict=True):
        one = snap.setdefault((pid, ts), [0, 0])
        one[0] |= bool(gil)
        one[1] += int(active)
    held: dict[int, list[int]] = {}
    for (pid, _), (gil, active) in sorted(snap.items()):
        h = held.setdefault(pid, [0, 0, 0])
        h[0] += gil
        h[1] += gil and active >= 2
        h[2] += 1
    held_pid = max(held, key=lambda p: held[p][0] / held[p][2])  # the first of a tie, as idxmax
    return [Signal("host_gil_held_ratio", held[held_pid][0] / held[held_pid][2], "ratio", SOURCE,
                   f"share of py-spy snapshots in which a thread held the GIL (process {int(held_pid)})"),
            Signal("host_gil_contention_ratio", max(c / n for _, c, n in held.values()), "ratio", SOURCE,
                   "share of snapshots with the GIL held and two or more threads active in one process")]
