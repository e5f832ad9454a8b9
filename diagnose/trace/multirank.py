"""Multi-rank view: per-rank skew, and stragglers at collectives (matched by order on each rank)."""

from __future__ import annotations

import numpy as np
import pandas as pd

TIE_US = 5.0  # ranks whose starts of a collective lie within this of the earliest one tie: nobody is last


def collective_skew(comm_starts: dict[int, np.ndarray]) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Match the i-th communication kernel of every rank; per collective: start skew and the last rank.

    Needs traces captured over the same window with comparable clocks (one host, or synchronised hosts). A
    collective whose starts all lie within TIE_US of each other has no last rank (``last_rank`` -1).
    Returns (per collective, per rank, warnings).
    """
    warnings: list[str] = []
    ranks = sorted(r for r, a in comm_starts.items() if len(a))
    if len(ranks) < 2:
        return pd.DataFrame(), pd.DataFrame(), warnings
    counts = {r: len(comm_starts[r]) for r in ranks}
    n = min(counts.values())
    if len(set(counts.values())) > 1:
        warnings.append("ranks have different numbers of communication kernels "
                        f"({', '.join(f'rank {r}: {c}' for r, c in counts.items())}); matched the first {n}")
    m = np.stack([np.sort(comm_starts[r])[:n] for r in ranks])  # ranks x collectives
    earliest = m.min(axis=0)
    skew = m.max(axis=0) - earliest
    last = np.where(skew > TIE_US, np.array(ranks)[m.argmax(axis=0)], -1)  # -1: a tie, no rank was last
    per_coll = pd.DataFrame({"collective": np.arange(n), "skew_us": skew, "last_rank": last})
    lag = m - earliest
    per_rank = pd.DataFrame({"rank": ranks, "collectives": n, "lag_us_mean": lag.mean(axis=1),
                             "lag_us_p50": np.percentile(lag, 50, axis=1),
                             "lag_us_p99": np.percentile(lag, 99, axis=1),
                             "times_last": [int((last == r).sum()) for r in ranks]})
    per_rank["last_share_ratio"] = per_rank["times_last"] / max(n, 1)
    return per_coll, per_rank, warnings
