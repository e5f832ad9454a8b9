"""`diagnose rules lint`: schema, undeclared signal and threshold names, duplicate ids, missing test cases.

A signal name must be an exact entry of diagnose/signals/catalog.py: in a condition, ``requires``,
``evidence``, ``impact``, an experiment's ``expect``, a ``{name}`` field of a text template (title,
hypothesis, causes), and a test case's signals.
"""

from __future__ import annotations

import difflib
import string
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from diagnose.rules.cases import case_file_for, load_cases
from diagnose.rules.conditions import ConditionError, Evaluator, referenced_thresholds
from diagnose.rules.spec import (
    CATALOG_DIR,
    RuleSpec,
    load_raw,
    load_thresholds,
    parse_spec,
    rule_files,
    spec_problems,
)
from diagnose.signals.catalog import CATALOG, is_known

# template fields that are not signals (rules/engine.py render_text)
TEMPLATE_NAMES = ("thr", "phase", "label")


def unknown_signal(name: str, where: str) -> str:
    """The lint message for an undeclared name, with the closest declared names when there are any."""
    close = difflib.get_close_matches(name, CATALOG, n=3, cutoff=0.75)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"{where}: unknown signal {name!r} (not declared in diagnose/signals/catalog.py){hint}"


def template_fields(texts: Iterable[str]) -> set[str]:
    """The top-level names of the ``{field}`` references in str.format templates."""
    out: set[str] = set()
    for text in texts:
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError:
            continue  # a malformed template renders as is; spec_problems does not judge prose
        for _lit, field, _spec, _conv in parsed:
            if field:
                out.add(field.split(".", 1)[0].split("[", 1)[0])
    return out


def label_fields(texts: Iterable[str]) -> set[str]:
    """The signal names of the ``{label.<signal>}`` references (a signal's description, render_text)."""
    out: set[str] = set()
    for text in texts:
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError:
            continue
        out.update(field.split(".", 1)[1] for _l, field, _s, _c in parsed if field and field.startswith("label."))
    return out


def _texts(spec: RuleSpec) -> list[str]:
    out = [spec.title, spec.hypothesis]
    for c in spec.causes:
        exp: Any = c.get("experiment") or {}
        out += [str(c.get(k, "")) for k in ("cause", "confirm", "refute")]
        out.append(str(exp.get("change", "")) if isinstance(exp, dict) else "")
    return out


TUNABLE_KEYS = ("value", "over", "times", "hold")  # where a rule's number is a threshold


def literal_numbers(obj: Any, path: str = "") -> list[tuple[str, float]]:
    """(where, number) of each number written into a condition, an impact or a cause's condition instead of a
    $threshold; 0 and 1 are not thresholds (a flag, a count that must be non-zero, a whole signal)."""
    out: list[tuple[str, float]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            at = f"{path}.{k}" if path else str(k)
            if k in TUNABLE_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool) and v not in (0, 1):
                out.append((at, float(v)))
            out += literal_numbers(v, at)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += literal_numbers(v, f"{path}[{i}]")
    return out


def _catalogue_literals(raw: dict[str, Any], f: Path) -> list[str]:
    """The shipped catalogue keeps every number in rules/thresholds.yaml (a user's own rules may not)."""
    where: dict[str, Any] = {k: raw.get(k) for k in ("when", "impact", "minor_when")}
    for i, c in enumerate(raw.get("causes") or []):
        if isinstance(c, dict):
            where[f"causes[{i}]"] = {k: c.get(k) for k in ("supported_when", "refuted_when")}
    return [f"{f}: {at}: the number {v:g} belongs in rules/thresholds.yaml (refer to it as $name)"
            for at, v in literal_numbers(where)]


def lint(extra_dirs: list[Path], cases_dirs: list[Path]) -> list[str]:
    problems: list[str] = []
    thresholds = load_thresholds()
    seen: dict[str, str] = {}
    links: dict[str, dict[str, tuple[str, ...]]] = {}  # rule id -> the rule ids it names, checked at the end
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
        links[spec.id] = {"suppressed_by": spec.suppressed_by, "explains": spec.explains}
        for name in sorted(spec.all_signals):
            if not is_known(name):
                problems.append(unknown_signal(name, str(f)))
        for name in sorted(template_fields(_texts(spec)) - set(TEMPLATE_NAMES)):
            if not is_known(name):
                problems.append(unknown_signal(name, f"{f}: text template"))
        for name in sorted(label_fields(_texts(spec))):
            if not is_known(name):
                problems.append(unknown_signal(name, f"{f}: text template {{label.{name}}}"))
        if f.resolve().is_relative_to(CATALOG_DIR.resolve()):
            problems.extend(_catalogue_literals(raw, f))
        for name in sorted(referenced_thresholds(spec.raw)):
            if name not in thresholds:
                problems.append(f"{f}: unknown threshold ${name} (not in rules/thresholds.yaml)")
        try:
            Evaluator({}, thresholds).evaluate(spec.when)
            if spec.minor_when:
                Evaluator({}, thresholds).evaluate(spec.minor_when)
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
        for c in cases:
            names = set(c.signals) | set(c.series) | {n for ps in c.phase_signals for n in ps}
            for name in sorted(names):
                if not is_known(name):
                    problems.append(unknown_signal(name, f"{cf}: case {c.name!r}"))
            for name in sorted(c.thresholds):
                if name not in thresholds:
                    problems.append(f"{cf}: case {c.name!r}: unknown threshold {name!r} (not in rules/thresholds.yaml)")
    for rid, named in links.items():
        for key, ids in named.items():
            for other in ids:
                if other not in seen:
                    problems.append(f"{seen[rid]}: {key} names {other}, which is no rule")
                elif other == rid:
                    problems.append(f"{seen[rid]}: {key} names the rule itself")
    return problems
