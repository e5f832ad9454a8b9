"""Tasks as the unit of work (issue 16, item 4; docs/workload.md "Tasks"): the requests of one task (a
multi-turn conversation or an agent's chain, ``attach --turns``; probes/sessions.py) measured end to end.

No tables of its own: it groups the client's ``requests`` table by ``session``. A task counts in a window when
its first request was sent in it (warm-up tasks left out). It is **complete** when each of its planned turns
has a successful request, **abandoned** when a turn failed on every attempt, and otherwise cut off by the
end of the phase (not timed). Its latency runs from its first request's send to its last answer's end, think
time included: what the user or the agent waits for the whole task. With an SLO, a task is within it when
every request of it that answered met each term, as the request goodput judges a request (a retried turn's
failed attempts do not count against it; its time does).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnose.model import Signal, Source, Window
from diagnose.normalize import TableContext
from diagnose.normalize.client import good_mask
from diagnose.requests import span_s, window_mask
from diagnose.signals.catalog import SIGNALS

SOURCE: Source = "client"
PCTS = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("max", 100.0))


def tables(bundle: object, ctx: TableContext | None = None) -> dict[str, pd.DataFrame]:
    return {}


def _sig(name: str, value: float, unit: str, note: str = "") -> Signal:
    return Signal(name, float(value), unit, SOURCE, SIGNALS.get(name, name) + note)


def task_table(req: pd.DataFrame, window: Window) -> pd.DataFrame:
    """One row per task that started in ``window``: ``start_s``, ``end_s``, ``latency_ms``, ``turns`` (planned),
    ``answered`` (turns with a successful request), ``failed_turns``, ``attempts``, ``state`` (complete |
    abandoned | cut)."""
    cols = ["session", "start_s", "end_s", "latency_ms", "turns", "answered", "failed_turns", "attempts", "state"]
    if req.empty or "session" not in req.columns or req["session"].isna().all() or "turns" not in req.columns:
        return pd.DataFrame(columns=cols)
    rows = req[req["session"].notna() & req["turns"].notna()]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    first = rows.sort_values("sent_s").groupby("session", sort=False).head(1)
    started = set(first.loc[window_mask(first.assign(profiled=False, client_stall=False), window), "session"])
    rows = rows[rows["session"].isin(started)]
    out = []
    for session, g in rows.groupby("session", sort=False):
        ok = g[g["ok"].astype(bool)]
        turns = int(g["turns"].max())
        answered = int(ok["turn"].nunique())
        failed = g[~g["ok"].astype(bool) & (g["error"].fillna("") != "incomplete")]
        # a turn failed for good: no success among its attempts, and the task went no further
        lost = sorted(set(failed["turn"]) - set(ok["turn"]))
        state = "complete" if answered >= turns else "abandoned" if lost else "cut"
        start, end = float(g["sent_s"].min()), float(g["end_s"].max())
        out.append({"session": session, "start_s": start, "end_s": end,
                    "latency_ms": (end - start) * 1e3 if state == "complete" else np.nan, "turns": turns,
                    "answered": answered, "failed_turns": len(lost), "attempts": int(len(g)), "state": state})
    return pd.DataFrame(out, columns=cols)


def _good(req: pd.DataFrame, itl: pd.DataFrame | None, tasks: pd.DataFrame, slo: pd.DataFrame | None) -> int | None:
    """Complete tasks whose every answered request met each SLO term, by the request goodput's own definition
    (client.good_mask: ttft, tpot, e2e its own value; itl its own chunk-gap percentile); None without an SLO."""
    if slo is None or slo.empty:
        return None
    done = tasks[tasks["state"] == "complete"]
    ok = req[req["session"].isin(set(done["session"])) & req["ok"].astype(bool)]
    gaps = itl if itl is not None else pd.DataFrame(columns=["rid", "itl_ms"])
    bad = set(ok.loc[~good_mask(ok, gaps, slo), "session"])
    return int((~done["session"].isin(bad)).sum())


def signals(tables: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    req = tables.get("requests")
    if req is None or req.empty or "session" not in req.columns:
        return []
    tasks = task_table(req, window)
    if tasks.empty:
        return []
    done = tasks[tasks["state"] == "complete"]
    out = [_sig("tasks_started", len(tasks), "tasks"), _sig("tasks_completed", len(done), "tasks"),
           _sig("tasks_abandoned_ratio", float((tasks["state"] == "abandoned").mean()), "ratio")]
    if len(done):
        lat = done["latency_ms"].to_numpy(dtype=float)
        for name, q in PCTS:
            out.append(_sig(f"task_latency_{name}_ms", float(np.percentile(lat, q)), "ms"))
        span = span_s(done.rename(columns={"start_s": "sent_s"}), tables.get("client_excluded"))
        if span > 0:
            out.append(_sig("task_rps", len(done) / span, "task/s"))
            good = _good(req, tables.get("itl"), tasks, tables.get("client_slo"))
            if good is not None:
                out.append(_sig("task_goodput_rps", good / span, "task/s"))
                out.append(_sig("task_goodput_ratio", good / len(tasks), "ratio"))
    retried = req[req["session"].isin(set(tasks["session"])) & (req["attempt"].fillna(0) > 0)]
    out.append(_sig("task_retries_total", float(len(retried)), "requests"))
    return out
