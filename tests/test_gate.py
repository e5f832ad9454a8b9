"""The CI gate of `diagnose compare --fail-on-regression` (issue 33, item 3): a gate that cannot judge a metric
fails with its own status (exits.UNDECIDED) unless --allow-undecided; a percentile with too few requests for an
interval still regresses when every request of B is slower than every request of A by more than allowed; a
malformed gate or seed is a one-line error, exit 2."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from test_compare import _rows, _write_rows

from diagnose.cli import exits
from diagnose.cli.main import cli
from diagnose.compare import gate

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"
HEALTHY = SAMPLES / "vllm_cpu_healthy" / "bundle"  # c=2, 148 measured requests: too few for a P99 interval
QUEUE = SAMPLES / "vllm_cpu_queue_bound" / "bundle"  # c=16: no level in common with HEALTHY


def _delay_first_token(dst: Path, delay_ns: Callable[[dict[str, Any]], int]) -> Path:
    """A copy of HEALTHY whose every request's first token, chunks and end come ``delay_ns(row)`` later."""
    shutil.copytree(HEALTHY, dst)
    rows = _rows(HEALTHY / "requests.jsonl.gz")
    moved: dict[str, int] = {}
    for r in rows:
        if isinstance(r.get("first_token_ns"), int):
            d = moved[r["rid"]] = delay_ns(r)
            r["first_token_ns"] += d
            r["end_ns"] += d
    _write_rows(dst / "requests.jsonl.gz", rows)
    chunks = _rows(HEALTHY / "chunks.jsonl.gz")
    for c in chunks:
        c["t_ns"] = [t + moved.get(c["rid"], 0) for t in c["t_ns"]]
    _write_rows(dst / "chunks.jsonl.gz", chunks)
    return dst


def _compare(*args: str) -> Any:
    return CliRunner().invoke(cli, ["compare", *args, "--resamples", "200"])


def test_300ms_more_on_every_first_token_regresses_though_p99_has_too_few_requests(tmp_path: Path) -> None:
    """P99 27.7 -> 327.7 ms on 148 requests: no interval (too few), but every TTFT of B is above every TTFT of
    A by far more than 5%: a regression (exit 6), not a pass (the old gate exited 0)."""
    slow = _delay_first_token(tmp_path / "slow", lambda r: 300_000_000)
    r = _compare(str(HEALTHY), str(slow), "--json", str(tmp_path / "c.json"), "--fail-on-regression", "ttft_p99=5%")
    assert r.exit_code == exits.REGRESSION, r.output
    data = orjson.loads((tmp_path / "c.json").read_bytes())
    (row,) = data["gate"]
    assert row["verdict"] == "too few requests" and row["outcome"] == "regressed" and row["regressed"]
    assert "every request of B" in row["why"] and "REGRESSION at c=2: ttft_p99" in r.output


def test_a_change_beyond_the_allowance_with_too_few_requests_is_undecided(tmp_path: Path) -> None:
    """The TTFT of every other request 1.5x: P99 moves far beyond 5% but the samples overlap and P99 has too
    few requests for an interval: the gate cannot judge it: exit 9, and 0 with --allow-undecided."""
    mixed = _delay_first_token(tmp_path / "mixed", lambda r: (r["first_token_ns"] - r["sent_ns"]) // 2
                               if int(r["rid"].rsplit("-", 1)[1]) % 2 else 0)
    r = _compare(str(HEALTHY), str(mixed), "--fail-on-regression", "ttft_p99=5%")
    assert r.exit_code == exits.UNDECIDED, r.output
    assert "GATE UNDECIDED at c=2: ttft_p99" in r.output and "too few requests" in r.output
    ok = _compare(str(HEALTHY), str(mixed), "--fail-on-regression", "ttft_p99=5%", "--allow-undecided")
    assert ok.exit_code == exits.OK, ok.output
    assert "GATE UNDECIDED" in ok.output  # still said


