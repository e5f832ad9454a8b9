"""Gates made robust (issue 34 items 4 and 5): sends held back by --max-concurrency are not bursty arrivals."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from diagnose.rules.spec import load_thresholds
from tests.test_client_metrics import make_bundle, req, sigs


def _open_loop(tmp: Path, capped: bool) -> dict[str, float]:
    """40 requests scheduled every 50 ms (a steady rate); with ``capped`` seven of every eight were held back by
    the concurrency cap and sent together when slots freed."""
    reqs = []
    for i in range(40):
        intended = i * 50
        held = capped and i % 8 != 0
        sent = (i // 8) * 400 + 390 if held else intended  # released together when slots freed
        r = req(f"r{i}", sent, sent + 30, first=sent + 10, n=3, intended=intended)
        r["capped"] = held
        reqs.append(r)
    phases = [{"phase": 0, "name": "rate=20", "mode": "rate", "rate": 20.0, "start": 0, "end": 2500}]
    tables, _ = make_bundle(tmp, reqs, [], phases=phases)
    return sigs(tables)


def test_sends_held_back_by_the_concurrency_cap_are_not_bursty_arrivals(tmp_path: Path) -> None:
    steady = _open_loop(tmp_path / "a", capped=False)
    held = _open_loop(tmp_path / "b", capped=True)
    assert steady["workload_open_loop"] == 1 and steady["arrival_gap_cv_ratio"] < 0.05
    # the schedule was steady: the cap's clumped releases do not make it bursty
    assert held["arrival_gap_cv_ratio"] == steady["arrival_gap_cv_ratio"]
    # what the sends alone would have measured (the code before this change): bursty by SCH008's threshold
    t = np.sort([(i // 8) * 400.0 + 390.0 if i % 8 else i * 50.0 for i in range(40)])
    d = np.diff(t)
    assert d.std() / d.mean() >= load_thresholds()["burst_arrival_cv_min"]
