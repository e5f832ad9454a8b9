"""Every judgement number lives in rules/thresholds.yaml, is used by a rule, and `--threshold` moves it."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from diagnose.rules.spec import CATALOG_DIR, THRESHOLDS_FILE
from tests.cli_inproc import diagnose

ROOT = Path(__file__).resolve().parent.parent
CLIENT_BOUND = ROOT / "sample_traces" / "vllm_cpu_client_bound" / "bundle"


def test_every_threshold_is_used_by_a_rule() -> None:
    names = yaml.safe_load(THRESHOLDS_FILE.read_text())
    rules = "\n".join(p.read_text() for p in sorted(CATALOG_DIR.rglob("*.yaml")))
    # the one table-stage judgement (which requests a short client stall touched) reads its thresholds by name
    stalls = (ROOT / "diagnose" / "normalize" / "client_stalls.py").read_text()
    # and so does the readiness card (diagnose readiness, issue 37), which judges its own measurements
    stalls += (ROOT / "diagnose" / "readiness" / "card.py").read_text()
    unused = [n for n in names if f"${n}" not in rules and f"thr.{n}" not in rules and f'"{n}"' not in stalls]
    assert not unused, f"thresholds no rule uses: {unused}"
    for n in ("client_cpu_bound_percent", "client_cpu_bound_share", "client_loop_lag_max_ms",
              "client_schedule_lag_max_ms"):
        assert n in names, n


def test_the_catalogue_writes_no_threshold_as_a_number() -> None:
    """Issue 10 item 5: every number a shipped rule judges by is in rules/thresholds.yaml (TRC001-TRC008's impact
    floors, TRC004's share of steps, LAT006/LAT007's hold and FLT001-FLT003's replica count were literals);
    0 and 1 are no thresholds (flags, counts that must not be zero). A user's own rule may use numbers."""
    from diagnose.rules.lint import _catalogue_literals, lint, literal_numbers
    from diagnose.rules.spec import load_raw, rule_files

    found = [p for f in rule_files([CATALOG_DIR]) for p in _catalogue_literals(load_raw(f), f)]
    assert found == []
    raw = {"when": {"all": [{"signal": "x", "op": ">", "value": 0.3, "hold": 0.5}, {"signal": "f", "op": ">=",
                                                                                    "value": 1}]},
           "impact": {"signal": "x", "over": 2.0},
           "causes": [{"supported_when": {"signal": "a", "op": ">=", "value": {"signal": "b", "times": 0.5}},
                       "refuted_when": {"signal": "a", "op": "<=", "value": 0}}]}
    assert sorted(literal_numbers(raw)) == [("causes[0].supported_when.value.times", 0.5), ("impact.over", 2.0),
                                            ("when.all[0].hold", 0.5), ("when.all[0].value", 0.3)]
    msgs = _catalogue_literals(raw, Path("X.yaml"))
    assert len(msgs) == 4 and any("causes[0].supported_when.value.times" in m for m in msgs), msgs
    assert all("belongs in rules/thresholds.yaml" in m for m in msgs)
    assert lint([], [ROOT / "tests" / "rules" / "cases"]) == []


def _val001(tmp_path: Path, *overrides: str) -> bool:
    out = tmp_path / f"f{len(overrides)}.json"
    args = [a for o in overrides for a in ("--threshold", o)]
    p = diagnose("analyze", str(CLIENT_BOUND), "-o", str(tmp_path / "r.html"), "--json", str(out), *args)
    fired = any(f["rule_id"] == "VAL001" for f in json.loads(out.read_text())["findings"])
    assert p.returncode == (5 if fired else 0), p.stderr  # 5: an invalid run (diagnose analyze --help)
    return fired


def test_client_bound_gates_follow_threshold_overrides(tmp_path: Path) -> None:
    # the shipped client-bound run: loop lag P99 ~270 ms, send lag P99 ~100 ms. The lag gate used to be a
    # constant in normalize/client.py (10 ms, out of reach of --threshold); now both gates are thresholds.
    assert _val001(tmp_path)
    assert not _val001(tmp_path, "client_loop_lag_max_ms=1000", "client_schedule_lag_max_ms=1000")
