"""Host sections: per-process breakdown, CPU by category, busiest threads, flame graph, sampling cost."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from diagnose.normalize.host import category_cpu, thread_categories
from diagnose.normalize.host_stacks import CATEGORY_TEXT, flame_tree

from .model import Cell, FlameGraph, Phrase, Quantity, Section, Table, TextBlock

Tables = Mapping[str, pd.DataFrame]
NEEDED = ("host_threads", "host_processes", "host_stacks", "host_pyspy_cost")


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
    if t["host_stacks"].empty:
        return None
    cats = category_cpu(dict(t))
    total = sum(cats.values())
    if total <= 0:
        return None
    unit = "CPU s" if not t["host_threads"].empty else "samples"
    rows = tuple((c, CATEGORY_TEXT[c], Quantity(v, unit, 2), _pct(v / total))
                 for c, v in sorted(cats.items(), key=lambda kv: -kv[1]) if v > 0)
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
    fr = thread_categories(dict(t))
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


def _flamegraph(t: Tables) -> Section | None:
    st = t["host_stacks"]
    if st.empty:
        return None
    procs = t["host_processes"].set_index("pid")["name"].to_dict() if not t["host_processes"].empty else {}
    rows = []
    for r in st.itertuples(index=False):
        proc = f"{r.role} {procs.get(r.pid, '')} ({r.pid})".replace("  ", " ")
        frames = [f for f in str(r.stack).split(";") if f]
        rows.append(([proc, f"thread {r.thread or r.tid}", *frames], float(r.samples)))
    return Section("host_flamegraph", "Host stacks (py-spy, on-CPU samples)",
                   FlameGraph(flame_tree(rows, "engine processes"), "samples"), group="host", order=43)


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
    return Section("host_pyspy_cost", "Cost of host sampling", TextBlock(text), group="host", order=44)


def sections(t: Tables) -> list[Section]:
    if any(k not in t for k in NEEDED):
        return []
    made = [_process_table(t), _category_table(t), _thread_table(t), _flamegraph(t), _cost_text(t)]
    return [s for s in made if s is not None]
