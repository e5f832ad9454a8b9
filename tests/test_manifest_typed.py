"""The typed manifest (diagnose/io/manifest.py): every field the analysis reads is a frozen record checked on
read, so a wrong-typed field is one line naming the file and the field, never a traceback or a silent guess;
a shipped sample reads to the records the read paths use."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.errors import BundleError
from diagnose.io.bundle import open_bundle
from diagnose.io.manifest import read_manifest

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"


@pytest.mark.parametrize(("manifest", "named"), [
    ({"capture": {"started_at": 17}}, "field capture.started_at: expected a string, got 17"),
    ({"tool": {"version": 1}}, "field tool.version: expected a string, got 1"),
    ({"target": {"kind": ["fleet"]}}, "field target.kind: expected a string, got list"),
    ({"target": {"config": "x"}}, "field target.config: expected an object, got 'x'"),
    ({"workload": {"mode": 3}}, "field workload.mode: expected a string, got 3"),
    ({"workload": {"phases": [{"index": "0"}]}}, "field workload.phases[0].index: expected an integer, got '0'"),
    ({"workload": {"phases": [{"index": 0, "role": 1}]}}, "field workload.phases[0].role: expected a string"),
    ({"workload": {"seed": 1.5}}, "field workload.seed: expected an integer, got 1.5"),
    ({"workload": {"ignore_eos": "yes"}}, "field workload.ignore_eos: expected true or false, got 'yes'"),
    ({"workload": {"burstiness": "1"}}, "field workload.burstiness: expected a number, got '1'"),
    ({"workload": {"shared_prefix_fraction": True}}, "field workload.shared_prefix_fraction: expected a number"),
    ({"workload": {"replay": {"block_tokens": "16"}}}, "field workload.replay.block_tokens: expected an integer"),
    ({"workload": {"replay": []}}, "field workload.replay: expected an object, got list"),
    ({"workload": {"dataset": {"truncated": "no"}}}, "field workload.dataset.truncated: expected true or false"),
    ({"workload": {"extra": {"sampling": "greedy"}}}, "field workload.extra.sampling: expected an object"),
    ({"workload": {"extra": {"logprobs": "20"}}}, "field workload.extra.logprobs: expected an integer, got '20'"),
    ({"options": {"cost_per_hour": "2.5"}}, "field options.cost_per_hour: expected a number, got '2.5'"),
    ({"options": {"overhead_budget": [0.01]}}, "field options.overhead_budget: expected a number, got list"),
    ({"options": {"include_python": 1}}, "field options.include_python: expected true or false, got 1"),
    ({"artifacts": {"t": {"rank": "0"}}}, "field artifacts.t.rank: expected an integer, got '0'"),
    ({"artifacts": {"t": {"bytes": -0.5}}}, "field artifacts.t.bytes: expected a byte count"),
    ({"artifacts": {"t": {"window_start_ns": "1"}}}, "field artifacts.t.window_start_ns: expected a number"),
])
def test_a_wrong_typed_field_is_one_line_naming_the_file_and_the_field(manifest: dict[str, object],
                                                                       named: str) -> None:
    with pytest.raises(BundleError) as e:
        read_manifest(manifest, "b/manifest.json")
    msg = str(e.value)
    assert msg.startswith("b/manifest.json: ") and named in msg and "\n" not in msg, msg


def test_a_wrong_typed_field_stops_analyze_with_one_line(tmp_path: Path) -> None:
    shutil.copytree(SAMPLES / "vllm_cpu_queue_bound" / "bundle", tmp_path / "b")
    mf = tmp_path / "b" / "manifest.json"
    m = json.loads(mf.read_text())
    m["workload"]["phases"][0]["index"] = "zero"
    mf.write_text(json.dumps(m))
    r = CliRunner().invoke(cli, ["analyze", str(tmp_path / "b"), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and str(mf) in lines[0] and "workload.phases[0].index" in lines[0], r.output
    assert not (tmp_path / "r.html").exists()


def test_a_shipped_sample_reads_to_the_records_the_analysis_uses() -> None:
    meta = open_bundle(SAMPLES / "vllm_cpu_queue_bound" / "bundle").meta
    assert meta.target.engine == "vllm" and meta.target.model == "tiny-llama"
    assert dict(meta.target.engine_config) == {"max_model_len": 2048, "max_num_seqs": 2}
    assert isinstance(meta.target.engine_config["max_num_seqs"], int)  # as recorded: the report shows "2"
    wl = meta.workload
    assert wl is not None and wl.mode == "concurrency" and wl.api == "completions"
    assert [p.role for p in wl.phases][:1] == ["baseline"] and all(p.index is not None for p in wl.phases)
    assert meta.options.slo == {} and meta.options.cost_per_hour is None
    assert meta.tool.version and meta.capture.started_at and meta.capture.anchored
    assert meta.streams["requests"].records and meta.probe("load") is not None
    assert meta.probe_detail("no-such-probe") == {}


def test_a_missing_record_reads_as_absent_not_as_an_error() -> None:
    meta = read_manifest({"kind": "trace", "capture": {"complete": True}}, "m.json")
    assert meta.workload is None and meta.target.engine is None and meta.options.slo == {}
    assert not meta.capture.anchored and meta.streams == {} and meta.artifacts == {}
    # an empty workload object is no workload (the report shows no workload card)
    assert read_manifest({"workload": {}}, "m.json").workload is None
