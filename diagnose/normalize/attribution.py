"""Where the time of the requests went, where no single source can say it alone: the slow requests' TTFT
split by the server's histograms (no spans needed), and the decode time split into the steady step, the
stalls of steps that carried other work, and preemption.

No tables of its own: it reads the client's (``requests``, ``itl``) and the server metrics' tables.

* **The slow requests' TTFT, server histograms** (``server_ttft_tail_*_ratio``): the client's requests at or
  above the TTFT percentile an SLO judges (else the P90), their mean TTFT, and the mean of the slowest same
  share of the queue-time and prefill-time histograms. Without spans the histograms cannot say which request
  waited how long, so this takes the slowest requests to be those that waited and prefilled longest (rank
  aligned): each share is then as large as it can be, and their sum is scaled to 1 when it is over. Each
  description gives the range the histograms' bucket bounds and sums allow.
* **Decode time** (``decode_time_*_ratio``): the measured requests' token gaps (the time between streamed
  chunks after the first token), summed. A gap up to ``STALL_FACTOR`` x the ITL P50 is a steady step (a
  decode step, the batch, the API server's stream: the ITL P50 split says which); the part of a longer gap
  above that is a stall, a step that carried other work (a prefill chunk, mostly); a preempted request waits
  and recomputes, which shows as one long gap in it, so the excess of the longest gaps, as many as the
  engine counted preemptions in the window, is preemption's. Shares of the summed gaps; they add up to 1.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagnose.model import Signal, Window
from diagnose.normalize import TableContext
from diagnose.normalize.otel import tail_pct
from diagnose.normalize.prometheus import client_ttft_s, counter_increase, hist_tail_mean
from diagnose.requests import select
from diagnose.signals.catalog import CATALOG, SIGNALS

STALL_FACTOR = 2.0  # a token gap longer than this many ITL P50s is a stall (its part above that line)
TAIL_MIN_REQUESTS = 5  # the slow requests' split needs at least this many of them


def tables(bundle: object, ctx: TableContext | None = None) -> dict[str, pd.DataFrame]:
    return {}


def _sig(name: str, value: float, note: str) -> Signal:
    return Signal(name, float(value), "ratio", CATALOG[name].source, f"{SIGNALS.get(name, name)}: {note}")


def ttft_tail_split(tables: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    """The slow requests' TTFT split into queue, prefill and the rest, from the server's histograms."""
    ttft = np.asarray(client_ttft_s(tables, window), dtype=float)
    if ttft.size == 0:
        return []
    pct = tail_pct(tables)
    slow = ttft[ttft >= np.percentile(ttft, pct)]
    total = float(slow.mean()) if slow.size else 0.0
    if slow.size < TAIL_MIN_REQUESTS or total <= 0:
        return []
    q = hist_tail_mean(tables, "queue_time_seconds", pct / 100.0, window)
    p = hist_tail_mean(tables, "prefill_time_seconds", pct / 100.0, window)
    if q is None or p is None:
        return []
    qs, ps = q.value / total, p.value / total
    scaled = qs + ps > 1.0
    if scaled:
        qs, ps = qs / (qs + ps), ps / (qs + ps)
    how = (f"the {slow.size} client requests at or above the TTFT P{pct:g} (mean {total * 1e3:.0f} ms) against "
           f"the slowest {100 - pct:g}% of the server's queue-time and prefill-time histograms (queue "
           f"{q.value * 1e3:.0f} ms, within {q.lo * 1e3:.0f}-{q.hi * 1e3:.0f} ms by the buckets; prefill "
           f"{p.value * 1e3:.0f} ms, within {p.lo * 1e3:.0f}-{p.hi * 1e3:.0f} ms), taking the slowest requests "
           "to be those that waited and prefilled longest" + ("; the two came to more than the TTFT and are "
                                                                 "scaled to add up to 1" if scaled else ""))
    return [_sig("server_ttft_tail_queue_ratio", qs, how + f"; queue's range {q.lo / total:.0%}-"
                 f"{min(1.0, q.hi / total):.0%}"),
            _sig("server_ttft_tail_prefill_ratio", ps, how + f"; prefill's range {p.lo / total:.0%}-"
                 f"{min(1.0, p.hi / total):.0%}"),
            _sig("server_ttft_tail_outside_ratio", max(0.0, 1.0 - qs - ps), how)]


def decode_time_split(tables: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    """The measured requests' token gaps split into steady steps, stalls and preemption (module docstring)."""
    req, itl = tables.get("requests"), tables.get("itl")
    if req is None or req.empty or itl is None or itl.empty:
        return []
    rids = set(select(req, window).ok["rid"])
    gaps = itl.loc[itl["rid"].isin(rids), "itl_ms"].to_numpy(dtype=float)
    gaps = gaps[np.isfinite(gaps) & (gaps >= 0)]
    total = float(gaps.sum()) if gaps.size else 0.0
    if total <= 0:
        return []
    line = STALL_FACTOR * float(np.percentile(gaps, 50))
    excess = np.sort(np.clip(gaps - line, 0.0, None))[::-1]
    excess = excess[excess > 0]
    preempted = counter_increase(tables, "preemptions", window)
    n_pre = int(min(excess.size, round(preempted))) if preempted and preempted > 0 else 0
    pre = float(excess[:n_pre].sum())
    stall = float(excess.sum()) - pre
    how = (f"{gaps.size} token gaps of {len(rids)} requests, {total / 1e3:.3g} s in all; a stall is a gap's part "
           f"above {line:.3g} ms ({STALL_FACTOR:g} x the ITL P50), {excess.size} gaps have one")
    out = [_sig("decode_time_steady_ratio", (total - stall - pre) / total, how),
           _sig("decode_time_stall_ratio", stall / total, how + (f", less the {n_pre} longest (preemption)"
                                                                 if n_pre else ""))]
    if preempted is not None:
        out.append(_sig("decode_time_preemption_ratio", pre / total,
                        how + f"; the engine counted {preempted:.0f} preemptions: the excess of the "
                              f"{n_pre} longest gaps"))
    return out


def signals(tables: dict[str, pd.DataFrame], window: Window) -> list[Signal]:
    return [*ttft_tail_split(tables, window), *decode_time_split(tables, window)]
