"""`diagnose rules lint`: schema, unknown signal and threshold names, duplicate ids, missing test cases."""

from __future__ import annotations

from pathlib import Path

from diagnose.rules.cases import case_file_for, load_cases
from diagnose.rules.conditions import ConditionError, Evaluator, referenced_thresholds
from diagnose.rules.spec import CATALOG_DIR, load_raw, load_thresholds, parse_spec, rule_files, spec_problems
from diagnose.signal_catalog import is_known


def lint(extra_dirs: list[Path], cases_dirs: list[Path]) -> list[str]:
    problems: list[str] = []
    thresholds = load_thresholds()
    seen: dict[str, str] = {}
    for f in rule_files([CATALOG_DIR, *extra_dirs]):
        try:
            raw = load_raw(f)
        except Exception as e:  # noqa: BLE001 - lint reports every problem and goes on
            problems.append(str(e))
            continue
        probs = spec_problems(raw, str(f))
        problems.extend(probs)
        if probs:
            continue
        spec = parse_spec(raw, str(f))
        if spec.id in seen:
            problems.append(f"{f}: duplicate rule id {spec.id} (also in {seen[spec.id]})")
        seen[spec.id] = str(f)
        for name in sorted(spec.all_signals):
            if not is_known(name):
                problems.append(f"{f}: unknown signal {name!r} (not in diagnose/signal_catalog.py)")
        for name in sorted(referenced_thresholds(spec.raw)):
            if name not in thresholds:
                problems.append(f"{f}: unknown threshold ${name} (not in rules/thresholds.yaml)")
        try:
            Evaluator({}, thresholds).evaluate(spec.when)
        except ConditionError as e:
            problems.append(f"{f}: bad condition: {e}")
        cf = case_file_for(spec, cases_dirs)
        if cf is None:
            problems.append(f"{f}: no test cases (expected {spec.id}.yaml in {', '.join(map(str, cases_dirs))})")
            continue
        try:
            cases = load_cases(cf)
        except (ValueError, OSError) as e:
            problems.append(str(e))
            continue
        kinds = {c.expect for c in cases}
        if "fires" not in kinds or "quiet" not in kinds:
            problems.append(f"{cf}: needs at least one 'fires' and one 'quiet' case")
    return problems
