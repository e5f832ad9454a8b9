"""`diagnose experiment --top N` (diagnose/runs/experiment_top.py; issue 38): one shared baseline, each top
finding's experiment alone, then all together, each verified with intervals; a what-if table. The captures are
replaced by copies of the queue-bound sample (the real-engine run is the lead's engine tier)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from diagnose.cli import exits
from diagnose.cli.main import cli
from diagnose.runs import experiment as er
from diagnose.runs import experiment_top as et
from tests.test_compare import QUEUE, _admitting, _rewrite

ARGV = ["vllm", "serve", "m", "--max-num-seqs", "2"]


def test_top_plans_take_runnable_findings_one_flag_each() -> None:
    plans, skipped = et.top_plans(QUEUE, ARGV, 3)
    assert [(p.finding, p.flag, p.value) for p in plans] == [("SCH001", "--max-num-seqs", "16")]
    assert any(s.startswith("SCH003: its experiment changes --max-num-seqs, as SCH001's does") for s in skipped)
    assert any("client setting" in s for s in skipped)  # VAL002: --duration is not an engine flag
    two = [er.Plan("SCH001", "max_num_seqs", "--max-num-seqs", "16", []),
           er.Plan("SCH002", "max_num_batched_tokens", "--max-num-batched-tokens", "4096", [])]
    assert et.combined_argv(ARGV, two) == ["vllm", "serve", "m", "--max-num-seqs", "16",
                                           "--max-num-batched-tokens", "4096"]


@pytest.fixture(scope="module")
def faster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("top")
    return _admitting(_rewrite(QUEUE, d / "faster", ttft_scale=0.3))


def _fake_captures(monkeypatch: pytest.MonkeyPatch, faster: Path) -> dict[str, list[str]]:
    launched: dict[str, list[str]] = {}

    def fake(argv: list[str], url: str, out: Path, *a: Any, **k: Any) -> list[str]:
        launched[out.name] = list(argv)
        shutil.copytree(QUEUE if out.name == "before" else faster, out, dirs_exist_ok=True)
        return []

    monkeypatch.setattr(er, "valid_capture", fake)
    return launched


def test_top_one_experiment_and_the_combined_change(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     faster: Path) -> None:
    launched = _fake_captures(monkeypatch, faster)
    two = [er.Plan("SCH001", "max_num_seqs", "--max-num-seqs", "16", er.apply_flag(ARGV, "--max-num-seqs", "16")),
           er.Plan("SCH001", "max_num_batched_tokens", "--max-num-batched-tokens", "4096",
                   er.apply_flag(ARGV, "--max-num-batched-tokens", "4096"))]
    monkeypatch.setattr(et, "top_plans", lambda *a: (two, ["VAL002: not an engine flag"]))
    r = CliRunner().invoke(cli, ["experiment", "--launch", " ".join(ARGV), "--url", "http://127.0.0.1:9", "-o",
                                 str(tmp_path / "x"), "--top", "2", "--warmup-s", "0", "--", "-c", "16"])
    assert r.exit_code == 0, r.output
    assert set(launched) == {"before", "exp1-SCH001", "exp2-SCH001", "combined"}
    assert launched["combined"] == ["vllm", "serve", "m", "--max-num-seqs", "16", "--max-num-batched-tokens", "4096"]
    js = json.loads((tmp_path / "x" / "top.json").read_text())
    rows = js["what_if"]
    assert [w["experiment"] for w in rows] == ["SCH001: --max-num-seqs 16", "SCH001: --max-num-batched-tokens 4096",
                                               "combined: --max-num-seqs 16, --max-num-batched-tokens 4096"]
    assert all(w["outcome"] == "confirmed" for w in rows) and js["skipped"] == ["VAL002: not an engine flag"]
    ttft = rows[-1]["metrics"]["ttft_p50"]
    assert ttft["rel"] < -0.5 and ttft["rel_hi"] < -0.5 and ttft["verdict"] == "better"
    assert "what-if" in r.output and "combined: --max-num-seqs 16" in r.output and "TTFT P50 -" in r.output


def test_top_refuses_finding_and_set_and_says_when_nothing_runs(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path, faster: Path) -> None:
    r = CliRunner().invoke(cli, ["experiment", "--launch", "x", "--url", "http://127.0.0.1:9", "-o", str(tmp_path),
                                 "--top", "2", "--finding", "SCH001"])
    assert r.exit_code == exits.USAGE and "drop --finding and --set" in r.output
    _fake_captures(monkeypatch, faster)
    monkeypatch.setattr(et, "top_plans", lambda *a: ([], ["SCH005: no value"]))
    r2 = CliRunner().invoke(cli, ["experiment", "--launch", "x", "--url", "http://127.0.0.1:9", "-o",
                                  str(tmp_path / "y"), "--top", "2", "--warmup-s", "0"])
    assert r2.exit_code == exits.INCONCLUSIVE and "not run: SCH005: no value" in r2.output
