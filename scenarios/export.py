"""Turn a scenario's bundle into a sample folder: sample_traces/<name>/{bundle/, expected_findings.json, README.md}.

The bundle is trimmed with tools/trim_bundle.py (streams gzipped, large artifacts dropped, the report and
findings of the run left out: the end-to-end test analyses the bundle afresh).
"""

from __future__ import annotations

import importlib.util
import json
import platform
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.engine import VLLM_CPU_VERSION
from scenarios.score import ScenarioResult
from scenarios.spec import Scenario

ROOT = Path(__file__).resolve().parent.parent
MAX_ARTIFACT_MB = 0.5


def _trim_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trim_bundle", ROOT / "tools" / "trim_bundle.py")
    if spec is None or spec.loader is None:  # pragma: no cover - the file ships with the repo
        raise RuntimeError("tools/trim_bundle.py not found")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def expected_findings(scn: Scenario, res: ScenarioResult) -> dict[str, Any]:
    """What the end-to-end test checks on this sample (tests/test_samples.py keys): a closed world, the exact top
    cause and exactly the findings at warning or above that this (correct) run produced."""
    alarm = sorted({str(f["rule_id"]) for f in res.serious if f.get("severity") in ("warning", "error", "critical")})
    if scn.expect_top is None:
        return {"top": None, "must_not_include_severity_at_least": "warning", "warning_and_above": alarm}
    out: dict[str, Any] = {"top": scn.expect_top, "must_include": [scn.expect_top], "warning_and_above": alarm}
    if scn.expect_top3:
        out["top3"] = list(scn.expect_top3)
    if scn.expect_top == "VAL001":
        out["run_valid"] = False
    return out


def readme(scn: Scenario, res: ScenarioResult, attach_cmd: str, engine_cmd: str) -> str:
    top = ", ".join(f"{f['rule_id']} ({f['severity']}, score {float(f.get('score') or 0):.2f})" for f in res.findings[:5])
    hog = ""
    if scn.hog is not None:
        where = "the engine worker's core" if scn.hog.target == "worker" else "the core the load client was pinned to"
        hog = (f"\nInjected: {scn.hog.procs} busy Python process(es) (`while True: pass`) pinned with `taskset` "
               f"to {where} for the whole capture.\n")
    if scn.engine_kind == "llamacpp":
        from harness.llama_server import LLAMA_CPP_COMMIT, LLAMA_CPP_PYTHON_VERSION

        where = "scenarios/llamacpp.yaml; rerun it alone with `python -m scenarios.suite --scenarios scenarios/llamacpp.yaml"
        engine = (f"the real llama.cpp llama-server (llama.cpp {LLAMA_CPP_COMMIT} from the llama-cpp-python "
                  f"{LLAMA_CPP_PYTHON_VERSION} sdist, CPU build, the harness's tiny random-weight Llama as GGUF")
    else:
        where = "scenarios/scenarios.yaml; rerun it alone with `python -m scenarios.suite"
        engine = (f"the real vLLM CPU engine (vllm-cpu {VLLM_CPU_VERSION}, the harness's tiny random-weight "
                  "Llama")
    return f"""# {scn.name}

{scn.description}

Captured {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} by the scenario suite (scenario `{scn.name}` of
{where} --only {scn.name}`) on {engine},
{platform.machine()}, 2 CPUs shared with other work), diagnose attach + analyze from this repository.

Engine: `{engine_cmd}`
{hog}
Capture: `{attach_cmd}`

Expected diagnosis: **{scn.expect_top or 'none at warning or above (healthy)'}**
(`expected_findings.json`; tests/test_samples.py checks it). Findings when captured: {top or 'none'}.

The bundle in `bundle/` is trimmed (tools/trim_bundle.py): streams gzipped, artifacts over
{MAX_ARTIFACT_MB} MB dropped. No prompt or output text is stored.
"""


MARKER = ".scenario-suite"  # marks a sample folder as the suite's own: others are never replaced


def export_sample(bundle: Path, dest: Path, scn: Scenario, res: ScenarioResult,
                  attach_cmd: str = "", engine_cmd: str = "") -> Path | None:
    """Write the sample folder; None when ``dest`` exists and was not made by the suite (left alone)."""
    if dest.exists() and not (dest / MARKER).exists():
        return None
    trim = _trim_module()
    with tempfile.TemporaryDirectory(prefix="diagnose-sample-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(bundle, src, ignore=shutil.ignore_patterns("report.html", "findings.json"))
        out = Path(tmp) / "out"
        trim.trim(src, out / "bundle", MAX_ARTIFACT_MB)
        (out / "expected_findings.json").write_text(json.dumps(expected_findings(scn, res), indent=1) + "\n",
                                                    encoding="utf-8")
        (out / "README.md").write_text(readme(scn, res, attach_cmd, engine_cmd), encoding="utf-8")
        (out / MARKER).write_text(f"{scn.name}\n", encoding="utf-8")
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(out, dest)
    return dest
