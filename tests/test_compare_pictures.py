"""The compare page's pictures and verdict hygiene (issue 38): per level A vs B latency CDFs and both runs'
throughput-latency curves, computed once (diagnose/compare/pictures.py) from the comparison's own values; no
better / worse between runs that are not comparable; a latency of 0 ms (an invalid run's artefact) is never
"better"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from diagnose import compare as cmp
from diagnose.compare.core import JUDGED, NOT_JUDGED
from diagnose.pipeline import analyze
from diagnose.reports.compare import chart_specs, render_comparison
from tests.test_compare import QUEUE, SAMPLES, _retime, _rewrite

SWEEP = SAMPLES / "vllm_cpu_queue_bound_sweep" / "bundle"
CLIENT_BOUND = SAMPLES / "vllm_cpu_client_bound" / "bundle"


@pytest.fixture(scope="module")
def sweep_pair() -> Any:
    a = analyze(SWEEP)
    return cmp.compare(a, a, resamples=200)


def test_cdfs_per_level_are_the_compared_samples(sweep_pair: Any) -> None:
    c = sweep_pair
    pics = c.pictures
    assert len(c.levels) >= 2 and [p["level"] for p in pics["levels"]] == [lv.label for lv in c.levels]
    for p in pics["levels"]:
        sa, _ = c.samples[p["level"]]
        ttft = p["ttft"]["a"]
        assert len(ttft) == 101 and ttft[0][1] == 0.0 and ttft[-1][1] == 1.0
        vals = sa.values["ttft"][np.isfinite(sa.values["ttft"])]
        assert ttft[50][0] == pytest.approx(float(np.median(vals)))
        assert ttft[0][0] == pytest.approx(vals.min()) and ttft[-1][0] == pytest.approx(vals.max())
        assert [x for x, _ in p["itl"]["b"]] == sorted(x for x, _ in p["itl"]["b"])


def test_curves_carry_the_tables_values_and_the_page_draws_them(sweep_pair: Any) -> None:
    c = sweep_pair
    js = c.to_json()
    rows = js["pictures"]["curves"]["b"]
    assert [r["label"] for r in rows] == [lv.label for lv in c.levels]
    for r, lv in zip(rows, c.levels, strict=True):
        assert r["output_tps"] == next(m.b for m in lv.metrics if m.metric == "output_tps")
        assert r["ttft_p99"] == next(m.b for m in lv.metrics if m.metric == "ttft_p99")
    specs = chart_specs(js)
    names = [s["name"] for s in specs["curve"]["series"]]
    assert "A TTFT P50" in names and "B ITL P99" in names
    assert all(len(v) == 2 for v in specs["levels"].values())
    html = render_comparison(js)
    assert html.count("<svg") == 2 * len(c.levels) + 1
    assert "Throughput vs latency, A and B" in html and "share of token gaps" in html


def test_not_comparable_runs_get_no_better_or_worse(tmp_path: Path) -> None:
    faster = _rewrite(CLIENT_BOUND, tmp_path / "faster", ttft_scale=0.3)  # would read "TTFT better"
    c = cmp.compare(analyze(CLIENT_BOUND), analyze(faster), resamples=200)
    assert not c.comparability["comparable"] and any("invalid" in p for p in c.comparability["problems"])
    verdicts = {m.verdict for lv in c.levels for m in lv.metrics}
    assert NOT_JUDGED in verdicts and not verdicts & set(JUDGED)
    assert c.comparability["attribution"].startswith("not comparable")
    html = render_comparison(c.to_json())
    assert 'class="better"' not in html and 'class="worse"' not in html and "Not comparable" in html


def test_a_latency_of_zero_ms_is_never_better(tmp_path: Path) -> None:
    firsts: dict[str, int] = {}

    def squash(r: dict[str, Any]) -> Any:  # every chunk stamped at the first token: ITL 0 ms, a client artefact
        if not isinstance(r.get("first_token_ns"), int):
            return None
        first = r["first_token_ns"]
        firsts[r["rid"]] = first
        return lambda t: first

    zero = _retime(QUEUE, tmp_path / "zero", squash)
    c = cmp.compare(analyze(QUEUE), analyze(zero), resamples=200)
    itl = c.metric("itl_p50")
    assert itl.a > 0 and itl.b == 0 and itl.verdict == "not comparable"
