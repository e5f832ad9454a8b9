"""Server-metrics normaliser: tables, window signals and sections from real vLLM scrapes and hand-made
sequences (counter resets, histogram windows, other engines' names)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from diagnose.analysis import Window
from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.normalize import TableContext
from diagnose.normalize import prometheus as prom
from diagnose.probes.prometheus import parse_scrape
from diagnose.reports.formatting import fmt_text
from diagnose.reports.sections.prometheus import sections as _prom_sections
from diagnose.signals.server_tables import server_tables

DATA = Path(__file__).parent / "data" / "metrics"
REAL_BUNDLE = DATA / "vllm_cpu_maxseqs2_bundle"
ALL = Window(-math.inf, math.inf)


def prom_sections(tables: dict[str, pd.DataFrame]) -> list:  # type: ignore[type-arg]
    """The Prometheus sections as the report builds them: from the pipeline's stage-2 tables for the whole capture
    (diagnose/signals/server_tables.py), which the sections only format."""
    return _prom_sections({**tables, **server_tables(tables, ALL)})


def _bundle(tmp_path: Path, texts: list[str], step_s: float = 1.0, target: dict[str, Any] | None = None) -> Path:
    """A bundle whose metrics stream holds one parsed scrape per text, ``step_s`` apart."""
    bw = BundleWriter(tmp_path / "b", target=target or {})
    fams: dict[str, dict[str, str]] = {}
    for i, text in enumerate(texts):
        samples, families = parse_scrape(text)
        fams.update({f["name"]: f for f in families})
        bw.stream("metrics").write({"t_ns": bw.anchor_mono_ns + int((i + 1) * step_s * 1e9), "scrape_ms": 1.0,
                                    "parse_ms": 1.0, "samples": samples})
    bw.stream("metric_families").write_many(list(fams.values()))
    bw.finish()
    return tmp_path / "b"


def _set(text: str, name: str, value: float, labels: str = "") -> str:
    """Set every sample ``name{...labels...}`` in a scrape text to ``value``."""
    pat = re.compile(rf"^({re.escape(name)}(\{{[^}}]*{re.escape(labels)}[^}}]*\}})?) \S+$", re.M)
    out, n = pat.subn(lambda m: f"{m.group(1)} {value}", text)
    assert n, f"{name} {labels} not in text"
    return out


def _signals(path: Path, window: Window = ALL) -> dict[str, Any]:
    return {s.name: s for s in prom.signals(prom.tables(open_bundle(path)), window)}


# -- the real capture (vLLM CPU, --max-num-seqs 2, concurrency 8, 120 requests) --------------------
def test_real_capture_signals_are_present_and_sane() -> None:
    tables = prom.tables(open_bundle(REAL_BUNDLE))
    assert set(tables) >= {"metrics", "metrics_hist", "metrics_hist_sum", "metrics_scrapes", "server_config"}
    assert set(tables["metrics"]["engine"]) == {"vllm"}
    s = {x.name: x for x in prom.signals(tables, ALL)}
    # 8 clients against 2 slots: up to 6 wait, never more than 2 run
    assert 1 <= s["queue_depth_max"].value <= 6
    assert s["running_requests_max"].value == 2
    # the means are time-weighted by Little's law (one point per scrape interval: 13 scrapes, 12 intervals),
    # worked out here from the raw histogram sums independently of the normaliser
    assert len(s["queue_depth_mean"].series) == 12
    sums = tables["metrics_hist_sum"]
    span = float((sums[sums["signal"] == "queue_time_seconds"].eval("t_s - t0_s")).sum())
    for name, hists in (("queue_depth_mean", ["queue_time_seconds"]),
                        ("running_requests_mean", ["prefill_time_seconds", "decode_time_seconds"])):
        busy = float(sums[sums["signal"].isin(hists)]["sum"].sum())
        assert s[name].value == pytest.approx(busy / span), name
        assert "Little's law" in s[name].description
    assert 0 < s["running_requests_mean"].value <= 2.0 + 1e-9  # never more than the 2 slots on average
    assert 0 <= s["kv_usage_max_ratio"].value < 0.05
    assert s["preemptions_total"].value == 0
    assert s["prefix_cache_hit_ratio"].value < 0.05  # unique prompts
    # 120 requests finished in the capture: every TTFT observation is in the window
    est = prom.hist_quantile(tables, "ttft_seconds", 0.5, ALL)
    assert est is not None and est.count == 120
    for p in (50, 90, 99):
        v = s[f"server_ttft_p{p}_ms"].value
        assert s[f"server_ttft_p{p}_bucket_lo_ms"].value <= v <= s[f"server_ttft_p{p}_bucket_hi_ms"].value
    assert s["server_ttft_p50_ms"].value <= s["server_ttft_p99_ms"].value
    # queueing dominates TTFT with 2 slots
    assert 0.5 < s["server_queue_share_of_ttft_ratio"].value <= 1.0
    # prefill P50 is bounded by the histogram sum, far below the (0, 300 ms] bucket's midpoint
    assert s["server_prefill_time_p50_ms"].value < 2 * s["server_prefill_time_mean_ms"].value
    assert "provably" in s["server_prefill_time_p50_ms"].description
    assert 1 < s["batch_tokens_per_step_mean"].value < 300
    assert s["kv_capacity_tokens"].value == 1048576
    assert s["server_output_tps"].value > 32 * 120 / 20  # 3840 tokens in ~12 s of scrapes
    assert "max_num_seqs" not in s  # not stated by any endpoint or the manifest: absent, not 0


def test_phase_window_only_counts_its_intervals() -> None:
    tables = prom.tables(open_bundle(REAL_BUNDLE))
    ts = sorted(tables["metrics_scrapes"]["t_s"])
    early = Window(ts[0], ts[3])
    s_all = prom.hist_quantile(tables, "ttft_seconds", 0.5, ALL)
    s_early = prom.hist_quantile(tables, "ttft_seconds", 0.5, early)
    assert s_all is not None and s_early is not None
    assert 0 < s_early.count < s_all.count
    # a window inside one scrape interval still gets that interval (its observations may lie in it)
    mid = Window(ts[5] + 0.1, ts[5] + 0.2)
    inc = prom.counter_increase(tables, "generation_tokens", mid)
    deltas = tables["metrics"].query("signal == 'generation_tokens'")["delta"].tolist()
    assert inc == deltas[6]


def test_sections_chart_and_histogram_table() -> None:
    secs = {s.id: s for s in prom_sections(prom.tables(open_bundle(REAL_BUNDLE)))}
    chart = secs["server_load"]
    assert chart.kind == "line_chart"
    names = [x.name for x in chart.payload.series]
    assert names == ["waiting requests", "running requests", "KV cache usage %"]
    assert max(p[1] for p in chart.payload.series[1].points) == 2
    table = secs["server_histograms"]
    assert table.payload.rows[0][0].startswith("server TTFT") and table.payload.rows[0][1] == 120


# -- counters and histograms over hand-made sequences ---------------------------------------------
def test_counter_reset_counts_the_new_value(tmp_path: Path) -> None:
    base = (DATA / "vllm_cpu_0.32_metrics_scrape.txt").read_text()
    texts = [_set(base, "vllm:num_preemptions_total", v) for v in (10, 14, 3, 5)]  # restart after 14
    s = _signals(_bundle(tmp_path, texts))
    assert s["preemptions_total"].value == 4 + 3 + 2


def test_server_restart_is_a_reset_even_when_the_counter_grew_past_its_old_value(tmp_path: Path) -> None:
    base = (DATA / "vllm_cpu_0.32_metrics_scrape.txt").read_text()
    t1 = _set(base, "vllm:num_preemptions_total", 10)
    t2 = _set(base, "vllm:num_preemptions_total", 12)
    # restarted between the 2nd and 3rd scrape and already preempted 20 times: 20 new, not 8
    t3 = _set(_set(base, "vllm:num_preemptions_total", 20), "process_start_time_seconds", 1.9e9)
    path = _bundle(tmp_path, [t1, t2, t3])
    assert _signals(path)["preemptions_total"].value == 2 + 20
    tables = prom.tables(open_bundle(path))
    assert tables["metrics_scrapes"]["restarted"].tolist() == [False, False, True]
    # the histograms restart too: all 1059 TTFTs of the third scrape are new
    assert prom.hist_mean(tables, "ttft_seconds", ALL)[1] == 1059  # type: ignore[index]


def test_histogram_reset_and_window_delta(tmp_path: Path) -> None:
    base = (DATA / "vllm_cpu_0.32_metrics_scrape.txt").read_text()
    fam = "vllm:time_to_first_token_seconds"

    def ttft(n_fast: float, n_slow: float) -> str:
        # n_fast observations <= 10 ms, n_slow in (100, 250] ms
        t = base
        for le in ("0.001", "0.005"):
            t = _set(t, f"{fam}_bucket", 0, f'le="{le}"')
        for le in ("0.01", "0.02", "0.04", "0.06", "0.08", "0.1"):
            t = _set(t, f"{fam}_bucket", n_fast, f'le="{le}"')
        for le in ("0.25", "0.5", "0.75", "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0",
                   "640.0", "2560.0", "+Inf"):
            t = _set(t, f"{fam}_bucket", n_fast + n_slow, f'le="{le}"')
        t = _set(t, f"{fam}_count", n_fast + n_slow)
        return _set(t, f"{fam}_sum", 0.005 * n_fast + 0.2 * n_slow)

    # 100 fast before the window; then 30 slow; then the server restarts and 10 slow more
    path = _bundle(tmp_path, [ttft(100, 0), ttft(100, 30), ttft(0, 10)])
    s = _signals(path)
    assert s["server_ttft_p50_bucket_lo_ms"].value == 100 and s["server_ttft_p50_bucket_hi_ms"].value == 250
    assert s["server_ttft_mean_ms"].value == pytest.approx(200)
    tables = prom.tables(open_bundle(path))
    assert prom.hist_mean(tables, "ttft_seconds", ALL) == pytest.approx((0.2, 40))


def test_missing_metrics_give_no_tables_and_no_signals(tmp_path: Path) -> None:
    bw = BundleWriter(tmp_path / "b")
    bw.finish()
    tables = prom.tables(open_bundle(tmp_path / "b"))
    assert tables == {}
    assert prom.signals(tables, ALL) == [] and prom_sections(tables) == []


def test_single_scrape_has_gauges_but_no_counter_or_histogram_signals(tmp_path: Path) -> None:
    s = _signals(_bundle(tmp_path, [(DATA / "vllm_cpu_0.32_metrics_scrape.txt").read_text()]))
    assert "queue_depth_mean" in s
    assert "preemptions_total" not in s and "server_ttft_p50_ms" not in s


def test_malformed_samples_are_skipped_with_a_warning(tmp_path: Path) -> None:
    bw = BundleWriter(tmp_path / "b")
    bw.stream("metrics").write({"t_ns": bw.anchor_mono_ns + 10**9, "samples": [
        ["vllm:num_requests_waiting", {"engine": "0"}, 3.0], ["oops"], "x", ["vllm:num_requests_running", {}, "7"]]})
    bw.stream("metrics").write({"t_ns": "bad", "samples": []})
    bw.finish()
    b = open_bundle(tmp_path / "b")
    ctx = TableContext.defaults()
    s = {x.name: x for x in prom.signals(prom.tables(b, ctx), ALL)}
    assert s["queue_depth_max"].value == 3 and "running_requests_max" not in s
    # the normaliser returns its note (the pipeline adds it to the analysis's warnings), not through the bundle
    assert any("3 malformed" in w for w in ctx.notes) and not any("3 malformed" in w for w in b.warnings)


def test_manifest_max_num_seqs_becomes_a_signal(tmp_path: Path) -> None:
    text = (DATA / "vllm_cpu_0.32_metrics_scrape.txt").read_text()
    s = _signals(_bundle(tmp_path, [text, text], target={"engine": "vllm", "config": {"max_num_seqs": 4}}))
    assert s["max_num_seqs"].value == 4


def test_data_parallel_engines_are_summed_for_counts_and_maxed_for_ratios(tmp_path: Path) -> None:
    one = (DATA / "vllm_cpu_0.32_metrics_scrape.txt").read_text()
    one = _set(_set(one, "vllm:num_requests_waiting", 2), "vllm:kv_cache_usage_perc", 0.3)
    # a second data-parallel engine (label engine="1"), its samples next to engine 0's
    two = one.replace('vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 2',
                      'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 2\n'
                      'vllm:num_requests_waiting{engine="1",model_name="tiny-llama"} 5.0')
    two = two.replace('vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.3',
                      'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.3\n'
                      'vllm:kv_cache_usage_perc{engine="1",model_name="tiny-llama"} 0.7')
    tables = prom.tables(open_bundle(_bundle(tmp_path, [two])))
    assert sorted(set(tables["metrics"].query("signal == 'queue_depth'")["dp"])) == ["0", "1"]
    s = {x.name: x for x in prom.signals(tables, ALL)}
    assert s["queue_depth_max"].value == 7
    assert s["kv_usage_max_ratio"].value == pytest.approx(0.7)


# -- other engines (hand-written name fixtures) ----------------------------------------------------
def _scaled(text: str, factor: float) -> str:
    """Multiply every sample value (not the comments) by ``factor``: a later scrape of the same server."""
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, val = line.rsplit(" ", 1)
            line = f"{head} {float(val) * factor}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_sglang_names_map_to_neutral_signals(tmp_path: Path) -> None:
    text = (DATA / "sglang_handwritten.txt").read_text()
    s = _signals(_bundle(tmp_path, [text, _scaled(text, 2)]))
    assert s["queue_depth_max"].value == 6 and s["running_requests_max"].value == 12
    assert s["kv_usage_max_ratio"].value == pytest.approx(0.84)
    # hits = device_hit + host_hit; queries = all modes: (3000 + 1000) / 10000
    assert s["prefix_cache_hit_ratio"].value == pytest.approx(0.4)
    assert s["preemptions_total"].value == 2
    assert s["server_ttft_p50_bucket_lo_ms"].value == 10 and s["server_ttft_p50_bucket_hi_ms"].value == 50
    assert s["server_queue_time_mean_ms"].value == pytest.approx(6.0)
    assert s["server_queue_time_p50_bucket_hi_ms"].value == 5
    assert s["server_itl_p50_bucket_hi_ms"].value == 10


def test_tgi_names_map_to_neutral_signals(tmp_path: Path) -> None:
    text = (DATA / "tgi_handwritten.txt").read_text()
    s = _signals(_bundle(tmp_path, [text, _scaled(text, 3)]))
    assert s["queue_depth_max"].value == 12 and s["running_requests_mean"].value == 16
    assert s["rejected_requests_total"].value == 6  # err="overloaded" only
    assert s["server_queue_time_mean_ms"].value == pytest.approx(50)
    assert "kv_usage_max_ratio" not in s and "server_ttft_p50_ms" not in s  # TGI has neither


def test_llamacpp_names_map_to_neutral_signals(tmp_path: Path) -> None:
    text = (DATA / "llamacpp_handwritten.txt").read_text()
    s = _signals(_bundle(tmp_path, [text, _scaled(text, 2)]))
    assert s["queue_depth_max"].value == 10 and s["running_requests_max"].value == 4
    assert s["prefix_cache_hit_ratio"].value == pytest.approx(1000 / 4000)
    assert s["server_output_tps"].value == pytest.approx(5000)


def test_unknown_engine_still_normalises_process_metrics(tmp_path: Path) -> None:
    text = ("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 10\n"
            "# TYPE myengine_queue gauge\nmyengine_queue 3\n")
    path = _bundle(tmp_path, [text, text.replace(" 10\n", " 10.5\n")])
    tables = prom.tables(open_bundle(path))
    assert set(tables["metrics"]["engine"]) == {"unknown"}
    s = {x.name: x for x in prom.signals(tables, ALL)}
    assert s["server_process_cpu_ratio"].value == pytest.approx(0.5)
    assert "queue_depth_mean" not in s


def test_ttft_cross_check_section_and_gap_with_the_client_table() -> None:
    from diagnose.normalize import client

    b = open_bundle(REAL_BUNDLE)
    tables = {**client.tables(b), **prom.tables(b)}
    s = {x.name: x for x in prom.signals(tables, ALL)}
    gap = s["server_ttft_client_gap_mean_ms"].value
    client_mean = float(tables["requests"]["ttft_ms"].mean())
    assert gap == pytest.approx(client_mean - s["server_ttft_mean_ms"].value)
    assert 0 < gap < 200  # the client's TTFT contains the server's
    sec = {x.id: x for x in prom_sections(tables)}["ttft_crosscheck"]
    rows = {fmt_text(r[0]): r for r in sec.payload.rows}
    assert set(rows) == {"P50", "P90", "P99", "mean"}
    assert rows["P90"][4] == "yes" and rows["P99"][4] == "yes"
    assert "120 client requests, 120 server TTFT observations" in fmt_text(sec.payload.note)
    # without the client table there is nothing to compare
    assert "ttft_crosscheck" not in {x.id for x in prom_sections(prom.tables(b))}


def test_a_window_the_scrapes_cover_only_in_part_gets_no_server_figures(tmp_path: Path) -> None:
    """CI: the metrics probe stopped after the first scrapes (a parse starved of CPU was read as a costly one),
    and the server TTFT P50 of the baseline's first seconds (60-80 ms) was reported as the measured window's,
    against a client P50 of 327 ms. Scrapes that do not span a window give it none but the coverage."""
    tables = prom.tables(open_bundle(REAL_BUNDLE))
    ts = sorted(tables["metrics_scrapes"]["t_s"])
    window = Window(ts[0], ts[-1])
    full = {s.name: s for s in prom.signals(tables, window)}
    assert full["metrics_window_coverage_ratio"].value == 1.0 and "server_ttft_p50_ms" in full
    early = {name: df[df["t_s"] <= ts[3]] if "t_s" in df else df for name, df in tables.items()}
    # the client's requests say the capture went on after the last scrape (without them nothing would)
    early["requests"] = pd.DataFrame({"sent_s": [ts[0], ts[-2]], "end_s": [ts[1], ts[-1]]})
    part = {s.name: s for s in prom.signals(early, window)}
    assert part["metrics_window_coverage_ratio"].value == pytest.approx((ts[3] - ts[0]) / (ts[-1] - ts[0]))
    assert part["metrics_window_coverage_ratio"].value < prom.MIN_WINDOW_COVERAGE
    assert set(part) == {"metrics_window_coverage_ratio", "server_requests_before_capture"}
    # the same scrapes still give the window they do span its figures
    covered = {s.name for s in prom.signals(early, Window(ts[0], ts[3]))}
    assert {"server_ttft_p50_ms", "queue_depth_mean"} <= covered
    # a window wider than the capture is clipped to what the capture holds (scrapes and client requests):
    # not uncovered (tests/engine/test_all_probes_vllm.py reads a capture's figures over (-1e9, 1e9))
    wide = {s.name: s for s in prom.signals(tables, Window(-1e9, 1e9))}
    assert wide["metrics_window_coverage_ratio"].value == 1.0 and "server_ttft_p50_ms" in wide


def test_analysis_warns_when_the_scrapes_stop_early(tmp_path: Path) -> None:
    import gzip
    import shutil

    from diagnose.pipeline import analyze

    src = Path(__file__).parents[1] / "sample_traces" / "vllm_cpu_healthy" / "bundle"
    shutil.copytree(src, tmp_path / "b")
    path = tmp_path / "b" / "metrics.jsonl.gz"
    lines = gzip.decompress(path.read_bytes()).splitlines()
    path.write_bytes(gzip.compress(b"\n".join(lines[:8]) + b"\n"))
    a = analyze(tmp_path / "b")
    assert "server_ttft_p50_ms" not in a.signals and a.signals["metrics_window_coverage_ratio"].value < 0.8
    assert any("metrics scrapes" in w and "no server figure" in w for w in a.warnings), a.warnings
    whole = analyze(src)
    assert whole.signals["metrics_window_coverage_ratio"].value == 1.0 and "server_ttft_p50_ms" in whole.signals
    assert not any("no server figure" in w for w in whole.warnings)