def test_runs_without_a_common_load_level_are_undecided() -> None:
    r = _compare(str(HEALTHY), str(QUEUE), "--fail-on-regression", "ttft_p50=5%")
    assert r.exit_code == exits.UNDECIDED, r.output
    assert "no load level is common to both runs" in r.output


def test_a_metric_that_cannot_be_computed_is_undecided() -> None:
    """No price recorded or given: the cost metric is not measured; the gate says so instead of passing."""
    r = _compare(str(HEALTHY), str(HEALTHY), "--fail-on-regression", "cost_per_mtok=5%")
    assert r.exit_code == exits.UNDECIDED, r.output
    assert "cost_per_mtok" in r.output


def test_an_identical_run_passes_even_where_there_are_too_few_requests() -> None:
    """Within the allowance no interval could make it a regression: passed, not undecided (A/A, P99 of 148)."""
    r = _compare(str(HEALTHY), str(HEALTHY), "--fail-on-regression", "ttft_p99=1%,itl_p50=1%")
    assert r.exit_code == exits.OK, r.output


@pytest.mark.parametrize("spec, needle", [
    ("", "no METRIC=PCT% given"),
    ("ttft_p99=5%,", "empty item"),
    ("ttft_p99=5%,,itl_p50=3%", "empty item"),
    ("ttft_p99=5%,ttft_p99=10%", "given twice"),
    ("ttft_p99=-5%", "the allowance is a rise"),
    ("output_tps=3%", "the allowance is a drop"),
    ("output_tps=-100%", "cannot drop by 100%"),
    ("ttft_p99=5", "write it with %"),
    ("ttft_p99=0.05", "write it with %"),
    ("ttft_p99=inf%", "not a finite percentage"),
])
def test_a_malformed_gate_is_a_one_line_usage_error(spec: str, needle: str) -> None:
    with pytest.raises(Exception, match=needle):
        gate.parse_gate(spec)
    r = CliRunner().invoke(cli, ["compare", str(HEALTHY), str(HEALTHY), "--fail-on-regression", spec])
    assert r.exit_code == exits.USAGE, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diagnose: error: --fail-on-regression") and needle in lines[0]


def test_allow_undecided_needs_a_gate() -> None:
    r = CliRunner().invoke(cli, ["compare", str(HEALTHY), str(HEALTHY), "--allow-undecided"])
    assert r.exit_code == exits.USAGE and "--allow-undecided" in r.output


@pytest.mark.parametrize("command", ["compare", "verify"])
@pytest.mark.parametrize("seed", ["-1", str(2**32), str(2**70)])
def test_a_seed_out_of_range_is_a_one_line_usage_error(command: str, seed: str) -> None:
    """numpy refuses a negative seed and the JSON a seed beyond 64 bits: both were internal errors (exit 70)."""
    r = CliRunner().invoke(cli, [command, str(HEALTHY), str(HEALTHY), "--seed", seed])
    assert r.exit_code == exits.USAGE, r.output
    lines = r.output.strip().splitlines()
    assert lines == [f"diagnose: error: --seed {seed}: use an integer from 0 to {2**32 - 1}"]


def test_exit_status_9_is_documented() -> None:
    r = CliRunner().invoke(cli, ["compare", "--help"])
    assert f"{exits.UNDECIDED}    compare --fail-on-regression: the gate could not judge" in r.output
    doc = (Path(__file__).resolve().parent.parent / "docs" / "compare.md").read_text(encoding="utf-8")
    assert f"| {exits.UNDECIDED} |" in doc and "--allow-undecided" in doc


def test_the_compare_page_says_undecided_not_no(tmp_path: Path) -> None:
    """The page's gate table showed an undecided row as 'regressed: no'; it now names the outcome and why."""
    out = tmp_path / "c.html"
    r = _compare(str(HEALTHY), str(HEALTHY), "--fail-on-regression", "cost_per_mtok=5%", "-o", str(out))
    assert r.exit_code == exits.UNDECIDED, r.output
    gate = out.read_text().split('<section id="gate">', 1)[1].split("</section>", 1)[0]
    assert "undecided" in gate and "cost_per_mtok" in gate and "<td>no</td>" not in gate, gate
