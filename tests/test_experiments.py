"""Experiments as data: every shipped experiment names its one variable, engine flags are spelt per engine,
suggested values are computed from the bundle, and the verdict shows them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from diagnose.engines.experiments import ENGINE_FLAGS, describe, flag_for, resolve_value, variable_problems
from diagnose.model import Signal
from diagnose.pipeline import analyze

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT / "rules" / "catalog"


def _experiments() -> list[tuple[str, dict]]:  # type: ignore[type-arg]
    out = []
    for f in sorted(CATALOG.glob("*/*.yaml")):
        raw = yaml.safe_load(f.read_text())
        for c in raw.get("causes", []):
            if c.get("experiment"):
                out.append((f"{f.name}: {c['cause'][:50]}", c["experiment"]))
    return out


def test_every_shipped_experiment_names_a_valid_variable() -> None:
    exps = _experiments()
    assert len(exps) >= 80
    for where, exp in exps:
        assert "variable" in exp, where
        assert variable_problems(exp["variable"], where) == [], where


def test_engine_flags_are_spelt_per_engine() -> None:
    assert flag_for("max_num_seqs", "vllm") == "--max-num-seqs"
    assert flag_for("max_num_seqs", "llamacpp") == "--parallel"
    assert flag_for("max_num_batched_tokens", "sglang") == "--chunked-prefill-size"
    assert flag_for("max_num_seqs", None) == "" and flag_for("nope", "vllm") == ""
    assert all(flags for _what, flags in ENGINE_FLAGS.values())


def test_values_resolve_from_signals() -> None:
    sig = {"max_num_seqs": Signal("max_num_seqs", 2.0, "requests", "engine"),
           "prompt_tokens_mean": Signal("prompt_tokens_mean", 1537.0, "tokens", "client")}
    assert resolve_value({"signal": "max_num_seqs", "times": 2}, sig) == "4"
    assert resolve_value({"signal": "prompt_tokens_mean", "times": 0.5, "round": "up"}, sig) == "769"
    assert resolve_value({"signal": "missing"}, sig) == ""
    assert resolve_value("fp8", sig) == "fp8" and resolve_value(16, sig) == "16" and resolve_value(None, sig) == ""
    assert describe("engine_flag", "max_num_seqs", "16", "vllm") == \
        "engine setting max_num_seqs (vllm: --max-num-seqs) = 16"
    assert describe("env", "OMP_NUM_THREADS", "") == "environment variable OMP_NUM_THREADS"


@pytest.mark.parametrize("bad, needle", [
    ({"kind": "flag", "name": "x"}, "variable kind 'flag'"),
    ({"kind": "engine_flag", "name": "max_seqs"}, "not in diagnose/engines/experiments.py ENGINE_FLAGS"),
    ({"kind": "client"}, "needs a name"),
    ({"kind": "client", "name": "--rate", "value": {"times": 2}}, "needs {signal: NAME}"),
    ({"kind": "client", "name": "--rate", "extra": 1}, "unknown variable key 'extra'"),
    ("max_num_seqs", "must be a mapping"),
])
def test_bad_variables_are_named(bad: object, needle: str) -> None:
    assert any(needle in p for p in variable_problems(bad, "R.yaml")), variable_problems(bad, "R.yaml")


def test_the_verdict_names_the_variable_and_its_value() -> None:
    a = analyze(ROOT / "sample_traces" / "vllm_cpu_queue_bound")
    assert a.verdict is not None and a.verdict.top_rule == "SCH001"
    assert a.verdict.experiment.endswith("changes engine setting max_num_seqs (vllm: --max-num-seqs) = 16")
    f = next(x for x in a.findings if x.rule_id == "SCH001")
    exp = next(c.experiment for c in f.causes if c.status == "supported")
    assert exp is not None and (exp.variable_kind, exp.variable, exp.value) == ("engine_flag", "max_num_seqs", "16")
