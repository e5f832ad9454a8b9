"""A real llama-server whose context cannot hold any request (issue 34): every request is answered HTTP 400
"request (N tokens) exceeds the available context size (M tokens)", M being a slot's share of --ctx-size. The
verdict must name the context overflow with the sizes, not "the server answered every request with an error";
the finding quotes the server's body and its experiment raises the context with llama.cpp's own flag.

-c 512 over two slots (256 tokens each) against 600-token prompts. About 20 s (llama-server starts in under a
second; the load stops after 50 identical failures in a row).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from harness.llama_server import ensure_llama
from scenarios.spec import load_scenarios
from scenarios.suite import analysis_outputs, make_server, realtime_client_permitted, run_scenario

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.engine
@pytest.mark.skipif(shutil.which("taskset") is None, reason="the suite binds llama-server with taskset (util-linux)")
def test_every_request_overflowing_a_slot_is_named_with_the_sizes(tmp_path: Path) -> None:
    ensure_llama(quiet=True)
    defaults = yaml.safe_load((ROOT / "scenarios" / "llamacpp.yaml").read_text())["defaults"]
    spec = {"defaults": defaults, "scenarios": [{
        "name": "llama_prompt_over_slot", "description": "600-token prompts against 256-token slots",
        "engine": {"args": ["-c", "512", "-np", "2"]},
        "attach": ["--concurrency", "2", "--input-tokens", "600", "--duration", "8s", "--baseline", "0"],
        "expect": {"top": "VAL007", "top3": ["VAL007", "ERR001"]}}]}
    path = tmp_path / "scn.yaml"
    path.write_text(yaml.safe_dump(spec))
    scn = load_scenarios(path)[0]
    server = make_server(scn, 0, 18697, tmp_path / "engine.log", 60.0)
    with server:
        res = run_scenario(scn, server, tmp_path, 1, nice=0, client_rt=realtime_client_permitted())
    assert res.error is None, res.error
    _report, findings_path = analysis_outputs(tmp_path / f"{scn.name}-r1")
    doc = json.loads(findings_path.read_text())
    sig = {k: v["value"] for k, v in doc["signals"].items()}
    verdict = doc["verdict"]
    assert sig["error_context_overflow_ratio"] == 1.0, sig
    assert sig["error_context_limit_tokens"] == 256, sig  # a slot's share of -c 512, as the body states it
    need = sig["error_context_request_tokens"]
    assert need > 256, sig
    assert verdict.startswith("Run invalid: the server answered every request with an error: the request does not "
                              "fit the server's context"), verdict
    assert f"needs {need:,.0f} tokens, the context holds 256" in verdict, verdict
    err = next(f for f in doc["findings"] if f["rule_id"] == "ERR001")
    assert "exceeds the available context size (256 tokens)" in err["hypothesis"], err["hypothesis"]
    assert "between its 2 slots" in err["hypothesis"], err["hypothesis"]
    exp = next(c for c in err["causes"] if c["status"] == "supported")["experiment"]
    assert "context_length" in json.dumps(exp), exp  # spelt --ctx-size for llama.cpp (diagnose/engines/experiments.py)
