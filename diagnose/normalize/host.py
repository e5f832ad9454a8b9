"""Host evidence (stream ``host_samples`` from probes/pyspy.py) -> tables and signals (report sections:
reports/sections/host.py).

Tables (t_s = seconds since the clock anchor):

* ``host_processes``: ``pid, ppid, role, name``.
* ``host_threads``: one row per thread per /proc sampling interval: ``t0_s, t_s, pid, tid, role, comm,
  cpu_ratio`` (cores used over the interval), ``run_ratio``, ``wait_ratio`` (schedstat run / run-queue wait
  per wall second), ``cpu_s, run_s, wait_s`` (seconds in the interval).
* ``host_system``: ``t0_s, t_s, steal_ratio, busy_ratio`` (whole machine, from /proc/stat).
* ``host_stacks``: ``t0_s, t_s`` (the py-spy window), ``pid, tid, role, thread, stack`` (frames
  ";"-joined, root first), ``leaf, category, samples`` (py-spy active samples in that window).
* ``host_dumps``: ``t_s, pid, tid, name, active, gil`` (py-spy dump snapshots).
* ``host_pyspy_cost``: ``pid, mode, cpu_s, wall_s, samples, rate_hz, nonblocking``.

CPU by category: each thread's CPU seconds (from /proc) are split over categories by the shares of its
py-spy samples; threads without Python stacks (OpenMP/BLAS pools) count as ``native`` (``model_forward``
in a ``worker`` process, whose native threads run the model's kernels). py-spy records
in windows of ``window_s`` (default 30 s): a signal window takes the stack windows that overlap it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pandas as pd

from diagnose.analysis import Window
from diagnose.bundle import Bundle
from diagnose.model import Signal, Source
from diagnose.normalize.host_stacks import CATEGORIES, CATEGORY_TEXT, categorize

SOURCE: Source = "host"
BUSY_THREAD_MIN_RATIO = 0.05  # threads runnable (running or waiting) less than this are left out of contention
_COLS = {
    "host_processes": ["pid", "ppid", "role", "name"],
    "host_threads": ["t0_s", "t_s", "pid", "tid", "role", "comm", "cpu_ratio", "run_ratio", "wait_ratio",
                     "cpu_s", "run_s", "wait_s"],
    "host_system": ["t0_s", "t_s", "steal_ratio", "busy_ratio"],
    "host_stacks": ["t0_s", "t_s", "pid", "tid", "role", "thread", "stack", "leaf", "category", "samples"],
    "host_dumps": ["t_s", "pid", "tid", "name", "active", "gil"],
    "host_pyspy_cost": ["pid", "mode", "cpu_s", "wall_s", "samples", "rate_hz", "nonblocking"],
}


def _empty() -> dict[str, pd.DataFrame]:
    return {k: pd.DataFrame(columns=v) for k, v in _COLS.items()}


def _thread_rows(cpu: list[dict[str, Any]], anchor: int, roles: dict[int, str]) -> list[dict[str, Any]]:
    prev: dict[tuple[int, int], dict[str, Any]] = {}
    rows = []
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
                     "cpu_s": cpu_s, "run_s": run_s, "wait_s": wait_s})
    return rows


def _system_rows(sysc: list[dict[str, Any]], anchor: int) -> list[dict[str, Any]]:
    rows = []
    keys = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    srt = sorted(sysc, key=lambda r: r["t_ns"])
    for p, r in zip(srt, srt[1:], strict=False):
        d = {k: max(0, int(r.get(k, 0)) - int(p.get(k, 0))) for k in keys}
        total = sum(d.values())
        if total <= 0:
            continue
        rows.append({"t0_s": (p["t_ns"] - anchor) / 1e9, "t_s": (r["t_ns"] - anchor) / 1e9,
                     "steal_ratio": d["steal"] / total,
                     "busy_ratio": 1.0 - (d["idle"] + d["iowait"]) / total})
    return rows


def tables(bundle: Bundle) -> dict[str, pd.DataFrame]:
    if not bundle.has_stream("host_samples"):
        return _empty()
    anchor = bundle.anchor_mono_ns
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in bundle.iter_records("host_samples"):
        by_kind[str(r.get("kind", ""))].append(r)
    procs: list[dict[str, Any]] = [
        {"pid": int(r["pid"]), "ppid": int(r.get("ppid", 0)), "role": str(r.get("role", "other")),
         "name": str(r.get("name", ""))} for r in by_kind["process"] if "pid" in r]
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
            "host_stacks": stacks, "host_dumps": dumps, "host_pyspy_cost": cost}
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


def category_cpu(t: dict[str, pd.DataFrame], w: Window | None = None) -> dict[str, float]:
    """CPU seconds per category over the window (thread CPU time split by its samples' categories)."""
    th = t.get("host_threads", pd.DataFrame(columns=_COLS["host_threads"]))
    th = _in_window(th, w) if w is not None else th
    fr = thread_categories(t, w)
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


def _spin_frac(t: dict[str, pd.DataFrame], w: Window) -> dict[tuple[int, int], float]:
    fr = thread_categories(t, w)
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
    if not st.empty:
        cats = category_cpu(t, window)
        total = sum(cats.values())
        if total > 0:
            for cat, v in cats.items():
                out.append(Signal(f"host_{cat}_cpu_share_ratio", v / total, "ratio", SOURCE,
                                  f"share of the engine processes' CPU time in {CATEGORY_TEXT[cat]}"))
            out.append(Signal("host_spin_wait_share_ratio", cats["spin_wait"] / total, "ratio", SOURCE,
                              "share of the engine processes' CPU time spent spin-waiting"))
    if not th.empty:
        out.extend(_thread_signals(t, th, window))
    out.extend(_contention_signals(t, th, window))
    out.extend(_gil_signals(t, window))
    return out


def _thread_signals(t: dict[str, pd.DataFrame], th: pd.DataFrame, window: Window) -> list[Signal]:
    spin = _spin_frac(t, window)
    span = th.groupby(["pid", "tid"]).agg(cpu_s=("cpu_s", "sum"), t0=("t0_s", "min"), t1=("t_s", "max"),
                                          comm=("comm", "first"))
    span["busy"] = span["cpu_s"] / (span["t1"] - span["t0"]).clip(lower=1e-9)
    span["useful"] = [b * (1.0 - spin.get((int(p), int(i)), 0.0)) for (p, i), b in span["busy"].items()]
    out = []
    pid, tid = span["busy"].idxmax()
    out.append(Signal("host_thread_busy_max_ratio", float(span["busy"].max()), "ratio", SOURCE,
                      f"busiest engine thread's CPU share of one core, spin-wait included: "
                      f"{_thread_label(t, int(pid), int(tid), str(span.loc[(pid, tid), 'comm']))}"))
    pid, tid = span["useful"].idxmax()
    sp = 1.0 - spin.get((int(pid), int(tid)), 0.0)
    one = th[(th["pid"] == pid) & (th["tid"] == tid)]
    series = tuple((float(r.t_s), float(r.cpu_ratio) * sp) for r in one.itertuples(index=False))
    out.append(Signal("host_thread_saturated_max_ratio", float(span["useful"].max()), "ratio", SOURCE,
                      f"busiest engine thread's on-CPU share of one core, spin-wait excluded: "
                      f"{_thread_label(t, int(pid), int(tid), str(span.loc[(pid, tid), 'comm']))}", series))
    total = th.groupby("t_s")["cpu_ratio"].sum()
    out.append(Signal("host_engine_cpu_cores_mean", float(th["cpu_s"].sum() / max(1e-9, th["t_s"].max()
                      - th["t0_s"].min())), "cores", SOURCE, "CPU used by all engine processes (cores)",
                      tuple((float(k), float(v)) for k, v in total.items())))
    return out


def _contention_signals(t: dict[str, pd.DataFrame], th: pd.DataFrame, window: Window) -> list[Signal]:
    out = []
    series: list[tuple[float, float]] = []
    ratio = None
    if not th.empty:
        dur = max(1e-9, th["t_s"].max() - th["t0_s"].min())
        # threads that wanted a CPU (on it or waiting for it) at least 5% of the time: a thread starved by
        # contention uses little CPU, so selecting by CPU alone would drop exactly the victims
        g = th.groupby(["pid", "tid"])
        runnable = (g["run_s"].sum() + g["wait_s"].sum()) / dur
        busy = set(runnable[runnable >= BUSY_THREAD_MIN_RATIO].index)
        bt = th[[(int(p), int(i)) in busy for p, i in zip(th["pid"], th["tid"], strict=False)]]
        if not bt.empty:
            run, wait = float(bt["run_s"].sum()), float(bt["wait_s"].sum())
            if run + wait > 0:
                ratio = wait / (run + wait)
                out.append(Signal("host_run_queue_wait_ratio", ratio, "ratio", SOURCE,
                                  "run-queue wait / (run + wait) of runnable engine threads (schedstat)"))
            per_t = bt.groupby("t_s")[["run_s", "wait_s"]].sum()
            tot = per_t["run_s"] + per_t["wait_s"]
            series = [(float(k), float(w / s)) for k, w, s in zip(per_t.index, per_t["wait_s"], tot, strict=False) if s > 0]
    sysdf = _in_window(t.get("host_system", pd.DataFrame(columns=_COLS["host_system"])), window)
    steal = None
    if not sysdf.empty:
        steal = float(sysdf["steal_ratio"].mean())
        out.append(Signal("host_cpu_steal_ratio", steal, "ratio", SOURCE,
                          "CPU time stolen by the hypervisor, share of all CPU time"))
        out.append(Signal("host_cpu_busy_ratio", float(sysdf["busy_ratio"].mean()), "ratio", SOURCE,
                          "whole machine CPU busy share (all processes)"))
    if ratio is not None or steal is not None:
        val = max(v for v in (ratio, steal) if v is not None)
        out.append(Signal("host_cpu_steal_or_contention_ratio", val, "ratio", SOURCE,
                          "max of run-queue wait / (run + wait) of busy engine threads and hypervisor steal: "
                          "time the engine was ready to run but had no CPU", tuple(series)))
    return out


def _gil_signals(t: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    d = t.get("host_dumps", pd.DataFrame(columns=_COLS["host_dumps"]))
    if d.empty:
        return []
    d = d[(d["t_s"] >= window.start_s) & (d["t_s"] <= window.end_s)]
    if d.empty:
        return []
    snap = d.groupby(["pid", "t_s"]).agg(gil=("gil", "any"), active=("active", "sum"))
    held = snap.groupby(level="pid")["gil"].mean()
    contended = snap.assign(c=snap["gil"] & (snap["active"] >= 2)).groupby(level="pid")["c"].mean()
    return [Signal("host_gil_held_ratio", float(held.max()), "ratio", SOURCE,
                   f"share of py-spy snapshots in which a thread held the GIL (process {int(held.idxmax())})"),
            Signal("host_gil_contention_ratio", float(contended.max()), "ratio", SOURCE,
                   "share of snapshots with the GIL held and two or more threads active in one process")]
