"""Stage-2 host tables, computed once by the pipeline before the view (issue 32: the host section called the
host normaliser's helpers itself, two reach-backs from the view into the table stage):

- ``host_category_cpu``: the engine's CPU per category over the whole capture (category, value, unit: CPU
  seconds from the /proc thread counters split by each thread's py-spy samples, or sample counts without them);
- ``host_thread_categories``: per engine thread, the share of its py-spy samples in each category;
- ``host_thread_wait``: per engine thread, its run-queue wait and what it is (work, poll loop, idle);
- ``host_victim``: the working thread that waited most for a CPU (one row of ``host_thread_wait``, or none);
- ``host_foreign_on_core``: the processes outside the engine, busiest on the victim's core first;
- ``host_flame``: the py-spy stacks with their process and thread labels, the flame graph's rows.

reports/sections/host.py only formats these tables (and shapes the flame graph's tree)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from diagnose.normalize.host import category_cpu, foreign_on_core, thread_categories, thread_wait, victim

NEEDED = ("host_threads", "host_processes", "host_stacks")
CATEGORY_COLUMNS = ["category", "value", "unit"]
FLAME_COLUMNS = ["proc", "thread", "stack", "samples"]


def host_tables(tables: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The host tables for ``tables``; {} without the host probe's tables."""
    t = dict(tables)
    if any(k not in t for k in NEEDED):
        return {}
    fr = thread_categories(t)
    tw = thread_wait(t, None, fr)
    v = victim(tw)
    out = {"host_category_cpu": _categories(t, fr), "host_thread_categories": fr, "host_thread_wait": tw,
           "host_victim": tw.head(0) if v is None else tw.loc[[v.name]].reset_index(drop=True),
           "host_flame": _flame(t)}
    if not t.get("host_foreign_scans", pd.DataFrame()).empty:
        out["host_foreign_on_core"] = foreign_on_core(t, None, int(v.core) if v is not None else -1)
    return out


def _categories(t: dict[str, pd.DataFrame], fr: pd.DataFrame) -> pd.DataFrame:
    if t["host_stacks"].empty:
        return pd.DataFrame(columns=CATEGORY_COLUMNS)
    unit = "CPU s" if not t["host_threads"].empty else "samples"
    cats = category_cpu(t, None, fr)
    return pd.DataFrame([(c, float(v), unit) for c, v in cats.items()], columns=CATEGORY_COLUMNS)


def _flame(t: dict[str, pd.DataFrame]) -> pd.DataFrame:
    st = t["host_stacks"]
    if st.empty:
        return pd.DataFrame(columns=FLAME_COLUMNS)
    procs = t["host_processes"].set_index("pid")["name"].to_dict() if not t["host_processes"].empty else {}
    rows = [(f"{r.role} {procs.get(r.pid, '')} ({r.pid})".replace("  ", " "), f"thread {r.thread or r.tid}",
             str(r.stack), float(r.samples)) for r in st.itertuples(index=False)]
    return pd.DataFrame(rows, columns=FLAME_COLUMNS)
