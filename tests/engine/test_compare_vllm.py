"""`diagnose compare` and `diagnose verify` on real vLLM CPU captures (marker: engine): an A/A pair of the same
setting, and a pair that differs in one flag (--max-num-seqs 2 -> 8 under a queue-bound load)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

DIAG = [sys.executable, "-m", "diagnose"]
LOAD = ["--concurrency", "8", "--duration", "12s", "--input-tokens", "128", "--output-tokens", "32"]


def _attach(url: str, out: Path) -> None:
    p = subprocess.run([*DIAG, "attach", "--url", url, "--no-nvml", "--realtime", "-o", str(out), *LOAD],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DIAG, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(900)
def test_compare_and_verify_on_real_captures(start_vllm: Callable[..., object], tmp_path: Path) -> None:
    capped = start_vllm(extra_args=["--max-num-seqs", "2"])
    _attach(capped.url, tmp_path / "a1")  # type: ignore[attr-defined]
    _attach(capped.url, tmp_path / "a2")  # type: ignore[attr-defined]
    capped.stop()  # type: ignore[attr-defined]
    raised = start_vllm(extra_args=["--max-num-seqs", "8"])
    _attach(raised.url, tmp_path / "b")  # type: ignore[attr-defined]

    # A/A: the same setting twice in a row
    p = _run("compare", str(tmp_path / "a1"), str(tmp_path / "a2"), "--json", str(tmp_path / "aa.json"))
    assert p.returncode == 0, p.stderr
    aa = json.loads((tmp_path / "aa.json").read_text())
    assert aa["comparability"]["comparable"] and aa["comparability"]["changed"] == []
    judged = [m for lv in aa["levels"] for m in lv["metrics"]
              if m["verdict"] in ("better", "worse", "no significant change")]
    same = [m for m in judged if m["verdict"] == "no significant change"]
    assert len(judged) >= 8
    assert len(same) >= 0.9 * len(judged), [(m["metric"], m["verdict"], m["rel"]) for m in judged]

    # one flag changed: TTFT falls with the cap raised, and the queue-bound hypothesis is confirmed
    p = _run("compare", str(tmp_path / "a1"), str(tmp_path / "b"), "--json", str(tmp_path / "ab.json"),
             "--fail-on-regression", "ttft_p50=5%")
    assert p.returncode == 0, p.stdout + p.stderr  # faster is never a regression
    ab = json.loads((tmp_path / "ab.json").read_text())
    assert [c["what"] for c in ab["comparability"]["changed"]] == ["engine_config.max_num_seqs"]
    ttft = next(m for m in ab["levels"][0]["metrics"] if m["metric"] == "ttft_p50")
    assert ttft["verdict"] == "better" and ttft["rel_hi"] < 0, ttft
    gate = _run("compare", str(tmp_path / "b"), str(tmp_path / "a1"), "--fail-on-regression", "ttft_p50=5%", "-q")
    assert gate.returncode == 6, gate.stdout + gate.stderr  # the other way round it is a regression

    v = _run("verify", str(tmp_path / "a1"), str(tmp_path / "b"), "--json", str(tmp_path / "v.json"))
    ver = json.loads((tmp_path / "v.json").read_text())
    assert ver["finding"] == "SCH001", ver["finding"]
    assert v.returncode == 0 and ver["outcome"] == "confirmed", v.stdout
    # the same experiment judged on the A/A pair: nothing moved, the finding still fires
    r = _run("verify", str(tmp_path / "a1"), str(tmp_path / "a2"))
    assert r.returncode == 7 and r.stdout.startswith("refuted"), r.stdout
