"""Every rule's fires/quiet cases, auto-parametrized, plus the meta-test that enforces the pairing."""

from __future__ import annotations

from pathlib import Path

import pytest
from diagnose.rules.cases import case_file_for, load_cases, run_case_causes
from diagnose.rules.lint import lint
from diagnose.rules.spec import load_rules

CASES_DIR = Path(__file__).parent / "cases"
SPECS = {s.id: s for s in load_rules()}


def _all_cases() -> list[tuple[str, object]]:
    out = []
    for spec in SPECS.values():
        cf = case_file_for(spec, [CASES_DIR])
        if cf is None:
            continue
        for case in load_cases(cf):
            out.append((f"{spec.id}: {case.name}", case))
    return out


@pytest.mark.parametrize(("label", "case"), _all_cases(), ids=[c[0] for c in _all_cases()])
def test_rule_case(label: str, case: object) -> None:
    from diagnose.rules.cases import Case

    assert isinstance(case, Case)
    outcome, causes = run_case_causes(SPECS[case.rule], case)
    assert outcome == case.expect, f"{label}: expected {case.expect}, got {outcome}"
    assert causes == case.causes, f"{label}: cause statuses {causes}, expected {case.causes}"


def test_every_rule_has_fires_and_quiet_cases() -> None:
    missing = []
    for spec in SPECS.values():
        cf = case_file_for(spec, [CASES_DIR])
        kinds = {c.expect for c in load_cases(cf)} if cf else set()
        if not {"fires", "quiet"} <= kinds:
            missing.append(spec.id)
    assert not missing, f"rules without a fires and a quiet case: {missing}"


def test_catalog_lints_clean() -> None:
    assert lint([], [CASES_DIR]) == []


def test_case_files_name_existing_rules() -> None:
    orphans = [p.stem for p in CASES_DIR.glob("*.yaml") if p.stem not in SPECS]
    assert not orphans, f"case files without a rule: {orphans}"
