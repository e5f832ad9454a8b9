"""Observed traffic (issue 16, item 2): the workload card and a replayable workload of an observe-mode bundle,
from the server's counters and length histograms alone (diagnose/signals/observed.py). The bundles here are written
scrape by scrape from a known list of requests, in vLLM's metric names and its 1-2-5 length buckets."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest

from diagnose.analysis import Window
from diagnose.errors import DiagnoseError
from diagnose.io.bundle import open_bundle
from diagnose.io.workload_file import from_bundle, read_workload
from diagnose.io.writer import BundleWriter
from diagnose.normalize import prometheus
from diagnose.signals.observed import observed_requests, observed_workload
from tests.cli_inproc import diagnose

DIAG = [sys.executable, "-m", "diagnose"]
BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]  # vLLM's request_prompt_tokens buckets to 2048


def _hist(name: str, values: list[int]) -> list[list[object]]:
    v = np.asarray(values, dtype=float)
    out: list[list[object]] = [[f"{name}_bucket", {"le": f"{b:.1f}", "engine": "0"}, float((v <= b).sum())]
                               for b in BUCKETS]
    out.append([f"{name}_bucket", {"le": "+Inf", "engine": "0"}, float(len(v))])
    out.append([f"{name}_sum", {"engine": "0"}, float(v.sum())])
    out.append([f"{name}_count", {"engine": "0"}, float(len(v))])
    return out


def write_observe_bundle(path: Path, reqs: list[tuple[float, int, int]], hit: float = 0.4, interval: float = 0.5,
                         lengths: bool = True, spans: int = 0, jitter: float = 0.0,
                         e2e_s: list[float] | None = None,
                         spans_only: list[tuple[float, int, int]] = (),
                         arrive_s: list[float] | None = None, until: float | None = None) -> BundleWriter:
    """An observe-mode bundle whose scrapes (every ``interval`` s) count ``reqs`` (finish time, input, output
    tokens) as vLLM would; a prefix cache that hit ``hit`` of the prompt tokens; with ``spans``, the engine's
    ``llm_request`` spans of that many requests (the first ones), each arriving ``e2e_s[n]`` (0.2) s before it
    finished; ``spans_only``: spans of requests the scrapes never saw finish (they ended after the last one)."""
    bw = BundleWriter(path, target={"url": "http://x", "engine": "vllm"}, workload={"mode": "observe"})
    if spans or spans_only:
        sw = bw.stream("spans", "test spans")
        for n, (t, i, o) in enumerate([*reqs[:spans], *spans_only]):
            d = e2e_s[n] if e2e_s is not None and n < len(e2e_s) else 0.2
            sw.write({"trace_id": f"{n + 1:032x}", "span_id": f"{n + 1:016x}", "name": "llm_request",
                      "kind": "SERVER", "source": "grpc", "start_unix_ns": bw.anchor_unix_ns + int((t - d) * 1e9),
                      "end_unix_ns": bw.anchor_unix_ns + int(t * 1e9),
                      "attributes": {"gen_ai.usage.prompt_tokens": i, "gen_ai.usage.completion_tokens": o,
                                     "gen_ai.latency.time_to_first_token": 0.02, "gen_ai.latency.e2e": d}})
    w = bw.stream("metrics", "test scrapes")
    end = max(t for t, _, _ in reqs) + interval if until is None else until - interval
    for k in range(int(end / interval) + 2):
        t = k * interval + (jitter if k % 2 else 0.0)  # scrapes at unequal intervals, as a stretched probe's
        done = [r for r in reqs if r[0] <= t]
        prompt = sum(r[1] for r in done)
        samples: list[list[object]] = [
            ["vllm:request_success_total", {"engine": "0", "finished_reason": "length"}, float(len(done))],
            ["vllm:prompt_tokens_total", {"engine": "0"}, float(prompt)],
            ["vllm:generation_tokens_total", {"engine": "0"}, float(sum(r[2] for r in done))],
            ["vllm:prefix_cache_queries_total", {"engine": "0"}, float(prompt)],
            ["vllm:prefix_cache_hits_total", {"engine": "0"}, float(round(prompt * hit))],
            ["vllm:num_requests_running", {"engine": "0"},
             3.0 if arrive_s is None else float(sum(a <= t for a in arrive_s) - len(done))],
            ["vllm:num_requests_waiting", {"engine": "0"}, 0.0],
        ]
        if lengths:
            samples += _hist("vllm:request_prompt_tokens", [r[1] for r in done])
            samples += _hist("vllm:request_generation_tokens", [r[2] for r in done])
        w.write({"t_ns": bw.anchor_mono_ns + int(t * 1e9), "scrape_ms": 1.0, "samples": samples})
    bw.finish()
    # the capture lasted as long as its scrapes say (written here in an instant)
    manifest = orjson.loads((path / "manifest.json").read_bytes())
    manifest["capture"]["ended_unix_ns"] = bw.anchor_unix_ns + int((k * interval + 0.1) * 1e9)
    (path / "manifest.json").write_bytes(orjson.dumps(manifest))
    return bw


def _known(n: int = 120, rate: float = 4.0, seed: int = 1) -> list[tuple[float, int, int]]:
    rng = random.Random(seed)
    return [(0.3 + i / rate, rng.randint(64, 400), rng.randint(16, 96)) for i in range(n)]


def _window(path: Path) -> tuple[dict[str, object], Window]:
    tables = prometheus.tables(open_bundle(path))
    s = tables["metrics_scrapes"]["t_s"]
    return tables, Window(float(s.min()), float(s.max()))


def test_the_observed_card_matches_the_traffic(tmp_path: Path) -> None:
    reqs = _known()
    write_observe_bundle(tmp_path / "obs", reqs)
    tables, window = _window(tmp_path / "obs")
    seen = observed_workload(tables, window)  # type: ignore[arg-type]
    assert seen is not None
    assert seen["requests"] == 120
    span = seen["seconds"]
    assert seen["rate_rps"] == pytest.approx(120 / span)
    assert 3.4 < seen["rate_rps"] < 4.1  # 120 requests over the scrapes' 30.5 s (4/s while they ran)
    inp = np.array([r[1] for r in reqs])
    assert seen["input_tokens"]["mean"] == pytest.approx(inp.mean())  # exact: _sum / _count
    assert seen["output_tokens"]["mean"] == pytest.approx(np.mean([r[2] for r in reqs]))
    for p in (50, 90, 99):  # each percentile lies in the bucket the card names with it
        lo, hi = seen["input_tokens"][f"p{p}_bucket"]
        assert lo < np.percentile(inp, p) <= hi, (p, lo, hi)
    assert seen["prefix_cache_hit_ratio"] == pytest.approx(0.4, abs=0.01)
    assert seen["dispersion"] < 0.5  # evenly spaced arrivals: 2 per interval, every interval
    assert seen["arrived"] == 120 and seen["arrival_rps"] == seen["rate_rps"]  # steady: as many came as left


def test_a_server_that_fell_behind_is_named_and_its_arrivals_replayed(tmp_path: Path) -> None:
    """CI, a slow host: the driver sent 4 requests a second, the server finished 3.6 in the observation, and
    the card's rate and the workload file (finished counts as arrivals) understated the traffic by 10%. The
    arrivals are the finished count plus the change in waiting + running, scrape by scrape."""
    rng = random.Random(2)
    arrive = [0.3 + i / 4.0 for i in range(120)]  # 4 a second
    reqs = [(0.5 + i / 3.5, rng.randint(64, 400), rng.randint(16, 96)) for i in range(120)]  # 3.5 finish
    write_observe_bundle(tmp_path / "obs", reqs, arrive_s=arrive, until=20.0)
    tables, window = _window(tmp_path / "obs")
    seen = observed_workload(tables, window)  # type: ignore[arg-type]
    assert seen is not None and window.end_s == pytest.approx(20.0)
    finished = sum(t <= 20.0 for t, _, _ in reqs)
    came = sum(a <= 20.0 for a in arrive)
    assert (seen["requests"], seen["arrived"]) == (finished, came) == (69, 79)
    assert seen["in_server"] == [0.0, 10.0]
    assert seen["arrival_rps"] == pytest.approx(79 / 20.0) and seen["rate_rps"] == pytest.approx(69 / 20.0)
    card = diagnose("analyze", str(tmp_path / "obs"), "-o", str(tmp_path / "r.html"), "--json",
                    str(tmp_path / "a.json"), "-q")
    assert card.returncode in (0, 5), card.stderr
    c = orjson.loads((tmp_path / "a.json").read_bytes())["workload_card"]
    assert c["arrival_rps"] == pytest.approx(3.95) and "the server fell behind: requests in it rose from 0 to 10" in c["note"]
    html = (tmp_path / "r.html").read_text()
    assert "Arrival rate (finished + change in waiting and running)" in html and "3.95 req/s" in html
    # the replayable workload sends what arrived, at the rate it arrived, not what finished
    got, _block, note = from_bundle(open_bundle(tmp_path / "obs"))
    assert len(got) == 79 and "arrivals (finished + change in waiting and running)" in note
    assert (len(got) - 1) / (got[-1].offset_s - got[0].offset_s) == pytest.approx(4.0, rel=0.05)
    # steady traffic is not called behind
    write_observe_bundle(tmp_path / "steady", _known())
    steady = diagnose("analyze", str(tmp_path / "steady"), "--json", str(tmp_path / "s.json"), "-q",
                      "-o", str(tmp_path / "s.html"))
    assert steady.returncode in (0, 5), steady.stderr
    assert "fell behind" not in orjson.loads((tmp_path / "s.json").read_bytes())["workload_card"]["note"]


def test_the_report_card_of_an_observe_bundle(tmp_path: Path) -> None:
    write_observe_bundle(tmp_path / "obs", _known())
    p = diagnose("analyze", str(tmp_path / "obs"), "-o", str(tmp_path / "r.html"), "--json",
                 str(tmp_path / "a.json"), "-q")
    assert p.returncode in (0, 5), p.stderr
    card = orjson.loads((tmp_path / "a.json").read_bytes())["workload_card"]
    assert card["source"] == "observed traffic" and card["requests"] == 120
    assert card["input_tokens_bounds"]["p50"] == [200.0, 500.0] or card["input_tokens_bounds"]["p50"][0] >= 200
    assert card["prefix_share_observed"] == pytest.approx(0.4, abs=0.01)
    html = (tmp_path / "r.html").read_text()
    assert "Rate (server counter)" in html and "(server histograms)" in html and "a lower bound" in html


def test_a_workload_derived_from_observed_traffic(tmp_path: Path) -> None:
    reqs = _known()
    write_observe_bundle(tmp_path / "obs", reqs, hit=0.5)
    got, block, note = from_bundle(open_bundle(tmp_path / "obs"))
    assert block == 16 and "observed traffic" in note
    assert len(got) == 120
    # the token totals are the server's exactly: a replay sends the token rates it saw
    assert sum(r.input_tokens for r in got) == sum(r[1] for r in reqs)
    assert sum(r.output_tokens for r in got) == sum(r[2] for r in reqs)
    # the distribution is the histogram's: each drawn length's bucket count matches the server's
    for key, truth in (("input", [r[1] for r in reqs]), ("output", [r[2] for r in reqs])):
        drawn = [r.input_tokens if key == "input" else r.output_tokens for r in got]
        for lo, hi in zip([0, *BUCKETS], BUCKETS, strict=False):
            n_true = sum(lo < v <= hi for v in truth)
            n_drawn = sum(lo < v <= hi for v in drawn)
            assert abs(n_true - n_drawn) <= max(2, 0.1 * n_true), (key, lo, hi, n_true, n_drawn)
    # arrivals: the finished counts per scrape interval (2 per 0.5 s) plus the change in the server (none
    # here), so the rate is the server's
    span = got[-1].offset_s - got[0].offset_s
    assert (len(got) - 1) / span == pytest.approx(4.0, rel=0.05)
    # one prefix group covering the hit ratio's share of each prompt, in whole blocks
    longest = max((r.prefix for r in got), key=len)
    assert len(longest) >= 6 and all(r.prefix == longest[: len(r.prefix)] for r in got)
    share = sum(len(r.prefix) * block for r in got) / sum(r.input_tokens for r in got)
    assert share == pytest.approx(0.5, abs=0.01)
    assert all(abs(len(r.prefix) - 0.5 * r.input_tokens / 16) <= 1 for r in got)  # within a block of its share


def test_the_prefix_share_holds_with_large_blocks() -> None:
    """vLLM's CPU engine caches blocks of 128 tokens: a 200-token prompt's 27% is a quarter of one block, so
    rounding each prompt alone gives 0 blocks to most prompts; the rounding error is carried on instead."""
    from diagnose.signals.observed import _shared_blocks

    rng = random.Random(2)
    inputs = [rng.randint(64, 400) for _ in range(200)]
    for hit in (0.05, 0.15, 0.27, 0.5):
        k = _shared_blocks(inputs, hit, 128)
        assert all(0 <= b * 128 <= i - 1 for b, i in zip(k, inputs, strict=True))  # a token of its own
        assert sum(b * 128 for b in k) / sum(inputs) == pytest.approx(hit, abs=0.01), hit
    alone = sum(round(0.15 * i / 128) * 128 for i in inputs) / sum(inputs)  # each prompt rounded alone
    assert alone == 0.0  # 0.15 of at most 400 tokens is under half a block


def test_diagnose_workload_writes_the_observed_workload(tmp_path: Path) -> None:
    write_observe_bundle(tmp_path / "obs", _known())
    p = diagnose("workload", str(tmp_path / "obs"), "-o", str(tmp_path / "w.jsonl"))
    assert p.returncode == 0, p.stderr
    assert "120 requests" in p.stdout
    rp = read_workload(tmp_path / "w.jsonl")
    assert len(rp.requests) == 120 and rp.format == "diagnose"


def test_observed_traffic_without_length_histograms_is_one_line(tmp_path: Path) -> None:
    write_observe_bundle(tmp_path / "obs", _known(20), lengths=False)
    with pytest.raises(DiagnoseError, match="no per-request length histogram for input_tokens and output_tokens"):
        from_bundle(open_bundle(tmp_path / "obs"))
    tables, window = _window(tmp_path / "obs")
    seen = observed_workload(tables, window)  # type: ignore[arg-type]
    assert seen is not None and seen["input_tokens"] is None and seen["requests"] == 20
    with pytest.raises(ValueError, match="length histogram"):
        observed_requests(tables, window, 16)  # type: ignore[arg-type]


def test_the_engines_spans_give_exact_lengths_and_arrivals(tmp_path: Path) -> None:
    reqs = _known()
    write_observe_bundle(tmp_path / "obs", reqs, hit=0.5, spans=len(reqs))
    from diagnose.pipeline import analyze
    from diagnose.signals.workload_card import workload_card

    card = workload_card(analyze(tmp_path / "obs"))
    assert card is not None and card["lengths_from"] == "engine spans (120 requests)"
    inp = np.array([r[1] for r in reqs], dtype=float)
    assert card["input_tokens"] == {f"p{p}": pytest.approx(float(np.percentile(inp, p))) for p in (50, 90, 99)}
    assert card["input_tokens_mean"] == pytest.approx(inp.mean()) and "input_tokens_bounds" not in card
    got, _, note = from_bundle(open_bundle(tmp_path / "obs"))
    assert "the engine's request spans" in note
    # each request as it was: lengths paired, arrivals 0.25 s apart
    assert [(r.input_tokens, r.output_tokens) for r in got] == [(i, o) for _, i, o in reqs]
    assert [r.offset_s for r in got] == pytest.approx([t - reqs[0][0] for t, _, _ in reqs], abs=1e-6)
    share = sum(len(r.prefix) * 16 for r in got) / sum(r.input_tokens for r in got)
    assert share == pytest.approx(0.5, abs=0.01)


def test_the_spans_stand_for_the_requests_the_counter_saw_finish(tmp_path: Path) -> None:
    """The card's requests are those the server's counter saw finish in the window; its lengths come from the
    spans of the same requests, chosen by when they ended, not when they arrived. Chosen by arrival, the long
    requests that arrived before the first scrape were left out and those that arrived near the end but finished
    after the last scrape (their spans exported later) were counted: on a loaded vLLM the spans of the last
    arrivals come after the receiver's drain, and the lengths leaned to the short requests (engine tier: 53 spans
    for 64 arrivals)."""
    reqs = _known()
    long = [4.0 if n % 4 == 0 else 0.2 for n in range(len(reqs))]  # every 4th request runs 4 s
    end = reqs[-1][0]
    late = [(end + 3.0 + k, 300, 90) for k in range(6)]  # arrived in the window, finished after it
    write_observe_bundle(tmp_path / "obs", reqs, spans=len(reqs), e2e_s=long + [4.0] * len(late), spans_only=late)
    from diagnose.pipeline import analyze
    from diagnose.signals.workload_card import workload_card

    card = workload_card(analyze(tmp_path / "obs"))
    assert card is not None and card["lengths_from"] == "engine spans (120 requests)", card.get("lengths_from")
    out = np.array([r[2] for r in reqs], dtype=float)
    assert card["output_tokens_mean"] == pytest.approx(out.mean())


def test_spans_of_too_few_requests_leave_the_histograms(tmp_path: Path) -> None:
    write_observe_bundle(tmp_path / "obs", _known(), spans=60)  # half the requests exported spans
    from diagnose.pipeline import analyze
    from diagnose.signals.workload_card import workload_card

    card = workload_card(analyze(tmp_path / "obs"))
    assert card is not None and card["lengths_from"] == "server histograms" and "input_tokens_bounds" in card
    _, _, note = from_bundle(open_bundle(tmp_path / "obs"))
    assert "length histograms" in note


def test_unequal_scrape_intervals_are_not_read_as_bursts(tmp_path: Path) -> None:
    """Evenly spaced arrivals (8/s) scraped at intervals of 0.1 s and 0.9 s (a probe stretched by its overhead
    budget is uneven too): the counts per interval differ by 7x, but against the rate each interval expects
    they do not (the plain variance / mean of the counts read 1.67, "bursty", on a real evenly spaced run)."""
    write_observe_bundle(tmp_path / "obs", _known(240, rate=8.0), jitter=-0.4)
    tables, window = _window(tmp_path / "obs")
    per = prometheus.counter_intervals(tables, "finished_requests", window)  # type: ignore[arg-type]
    counts = per["delta"].to_numpy(dtype=float)
    assert counts.var(ddof=1) / counts.mean() > 1.5  # what the plain ratio says: "bursty"
    seen = observed_workload(tables, window)  # type: ignore[arg-type]
    assert seen is not None and seen["dispersion"] < 0.3
    rng = random.Random(4)  # Poisson arrivals: about 1
    t, poisson = 0.3, []
    for _ in range(300):
        t += rng.expovariate(4.0)
        poisson.append((t, 100, 20))
    write_observe_bundle(tmp_path / "poisson", poisson, jitter=-0.2)
    tables, window = _window(tmp_path / "poisson")
    seen = observed_workload(tables, window)  # type: ignore[arg-type]
    assert seen is not None and 0.6 < seen["dispersion"] < 1.5
