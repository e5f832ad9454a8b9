"""Length distributions for synthetic load (diagnose/capture/lengths.py; `attach --input-tokens DIST`): each
distribution's draws (moments, bounds, the same for one seed), the specs refused with one line, the manifest
record, the load probe sending the drawn lengths, and the workload card stating them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from diagnose.capture.lengths import BLOCK, LengthDist, LengthDraws, parse_lengths
from diagnose.errors import InputError
from diagnose.io.manifest import read_manifest
from diagnose.probes.load_options import workload_from_options
from tests.load_testserver import TestServer

DIAG = [sys.executable, "-m", "diagnose"]
N = 20_000


def draws(text: str, seed: int = 7, stream: str = "input", n: int = N) -> np.ndarray:
    d = LengthDraws(parse_lengths(text, "--input-tokens"), seed, stream)
    return np.array([d(i) for i in range(n)])


def test_plain_integer_and_fixed_are_one_length() -> None:
    assert parse_lengths("128", "--input-tokens") == LengthDist("fixed", "128", value=128)
    assert parse_lengths(64, "--output-tokens").value == 64  # a config file's integer
    assert set(draws("fixed:300", n=100)) == {300}


def test_uniform_covers_its_range_evenly() -> None:
    x = draws("uniform:min=16,max=2048")
    assert x.min() >= 16 and x.max() <= 2048
    assert x.min() < 30 and x.max() > 2030  # the whole range is drawn
    assert x.mean() == pytest.approx((16 + 2048) / 2, rel=0.02)
    assert x.std() == pytest.approx((2048 - 16) / np.sqrt(12), rel=0.03)


def test_normal_has_its_mean_and_stdev() -> None:
    x = draws("normal:mean=1000,stdev=100")
    assert x.mean() == pytest.approx(1000, rel=0.01) and x.std() == pytest.approx(100, rel=0.03)
    assert x.dtype.kind == "i"  # whole tokens


def test_lognormal_mean_and_stdev_are_the_lengths_own() -> None:
    x = draws("lognormal:mean=512,stdev=256")
    assert x.mean() == pytest.approx(512, rel=0.02) and x.std() == pytest.approx(256, rel=0.05)
    assert np.median(x) < x.mean()  # skewed to the right, as a lognormal is
    mu, sigma = np.log(512) - np.log1p(0.25) / 2, np.sqrt(np.log1p(0.25))
    assert np.median(x) == pytest.approx(np.exp(mu), rel=0.03)
    assert np.log(x).std() == pytest.approx(sigma, rel=0.03)


def test_bounds_truncate_the_distribution() -> None:
    x = draws("lognormal:mean=512,stdev=256,min=300,max=700")
    assert x.min() >= 300 and x.max() <= 700
    assert (x == 300).mean() < 0.02 and (x == 700).mean() < 0.02  # drawn again, not piled on the bounds
    y = draws("normal:mean=10,stdev=20,min=1,max=15")
    assert y.min() >= 1 and y.max() <= 15 and len(set(y)) == 15


def test_same_seed_same_draws_in_any_order_and_another_seed_differs() -> None:
    dist = parse_lengths("lognormal:mean=512,stdev=256,min=16,max=2048", "--input-tokens")
    a, b = LengthDraws(dist, 3, "input"), LengthDraws(dist, 3, "input")
    idx = [5, BLOCK + 9, 2 * BLOCK + 1, 5, 77]
    first = [a(i) for i in idx]
    assert [b(i) for i in reversed(idx)] == list(reversed(first))  # the order of the requests does not matter
    assert [a(i) for i in range(50)] != [LengthDraws(dist, 4, "input")(i) for i in range(50)]
    assert [a(i) for i in range(50)] != [LengthDraws(dist, 3, "output")(i) for i in range(50)]  # own stream
    assert LengthDraws(dist, -1, "input")(0) > 0  # a negative seed is a seed too


def test_histogram_file(tmp_path: Path) -> None:
    f = tmp_path / "h.csv"
    f.write_text("# lengths seen in production\ntokens,weight\n100,3\n1000-1099,1\n50,0\n")
    dist = parse_lengths(f"histogram:{f}", "--input-tokens")
    assert dist.bins == ((100, 100, 3.0), (1000, 1099, 1.0)) and (dist.low, dist.high) == (100, 1099)
    x = draws(f"histogram:{f}")
    assert set(x[x < 1000]) == {100} and (x == 100).mean() == pytest.approx(0.75, abs=0.015)
    high = x[x >= 1000]
    assert high.min() >= 1000 and high.max() <= 1099 and len(set(high)) == 100
    rec = dist.to_json()
    assert rec["bins"] == [[100, 100, 3.0], [1000, 1099, 1.0]] and LengthDist.from_json(rec) == dist


@pytest.mark.parametrize(("text", "why"), [
    ("abc", "use a length in tokens"),
    ("0", "must be 1 to"),
    ("-5", "use a length in tokens"),
    ("gauss:mean=5", "use a length in tokens"),
    ("lognormal:mean=512", "missing stdev"),
    ("lognormal:mean=512,stdev=0", "needs stdev > 0"),
    ("normal:mean=512,stdev=10,min=900", "keep only 0.00%"),
    ("normal:mean=512,stdev=10,min=700,max=600", "min=700 is more than max=600"),
    ("normal:mean=512,stdev=10,skew=2", "normal takes max, mean, min, stdev"),
    ("normal:mean=512,stdev=abc", "stdev=abc is not a non-negative number"),
    ("normal:mean=512,stdev=1,mean=3", "mean is given twice"),
    ("uniform:min=5", "uniform needs min and max"),
    ("uniform:min=1.5,max=9", "whole number"),
    ("fixed:x", "fixed: takes one whole length"),
    ("histogram:", "needs a file"),
    ("histogram:/no/such/file.csv", "is not a readable file"),
])
def test_bad_specs_are_one_line_naming_the_option(text: str, why: str) -> None:
    with pytest.raises(InputError) as e:
        parse_lengths(text, "--output-tokens")
    msg = str(e.value)
    assert msg.startswith(f"--output-tokens {text}: ") and why in msg and "\n" not in msg


def test_bad_histogram_rows_name_the_line(tmp_path: Path) -> None:
    f = tmp_path / "h.csv"
    for body, why in (("100,1\n200,x\n", ":2: weight 'x'"), ("100,1\n9-3,1\n", ":2: 9-3 must be"),
                      ("100,1,2\n", ":1: expected LENGTH,WEIGHT"), ("100,0\n", "no row with a positive weight")):
        f.write_text(body)
        with pytest.raises(InputError, match=why):
            parse_lengths(f"histogram:{f}", "--input-tokens")


def _options(**kw: Any) -> dict[str, Any]:
    from diagnose.cli.attach import attach

    ctx = attach.make_context("attach", ["--url", "http://127.0.0.1:9"])
    return {**ctx.params, **kw}


def test_manifest_records_the_spec_and_the_seed() -> None:
    spec = workload_from_options(_options(input_tokens="lognormal:mean=512,stdev=256,min=16,max=2048",
                                          output_tokens="uniform:min=10,max=20", seed=11, concurrency="4"))
    js = json.loads(json.dumps(spec.to_json()))
    assert js["input_lengths"] == {"kind": "lognormal", "spec": "lognormal:mean=512,stdev=256,min=16,max=2048",
                                   "mean": 512.0, "stdev": 256.0, "min": 16, "max": 2048}
    assert js["output_lengths"] == {"kind": "uniform", "spec": "uniform:min=10,max=20", "min": 10, "max": 20}
    assert js["seed"] == 11
    # the nominal lengths (the baseline's) are the median of the draws
    assert js["input_tokens"] == int(np.median(LengthDraws(spec.input_dist, 11, "input").block(0)))  # type: ignore[arg-type]
    assert 10 <= js["output_tokens"] <= 20
    read_manifest({"workload": js}, "manifest.json")  # the reader accepts it
    plain = workload_from_options(_options()).to_json()
    assert "input_lengths" not in plain and plain["input_tokens"] == 128 and plain["output_tokens"] == 64


def test_manifest_reader_refuses_a_malformed_record() -> None:
    from diagnose.errors import BundleError

    with pytest.raises(BundleError, match="workload.input_lengths"):
        read_manifest({"workload": {"input_lengths": [1, 2]}}, "m.json")


def test_a_distribution_with_a_replay_is_refused(tmp_path: Path) -> None:
    wl = Path(__file__).parent / "data" / "workload" / "mooncake_sample.jsonl"
    with pytest.raises(InputError, match="replays the file's own lengths"):
        workload_from_options(_options(workload=wl, input_tokens="uniform:min=1,max=9"))


def test_load_probe_sends_the_drawn_lengths(tmp_path: Path) -> None:
    from tests.test_workload import run_with_manifest

    o = _options(input_tokens="lognormal:mean=60,stdev=30,min=8,max=200", output_tokens="uniform:min=2,max=12",
                 num_requests="40", concurrency="4", baseline=3, warmup=0, seed=5)
    o["num_requests"] = 40
    spec = workload_from_options(o)
    srv = TestServer()
    b = asyncio.run(run_with_manifest(srv, spec, tmp_path / "b"))
    recs = sorted(b.records("requests"), key=lambda r: int(r["rid"].rsplit("-", 1)[1]))
    base, measured = recs[:3], recs[3:]
    assert len(measured) == 40 and all(r["ok"] for r in recs)
    # the baseline keeps the nominal lengths; the measured requests take the draws in order
    assert {r["prompt_tokens"] for r in base} == {spec.input_tokens} and {r["max_tokens"] for r in base} == {
        spec.output_tokens}
    ins, outs = LengthDraws(spec.input_dist, 5, "input"), LengthDraws(spec.output_dist, 5, "output")  # type: ignore[arg-type]
    assert sorted(r["prompt_tokens"] for r in measured) == sorted(max(ins(i), 7) for i in range(40))
    assert sorted(r["max_tokens"] for r in measured) == sorted(outs(i) for i in range(40))
    assert len({r["prompt_tokens"] for r in measured}) > 15 and len({r["max_tokens"] for r in measured}) > 5
    # exact: the server counts each prompt as planned (its tokenizer: one token a word plus BOS)
    sent = {body["prompt"]: None for body in srv.bodies}
    assert all(r["prompt_tokens_source"] == "tokenize" for r in measured)
    words = sorted(len(p.split()) + 1 for p in sent if p.strip() != "hello world")
    assert sorted(r["prompt_tokens"] for r in recs) == words
    assert len(sent) == len(recs) + 1  # every prompt unique (and the preflight's)


def test_workload_card_states_the_distributions(tmp_path: Path) -> None:
    from diagnose.cli.analyze import analysis_json, run_analysis
    from tests.test_workload import run_with_manifest

    o = _options(input_tokens="normal:mean=40,stdev=10,min=10", output_tokens="uniform:min=4,max=40", concurrency="3", baseline=0, warmup=0, seed=2)
    o["num_requests"] = 30
    spec = workload_from_options(o)
    asyncio.run(run_with_manifest(TestServer(), spec, tmp_path / "b"))
    a = run_analysis(tmp_path / "b")
    card = analysis_json(a)["workload_card"]
    assert card["source"] == ("synthetic; input tokens normal, mean 40, stdev 10, at least 10; "
                              "output tokens uniform, 4 to 40; drawn with seed 2")
    # the page: the card's source row, and the output length histogram is no longer one bar
    from diagnose.reports.render import write_report
    from diagnose.reports.workload_charts import lengths

    write_report(a, tmp_path / "r.html")
    assert "input tokens normal, mean 40, stdev 10, at least 10" in (tmp_path / "r.html").read_text()
    bars = [b for b in lengths(a, "output")["bins"] if b[2] > 0]
    assert len(bars) >= 4
    assert card["lengths"]["input_spec"] == "normal:mean=40,stdev=10,min=10" and card["lengths"]["seed"] == 2
    planned = card["input_tokens_planned"]
    assert planned["p50"] < planned["p90"] < planned["p99"]  # no longer one length
    drawn = [LengthDraws(spec.input_dist, 2, "input")(i) for i in range(30)]  # type: ignore[arg-type]
    if card["requests"] == 30:  # (a client stall can leave a request out of the statistics)
        assert planned == {f"p{q}": pytest.approx(float(np.percentile(drawn, q))) for q in (50, 90, 99)}


def test_attach_refuses_a_bad_spec_with_one_line_and_status_2() -> None:
    p = subprocess.run([*DIAG, "attach", "--url", "http://127.0.0.1:9", "--input-tokens", "lognormal:mean=5"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip() == ("diagnose: error: --input-tokens lognormal:mean=5: lognormal needs mean and stdev "
                                "(missing stdev), e.g. lognormal:mean=512,stdev=256,min=16,max=2048")
