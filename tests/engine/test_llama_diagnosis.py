"""llama.cpp's llama-server diagnosed with the same rule catalogue as vLLM (issue 15): three scenarios of
scenarios/llamacpp.yaml run through the suite's own code (the server bound to one core, attach, analyze)
and their verdicts checked: the cause, the engine's own flag in the experiment, and the engine and its
settings named in the report.

Each takes about 30 s (llama-server starts in under a second).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.llama_server import ensure_llama
from scenarios.spec import load_scenarios
from scenarios.suite import analysis_outputs, make_server, run_scenario

SCENARIOS = {s.name: s for s in load_scenarios(Path(__file__).resolve().parents[2] / "scenarios" / "llamacpp.yaml")}

# scenario -> (expected top rule, text its verdict's experiment must hold)
CASES = {
    "llama_slots_saturated": ("SCH001", "raise --parallel"),
    "llama_ctx_too_small": ("SCH010", "raise --ctx-size"),
    "llama_threads_oversubscribed": ("HST006", "set --threads"),
}


@pytest.fixture(scope="module")
def llama_built() -> None:
    ensure_llama(quiet=True)


@pytest.mark.engine
@pytest.mark.skipif(shutil.which("taskset") is None, reason="the suite binds llama-server with taskset (util-linux)")
@pytest.mark.parametrize("name", sorted(CASES))
def test_llama_scenario_is_diagnosed_with_the_engines_own_flag(llama_built: None, name: str, tmp_path: Path) -> None:
    scn = SCENARIOS[name]
    top, flag_text = CASES[name]
    server = make_server(scn, 0, 18690 + sorted(CASES).index(name), tmp_path / "engine.log", 60.0)
    with server:
        res = run_scenario(scn, server, tmp_path, 1, nice=0, client_rt=False)
    report, findings_path = analysis_outputs(tmp_path / f"{name}-r1")
    evidence = ""
    if findings_path.exists():
        evidence = json.dumps({k: v["value"] for k, v in json.loads(
            findings_path.read_text())["signals"].items()}, indent=0)[:3000]
    assert res.error is None, res.error
    assert res.top1 == top, f"top {res.top3}, expected {top}; signals: {evidence}"
    findings = json.loads(findings_path.read_text())
    experiment = findings["diagnosis"]["experiment"]
    assert flag_text in experiment, findings["diagnosis"]
    assert "--max-num-seqs" not in experiment  # never vLLM's spelling on llama.cpp
    html = report.read_text()
    assert "llamacpp" in html and "b0-0c1e57098" in html  # the engine and its build
    assert "Engine settings read from the server: --ctx-size " in html and "--parallel " in html and "--threads " in html
    manifest = json.loads((tmp_path / f"{name}-r1" / "manifest.json").read_text())
    config = manifest["target"]["engine_config"]
    assert {"max_num_seqs", "context_size", "threads"} <= set(config), config  # its settings, recorded
    statuses = {p["name"]: p for p in findings["probes"]}  # the /slots samples came in
    assert statuses["slots"]["state"] == "ok", statuses["slots"]
