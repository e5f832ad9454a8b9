"""Host sections: per-process breakdown, CPU by category, busiest threads, who waited for a CPU (and who
took it), flame graph, sampling cost."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pandas as pd

from diagnose.normalize.host import BUSY_THREAD_MIN_RATIO
from diagnose.normalize.host_stacks import CATEGORY_TEXT

from ..view_types import FlameNode
from .model import Cell, FlameGraph, Phrase, Quantity, Section, Table, TextBlock

Tables = Mapping[str, pd.DataFrame]
NEEDED = ("host_threads", "host_processes", "host_stacks", "host_pyspy_cost", "host_category_cpu",
          "host_thread_categories", "host_thread_wait", "host_victim", "host_flame")  # the last five: stage 2
_KIND = {"work": "working: decides contention", "poll_loop": "poll/yield loop: not judged"}


def _pct(x: float) -> Quantity:
    return Quantity(x, "ratio", 1, "percent")


def shares(items: list[tuple[str, float]]) -> Phrase:
    """"a 41.0%, b 12.5%": labels with their shares."""
    parts: list[str | Quantity] = []
    for i, (label, frac) in enumerate(items):
        parts += [", " if i else "", f"{label} ", _pct(frac)]
    return Phrase(tuple(p for p in parts if p != ""))


def _process_table(t: Tables) -> Section | None:
    th, procs, st = t["host_threads"], t["host_processes"], t["host_stacks"]
    if procs.empty or (th.empty and st.empty):
        return None
    rows: list[tuple[Cell, ...]] = []
    for p in procs.itertuples(index=False):
        pt = th[th["pid"] == p.pid]
        dur = max(1e-9, float(pt["t_s"].max() - pt["t0_s"].min())) if not pt.empty else 0.0
        cores = float(pt["cpu_s"].sum()) / dur if dur else float("nan")
        run, wait = (float(pt["run_s"].sum()), float(pt["wait_s"].sum())) if not pt.empty else (0.0, 0.0)
        busiest: Cell = "-"
        if not pt.empty:
            per = pt.groupby(["tid", "comm"])["cpu_s"].sum() / dur
            (tid, comm), val = per.idxmax(), float(per.max())
            busiest = Phrase((f"{comm} ({tid}): ", Quantity(val, "cores", 2, "fixed"), " cores"))
        ps = st[st["pid"] == p.pid]
        cats = ps.groupby("category")["samples"].sum().sort_values(ascending=False)
        total = float(cats.sum())
        top: Cell = shares([(str(c), n / total) for c, n in cats.head(3).items()]) if total else "no samples"
        rows.append((p.role, int(p.pid), p.name, Quantity(cores if dur else None, "cores", 2), busiest,
                     _pct(wait / (run + wait)) if run + wait > 0 else "-", int(total), top))
    return Section("host_processes", "Host CPU by engine process", Table(
        ("role", "pid", "process", "CPU (cores)", "busiest thread", "run-queue wait", "py-spy samples",
         "top categories (share of samples)"), tuple(rows),
        "CPU from /proc per-thread counters; run-queue wait = time ready to run but not on a CPU (schedstat), as a "
        "share of run + wait; categories from py-spy active samples."), group="host", order=40)


def _category_table(t: Tables) -> Section | None:
    cats = t["host_category_cpu"]
    total = float(cats["value"].sum()) if not cats.empty else 0.0
    if total <= 0:
        return None
    unit = str(cats["unit"].iloc[0])
    rows = tuple((str(r.category), CATEGORY_TEXT[str(r.category)], Quantity(float(r.value), unit, 2),
                  _pct(float(r.value) / total))
                 for r in cats.sort_values("value", ascending=False, kind="stable").itertuples(index=False)
                 if r.value > 0)
    return Section("host_categories", "Where the engine's CPU time goes", Table(
        ("category", "meaning", unit, "share"), rows,
        "spin_wait is busy polling (for example vLLM's shm_broadcast sched_yield loop): it keeps a core busy but is "
        "not work, so a busy core that is mostly spin_wait is not a bottleneck."), group="host", order=41)


def _thread_table(t: Tables) -> Section | None:
    th = t["host_threads"]
    if th.empty:
        return None
    dur = max(1e-9, float(th["t_s"].max() - th["t0_s"].min()))
    per = th.groupby(["pid", "tid", "role", "comm"], as_index=False)[["cpu_s", "run_s", "wait_s"]].sum()
    per = per.sort_values("cpu_s", ascending=False).head(12)
    fr = t["host_thread_categories"]
    names = t["host_stacks"].groupby(["pid", "tid"])["thread"].first().to_dict()
    rows: list[tuple[Cell, ...]] = []
    for r in per.itertuples(index=False):
        f = fr[(fr["pid"] == r.pid) & (fr["tid"] == r.tid)].sort_values("frac", ascending=False)
        top = [(str(c), float(x)) for c, x in zip(f["category"].head(2), f["frac"].head(2), strict=False)]
        rw = r.run_s + r.wait_s
        rows.append((r.role, int(r.pid), names.get((r.pid, r.tid)) or r.comm, int(r.tid),
                     Quantity(float(r.cpu_s / dur), "cores", 2), _pct(r.wait_s / rw) if rw > 0 else "-",
                     shares(top) if top else "no on-CPU Python samples"))
    return Section("host_threads", "Busiest engine threads", Table(
        ("role", "pid", "thread", "tid", "CPU (cores)", "run-queue wait", "top categories"), tuple(rows),
        "A thread near 1.00 core is saturated; if its top category is spin_wait it is only polling."),
        group="host", order=42)


def _core(c: int) -> Cell:
    return int(c) if c >= 0 else "-"


def _wait_table(t: Tables) -> Section | None:
    tw = t["host_thread_wait"]
    shown = (tw["kind"] == "work") | ((tw["kind"] == "poll_loop") & (tw["runnable_ratio"] >= BUSY_THREAD_MIN_RATIO))
    tw = tw[shown].assign(loop=lambda d: d["kind"] != "work")
    tw = tw.sort_values(["loop", "wait_s"], ascending=[True, False]).head(12)  # working threads first
    if tw.empty:
        return None
    rows: list[tuple[Cell, ...]] = []
    for r in tw.itertuples(index=False):
        kind = _KIND.get(str(r.kind), str(r.kind)) + (f" ({r.why})" if r.why else "")
        rows.append((r.role, int(r.pid), r.process, r.thread, int(r.tid), _core(int(r.core)),
                     Quantity(float(r.run_ratio), "cores", 2), Quantity(float(r.wait_s / r.dur_s), "s/s", 2, "fixed"),
                     _pct(float(r.wait_share)) if r.wait_share == r.wait_share else "-", kind))
    return Section("host_wait", "Who waited for a CPU (run-queue wait by thread)", Table(
        ("role", "pid", "process", "thread", "tid", "core", "on CPU (cores)", "waiting (s per s)",
         "wait share of runnable", "counts as"), tuple(rows),
        "Run-queue wait = time a thread was ready to run but had no CPU (schedstat). Only working threads decide "
        "CPU contention (host_work_wait_ratio, HST005): vLLM's EngineCore busy loop and threads whose py-spy "
        "samples are mostly spin-wait or waiting yield the CPU by design, so their wait is high on an idle machine "
        "too. Threads on a CPU under 2% of a core (ZMQ, gloo pollers) and loops runnable under 5% of the time are left out. Core = the core the thread ran "
        "on most often (- where the probe did not record it)."), group="host", order=43)


def _foreign_table(t: Tables) -> Section | None:
    if "host_foreign_on_core" not in t:  # stage 2 makes it only where the probe scanned other processes
        return None
    vs = t["host_victim"]
    v = vs.iloc[0] if not vs.empty else None
    core = int(v.core) if v is not None else -1
    fo = t["host_foreign_on_core"].head(10)
    who = (f"thread {v.thread!r} ({int(v.tid)}) of {v.role} {int(v.pid)}" if v is not None else "the engine")
    col = f"share of core {core}" if core >= 0 else "share of a core"
    if fo.empty:
        return Section("host_foreign", "Busiest processes outside the engine", TextBlock(
            f"No process outside the engine used 5% of a core or more while {who} ran (the probe scanned every "
            "process's CPU counters during the capture)."), group="host", order=44)
    rows = tuple((int(r.pid), str(r.name) + (" (this capture)" if r.own else ""), Quantity(float(r.cores), "cores", 2),
                  _core(int(r.core)), _pct(float(r.core_ratio))) for r in fo.itertuples(index=False))
    return Section("host_foreign", "Busiest processes outside the engine", Table(
        ("pid", "process name", "CPU (cores)", "core (most often)", col), rows,
        f"The processes outside the engine's process tree that used the most CPU (the probe records the top 5 per "
        f"scan above 5% of a core, by name only, never a command line). '{col}' is the share of the core {who} "
        "(the engine thread that waited most) ran on; \"this capture\" marks diagnose's own load generator and "
        "samplers."), group="host", order=44)


def flame_tree(rows: Iterable[tuple[list[str], float]], root_name: str = "all",
               min_fraction: float = 0.002, max_depth: int = 64) -> FlameNode:
    """A flame-graph tree {name, value, children} from (path, weight) rows; tiny branches are pruned (the view's
    shape of the stage-2 ``host_flame`` rows)."""
    root = _Node(root_name)
    for path, weight in rows:
        if weight <= 0:
            continue
        node = root
        node.value += weight
        for name in path[:max_depth]:
            nxt = node.children.get(name)
            if nxt is None:
                nxt = node.children[name] = _Node(name)
            node = nxt
            node.value += weight
    cutoff = root.value * min_fraction

    def finish(n: _Node) -> FlameNode:
        kids = [finish(c) for c in sorted(n.children.values(), key=lambda c: -c.value) if c.value >= cutoff]
        return {"name": n.name, "value": round(n.value, 3), "children": kids}

    return finish(root)


class _Node:
    __slots__ = ("name", "value", "children")

    def __init__(self, name: str) -> None:
        self.name = name
        self.value = 0.0
        self.children: dict[str, _Node] = {}


def _flamegraph(t: Tables) -> Section | None:
    fl = t["host_flame"]
    if fl.empty:
        return None
    rows = [([str(r.proc), str(r.thread), *[f for f in str(r.stack).split(";") if f]], float(r.samples))
            for r in fl.itertuples(index=False)]
    return Section("host_flamegraph", "Host stacks (py-spy, on-CPU samples)",
                   FlameGraph(flame_tree(rows, "engine processes"), "samples"), group="host", order=45)


def _cost_text(t: Tables) -> Section | None:
    c = t["host_pyspy_cost"]
    if c.empty:
        return None
    rec = c[c["mode"] == "record"]
    wall = float(rec["wall_s"].max()) if not rec.empty else 0.0
    cpu = float(pd.to_numeric(c["cpu_s"], errors="coerce").fillna(0).sum())
    rate = rec["rate_hz"].iloc[0] if not rec.empty else None
    nb = bool(rec["nonblocking"].iloc[0]) if not rec.empty else False
    text = Phrase(("py-spy used ", Quantity(cpu, "s", 2, "fixed"), " CPU-seconds over ", Quantity(wall, "s", 1, "fixed"),
                   " s (", _pct(cpu / wall) if wall else "-", " of one core) sampling ", Quantity(len(rec), "processes"),
                   " process(es) at ", Quantity(float(rate), "Hz", 1, "fixed") if rate is not None else "None",
                   f" Hz, {'non-blocking' if nb else 'pausing the target'} for each sample."))
    return Section("host_pyspy_cost", "Cost of host sampling", TextBlock(text), group="host", order=46)


def sections(t: Tables) -> list[Section]:
    if any(k not in t for k in NEEDED):
        return []
    made = [_process_table(t), _category_table(t), _thread_table(t), _wait_table(t), _foreign_table(t), _flamegraph(t),
            _cost_text(t)]
    return [s for s in made if s is not None]
