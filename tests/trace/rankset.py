"""Synthetic per-rank trace sets built from one real trace, for the scale-out tests and
benchmarks/trace_ranks_dask.py: every rank is a copy of the source rank with its own small time offset
(``jitter_us`` × (rank mod 7)) and its own ``distributedInfo``; one rank (``delayed``) is late by ``delay_us``
on every event, so it starts every collective last (the straggler the analysis must name).

Generated at test or benchmark time (never committed): gzip level 1, the source's events decoded once.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson


def load_events(src: Path) -> dict[str, Any]:
    raw = src.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc: dict[str, Any] = orjson.loads(raw)
    return doc


def write_rank_set(src: Path, out: Path, n: int, *, delayed: int | None = None, delay_us: float = 5000.0,
                   jitter_us: float = 3.0) -> list[Path]:
    """``n`` rank traces ``rank-NNNNN.json.gz`` in ``out`` (created), copies of ``src`` shifted in time."""
    doc = load_events(src)
    events = doc["traceEvents"]
    base = [e.get("ts") if isinstance(e, dict) else None for e in events]
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(n):
        shift = jitter_us * (r % 7) + (delay_us if r == delayed else 0.0)
        for e, ts in zip(events, base, strict=True):
            if isinstance(ts, (int, float)):
                e["ts"] = ts + shift
        dist = dict(doc.get("distributedInfo") or {})
        dist.update({"rank": r, "world_size": n})
        doc["distributedInfo"] = dist
        p = out / f"rank-{r:05d}.json.gz"
        p.write_bytes(gzip.compress(orjson.dumps(doc), compresslevel=1))
        paths.append(p)
    return paths
