"""Structured rule conditions over named signals (never eval()).

A condition is a mapping:
  {"all": [cond, ...]} | {"any": [cond, ...]} | {"not": cond} | {"first_known": [cond, ...]}
  {"present": "signal_name"} | {"absent": "signal_name"}
  {"signal": NAME, "op": ">"|">="|"<"|"<="|"=="|"!=", "value": RHS, "hold": FRACTION}
RHS is a number, "$threshold_name", or {"signal": NAME, "times": NUMBER | "$threshold"}.
``hold`` (0-1) requires the comparison to be true in at least that fraction of the signal's series points
(so one spike does not fire a rule); without a series the run-level value is used.

Evaluation is three-valued: a comparison whose signal (or RHS signal) is missing is *unknown* (None).
``all`` is False if any part is False, else unknown if any part is unknown, else True.
``any`` is True if any part is True, else unknown if every part is unknown, else False (the parts that
could be judged decide). ``first_known`` takes the first part that can be judged: this is how a rule
says "against the SLO when one is given, otherwise against the run's own baseline".
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from diagnose.model import Signal

OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}

COMBINATORS = ("all", "any", "not", "first_known", "present", "absent")


class ConditionError(ValueError):
    """A malformed condition (caught by `diagnose rules lint` and when loading rules)."""


def resolve_threshold(ref: Any, thresholds: Mapping[str, float]) -> float:
    if isinstance(ref, bool):
        raise ConditionError(f"boolean is not a number: {ref!r}")
    if isinstance(ref, (int, float)):
        return float(ref)
    if isinstance(ref, str) and ref.startswith("$"):
        name = ref[1:]
        if name not in thresholds:
            raise ConditionError(f"unknown threshold {ref!r}")
        return float(thresholds[name])
    raise ConditionError(f"expected a number or $threshold, got {ref!r}")


class Evaluator:
    def __init__(self, signals: Mapping[str, Signal], thresholds: Mapping[str, float]) -> None:
        self.signals = signals
        self.thresholds = thresholds
        self.missing: set[str] = set()

    def _value(self, name: str) -> float | None:
        sig = self.signals.get(name)
        if sig is None or not sig.is_finite():
            self.missing.add(name)
            return None
        return float(sig.value)

    def _rhs(self, rhs: Any) -> float | None:
        if isinstance(rhs, Mapping):
            if "signal" not in rhs:
                raise ConditionError(f"right-hand side mapping needs 'signal': {dict(rhs)!r}")
            base = self._value(str(rhs["signal"]))
            if base is None:
                return None
            times = resolve_threshold(rhs.get("times", 1.0), self.thresholds)
            plus = resolve_threshold(rhs.get("plus", 0.0), self.thresholds)
            return base * times + plus
        return resolve_threshold(rhs, self.thresholds)

    def evaluate(self, cond: Any) -> bool | None:
        if not isinstance(cond, Mapping) or not cond:
            raise ConditionError(f"a condition must be a non-empty mapping, got {cond!r}")
        if "all" in cond:
            parts = [self.evaluate(c) for c in _as_list(cond["all"], "all")]
            if any(p is False for p in parts):
                return False
            return None if any(p is None for p in parts) else True
        if "any" in cond:
            parts = [self.evaluate(c) for c in _as_list(cond["any"], "any")]
            if any(p is True for p in parts):
                return True
            return None if all(p is None for p in parts) else False
        if "first_known" in cond:
            for c in _as_list(cond["first_known"], "first_known"):
                r = self.evaluate(c)
                if r is not None:
                    return r
            return None
        if "not" in cond:
            r = self.evaluate(cond["not"])
            return None if r is None else not r
        if "present" in cond:
            return str(cond["present"]) in self.signals
        if "absent" in cond:
            return str(cond["absent"]) not in self.signals
        if "signal" in cond:
            return self._compare(cond)
        raise ConditionError(
            f"unknown condition keys {sorted(cond)}; expected one of all/any/first_known/not/present/absent/signal"
        )

    def _compare(self, cond: Mapping[str, Any]) -> bool | None:
        name = str(cond["signal"])
        op_name = str(cond.get("op", ">"))
        op = OPS.get(op_name)
        if op is None:
            raise ConditionError(f"unknown operator {op_name!r} for signal {name}")
        if "value" not in cond:
            raise ConditionError(f"comparison on {name} has no 'value'")
        lhs = self._value(name)
        rhs = self._rhs(cond["value"])
        if lhs is None or rhs is None:
            return None
        hold = cond.get("hold")
        sig = self.signals[name]
        if hold is not None and sig.series:
            frac = resolve_threshold(hold, self.thresholds)
            pts = [v for _, v in sig.series if isinstance(v, (int, float)) and math.isfinite(v)]
            if not pts:
                return op(lhs, rhs)
            ok = sum(1 for v in pts if op(float(v), rhs))
            return ok / len(pts) >= frac
        return op(lhs, rhs)


def _as_list(v: Any, key: str) -> list[Any]:
    if not isinstance(v, list) or not v:
        raise ConditionError(f"'{key}' needs a non-empty list of conditions")
    return v


def referenced_signals(cond: Any) -> set[str]:
    """Every signal name a condition mentions (for lint and for 'requires')."""
    out: set[str] = set()
    if isinstance(cond, Mapping):
        for k, v in cond.items():
            if k in ("signal", "present", "absent") and isinstance(v, str):
                out.add(v)
            elif k == "value" and isinstance(v, Mapping) and isinstance(v.get("signal"), str):
                out.add(v["signal"])
            elif k in ("all", "any", "first_known") and isinstance(v, list):
                for c in v:
                    out |= referenced_signals(c)
            elif k == "not":
                out |= referenced_signals(v)
    return out


def referenced_thresholds(obj: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(obj, str) and obj.startswith("$"):
        out.add(obj[1:])
    elif isinstance(obj, Mapping):
        for v in obj.values():
            out |= referenced_thresholds(v)
    elif isinstance(obj, list):
        for v in obj:
            out |= referenced_thresholds(v)
    return out
