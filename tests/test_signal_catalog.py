"""The signal catalogue (diagnose/signals/catalog.py) is exact and complete, and lint holds rules to it.

Both directions, on every shipped sample and trace plus small synthetic inputs for the paths no sample takes
(tests/signal_producers.py): every emitted signal is declared, with the unit, source and producer it was
emitted with; every declared signal is emitted by its producer.
"""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from diagnose.normalize import derived, host_stacks, prometheus
from diagnose.rules.lint import lint
from diagnose.signals.catalog import (
    CATALOG,
    ENGINE_SETTINGS,
    HOST_CATEGORIES,
    PCTS,
    SERVER_HISTOGRAMS,
    SIGNALS,
    SLO_METRICS,
    is_known,
)
from tests.cli_inproc import diagnose
from tests.signal_producers import Emitted, emitted_everywhere, sample_bundles, trace_inputs

CASES_DIR = Path(__file__).parent / "rules" / "cases"
# Declared signals that no shipped sample, trace or synthetic input here produces, because producing them
# needs hardware the samples lack. Each entry says which hardware. Empty today: the fake NVML library
# (tests/fakes/fake_nvml.py) stands in for GPM and NVLink counters.
NEEDS_HARDWARE: dict[str, str] = {}


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> list[Emitted]:
    return emitted_everywhere(tmp_path_factory.mktemp("producers"))


def test_the_inputs_are_there() -> None:
    assert len(sample_bundles()) >= 10 and len(trace_inputs()) >= 8


def test_every_emitted_signal_is_declared_with_its_unit_source_and_producer(emitted: list[Emitted]) -> None:
    undeclared: dict[str, str] = {}
    wrong: list[str] = []
    for e in emitted:
        spec = CATALOG.get(e.name)
        if spec is None:
            undeclared.setdefault(e.name, f"{e.producer} on {e.where}")
            continue
        got, want = (e.unit, e.source, e.producer), (spec.unit, spec.source, spec.producer)
        if got != want:
            wrong.append(f"{e.name}: emitted as (unit, source, producer) {got} on {e.where}, declared {want}")
    assert not undeclared, f"signals emitted but not declared in diagnose/signals/catalog.py: {undeclared}"
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_every_declared_signal_is_produced_by_its_producer(emitted: list[Emitted]) -> None:
    by_producer: dict[str, set[str]] = defaultdict(set)
    for e in emitted:
        by_producer[e.producer].add(e.name)
    never = sorted(n for n, s in CATALOG.items() if n not in by_producer[s.producer] and n not in NEEDS_HARDWARE)
    assert not never, f"declared signals that no input makes their producer emit: {never}"
    assert all(n in CATALOG for n in NEEDS_HARDWARE)


def test_producers_are_modules() -> None:
    for producer in {s.producer for s in CATALOG.values()}:
        assert importlib.util.find_spec(producer) is not None, producer


def test_families_follow_the_code_that_emits_them() -> None:
    assert HOST_CATEGORIES == host_stacks.CATEGORIES
    hist = [(prefix.removeprefix("server_"), pcts, mean) for _sig, prefix, pcts, mean, _what in
            prometheus.HISTOGRAM_SIGNALS]
    assert hist == [(stem, pcts, mean) for stem, pcts, mean, _what in SERVER_HISTOGRAMS]
    assert SLO_METRICS == derived.SLO_METRICS and PCTS == derived.PCTS
    assert {n: u for n, u, _what in ENGINE_SETTINGS} == prometheus.ENGINE_SETTINGS
    for cat in host_stacks.CATEGORIES:
        assert is_known(f"host_{cat}_cpu_share_ratio"), cat


