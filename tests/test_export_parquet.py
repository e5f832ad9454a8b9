"""`diagnose export --format parquet`: every table of the analysis, read back with pandas and checked against
the analysis's own numbers."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.errors import DiagnoseError
from diagnose.export import parquet
from diagnose.export.files import SCHEMA_FILE, output_dir
from diagnose.pipeline import analyze, open_input
from tests.test_export_perfetto import spans_bundle

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "exports.md").read_text()
TRACE = ROOT / "tests" / "data" / "traces" / "h100_single_gpu_qwen1.5_0.5b_chat.json.gz"


def read_back(out: Path) -> tuple[dict[str, object], dict[str, pd.DataFrame]]:
    schema = orjson.loads((out / SCHEMA_FILE).read_bytes())
    files = {p.name for p in out.iterdir()}
    assert files == {SCHEMA_FILE} | {t["file"] for t in schema["tables"].values()}
    frames = {name: pd.read_parquet(out / t["file"]) for name, t in schema["tables"].items()}
    for name, t in schema["tables"].items():
        assert len(frames[name]) == t["rows"], name
        assert list(frames[name].columns) == [c["name"] for c in t["columns"]], name
    return schema, frames


def same(a: pd.Series, b: pd.Series) -> None:
    x, y = a.to_numpy(dtype=float), b.to_numpy(dtype=float)
    np.testing.assert_array_equal(np.isnan(x), np.isnan(y))
    np.testing.assert_array_equal(x[~np.isnan(x)], y[~np.isnan(y)])


@pytest.mark.parametrize("source", ["sample_traces/h200_toy_idle_between_steps", "sample_traces/vllm_cpu_queue_bound_sweep",
                                    "trace", "spans"])
def test_tables_read_back_equal_to_the_analysis(source: str, tmp_path: Path) -> None:
    src = TRACE if source == "trace" else spans_bundle(tmp_path) if source == "spans" else ROOT / source
    out = tmp_path / "tables"
    res = parquet.export(open_input(src), out)
    a = analyze(src)
    schema, got = read_back(out)
    assert set(got) == set(a.tables) | {"signals", "signal_series", "findings", "not_evaluated"}
    assert res.tables == {k: len(v) for k, v in got.items()}
    for name, df in a.tables.items():
        assert len(got[name]) == len(df) and list(got[name].columns) == [str(c) for c in df.columns], name
    if "requests" in a.tables:
        r, want = got["requests"], a.tables["requests"]
        assert len(r) == len(want) > 0
        assert list(r["rid"]) == list(want["rid"])
        same(r["ttft_ms"], want["ttft_ms"])
        same(r["e2e_ms"], want["e2e_ms"])
        assert list(r["ok"]) == list(want["ok"])
    sig = got["signals"]
    run = sig[sig["window"] == "run"].set_index("name")
    assert set(run.index) == set(a.signals) and len(a.signals) > 0
    for name, s in a.signals.items():
        assert run.loc[name, "value"] == s.value and run.loc[name, "unit"] == s.unit, name
    assert len(sig) == len(a.signals) + sum(len(p) for p in a.phase_signals)
    assert list(got["findings"]["rule_id"]) == [f.rule_id for f in a.findings]
    for row, f in zip(got["findings"].to_dict("records"), a.findings, strict=True):
        assert row["score"] == f.score and row["severity"] == f.severity
        assert [e["signal"] for e in orjson.loads(row["evidence_json"])] == [e.signal for e in f.evidence]
    series = got["signal_series"]
    assert len(series) == sum(len(s.series) for s in a.signals.values()) + sum(
        len(s.series) for p in a.phase_signals for s in p.values())
    if source == "spans":
        assert len(got["spans"]) == len(a.tables["spans"]) == 14
        assert got["request_breakdown"]["matched"].sum() == 6
    if source == "trace":
        assert got["trace_top_kernels"]["total_ms"].sum() == pytest.approx(a.tables["trace_top_kernels"]["total_ms"].sum())
    assert schema["clock_anchor"] == (open_input(src).manifest.get("capture") or {}).get("clock_anchor")


def test_the_doc_names_every_table_an_export_writes(tmp_path: Path) -> None:
    named = set(re.findall(r"`([a-z_]+)`", DOC))
    written = set(parquet.judgement_tables(analyze(TRACE)))  # an export writes these and the analysis's tables
    for src in (ROOT / "sample_traces" / "h200_toy_idle_between_steps", ROOT / "sample_traces" / "vllm_cpu_healthy",
                spans_bundle(tmp_path)):
        written |= set(analyze(src).tables)
    assert len(written) > 40 and written - named == set()


def test_mixed_object_columns_become_text() -> None:
    df = pd.DataFrame({"a": [1, "x", None, [1, 2]], "b": [1.0, math.nan, 2.0, 3.0]})
    t = parquet.to_arrow(df)
    assert str(t.schema.field("a").type) in ("string", "large_string")
    assert t.column("a").to_pylist() == ["1", "x", None, "[1,2]"]
    assert t.column("b").to_pylist()[0] == 1.0


def test_output_folder_rules(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(DiagnoseError, match="not empty"), output_dir(other):
        pass
    assert (other / "keep.txt").read_text() == "mine"
    out = tmp_path / "t"
    with pytest.raises(RuntimeError), output_dir(out) as d:
        (d / "x.parquet").write_bytes(b"half")
        raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]  # nothing left behind
    r = CliRunner().invoke(cli, ["export", str(TRACE), "-f", "parquet", "-o", str(out)])
    assert r.exit_code == 0, r.output
    first = {p.name for p in out.iterdir()}
    r = CliRunner().invoke(cli, ["export", str(TRACE), "-f", "parquet", "-o", str(out)])  # replaces the earlier one
    assert r.exit_code == 0 and {p.name for p in out.iterdir()} == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "t"]
    r = CliRunner().invoke(cli, ["export", str(TRACE), "-f", "parquet", "-o", str(other)])
    assert r.exit_code == 1 and r.output.count("\n") == 1 and str(other) in r.output