def test_only_exact_names_are_known() -> None:
    assert is_known("ttft_p99_ms") and is_known("host_ipc_cpu_share_ratio") and is_known("trace_gpu_busy_ratio")
    # these passed the old prefix + unit-suffix rule (host_, gpu_, trace_, span_, server_ + _ratio, _ms, ...)
    for typo in ("host_ipc_cpu_shares_ratio", "gpu_utl_mean_ratio", "trace_gpu_busy_ratios_ratio",
                 "span_queue_time_p95_ms", "server_ttft_p95_ms", "ttft_p99_msx", "client_bound_ratio"):
        assert not is_known(typo), typo
    assert set(SIGNALS) == set(CATALOG) and all(SIGNALS[n] for n in SIGNALS)


def _user_rule(d: Path, *, signal: str = "ttft_p99_ms", title: str = "TTFT high {ttft_p99_ms:.0f} ms",
               case_signal: str = "ttft_p99_ms") -> Path:
    rules = d / "rules"
    (rules / "cases").mkdir(parents=True)
    rule = {"id": "USR001", "name": "user-rule", "family": "latency", "severity": "warning",
            "when": {"signal": signal, "op": ">", "value": 100}, "title": title,
            "hypothesis": "TTFT P99 is {ttft_p99_ms:.0f} ms", "evidence": ["ttft_p99_ms"],
            "causes": [{"cause": "too much load", "confirm": "queue grows", "refute": "queue empty",
                        "experiment": {"change": "halve the load", "expect": {"ttft_p99_ms": "down"}}}]}
    (rules / "USR001.yaml").write_text(yaml.safe_dump(rule))
    cases = {"rule": "USR001", "cases": [{"name": "high", "expect": "fires", "signals": {case_signal: 500}},
                                         {"name": "low", "expect": "quiet", "signals": {case_signal: 5}}]}
    (rules / "cases" / "USR001.yaml").write_text(yaml.safe_dump(cases))
    return rules


def test_lint_accepts_a_rule_on_declared_names(tmp_path: Path) -> None:
    assert lint([_user_rule(tmp_path)], [CASES_DIR]) == []


@pytest.mark.parametrize(("kw", "bad", "where"), [
    ({"signal": "host_ipc_cpu_shares_ratio"}, "host_ipc_cpu_shares_ratio", "USR001.yaml: unknown"),
    ({"signal": "server_ttft_p95_ms"}, "server_ttft_p95_ms", "USR001.yaml: unknown"),
    ({"title": "TTFT high {ttft_p99_sm:.0f} ms"}, "ttft_p99_sm", "text template"),
    ({"case_signal": "ttft_p99_msx"}, "ttft_p99_msx", "case 'high'"),
])
def test_lint_rejects_an_undeclared_name(tmp_path: Path, kw: dict[str, str], bad: str, where: str) -> None:
    problems = lint([_user_rule(tmp_path, **kw)], [CASES_DIR])
    hits = [p for p in problems if repr(bad) in p]
    assert hits and all("not declared in diagnose/signals/catalog.py" in p for p in hits), problems
    assert any(where in p for p in hits), hits


def test_lint_suggests_the_declared_name(tmp_path: Path) -> None:
    problems = lint([_user_rule(tmp_path, signal="server_ttft_p98_ms")], [CASES_DIR])
    assert any("did you mean" in p and "server_ttft_p99_ms" in p for p in problems), problems


def test_cli_rules_lint_fails_on_an_undeclared_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rules = _user_rule(tmp_path, signal="gpu_utl_mean_ratio")
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    p = diagnose("rules", "lint", "--rules", str(rules))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "unknown signal 'gpu_utl_mean_ratio'" in p.stdout and "Traceback" not in p.stderr
    ok = diagnose("rules", "lint")
    assert ok.returncode == 0 and "rules: OK" in ok.stdout, ok.stdout + ok.stderr


def test_cli_rules_signals_lists_the_catalogue() -> None:
    p = diagnose("rules", "signals")
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    assert len(lines) == len(CATALOG) + 1 and lines[-1] == f"{len(CATALOG)} signals"
    row = next(ln for ln in lines if ln.startswith("client_cpu_max_percent "))
    assert "percent" in row and "client" in row and "diagnose.normalize.client" in row
