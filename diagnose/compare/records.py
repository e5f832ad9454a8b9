"""The comparison's JSON-shaped records (``Comparison.to_json`` writes them as they are; the CLI's text and the
compare page read them by key): TypedDicts, so mypy checks the keys their builders write and their readers read.
Plain dicts at run time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict


class Spread(TypedDict):
    """A repeated level's run-to-run spread of one metric (``samples.spread``)."""

    values: list[float | None]  # each run's value (None: not finite)
    spread: float | None  # (max - min) / median of the finite ones


class Changed(TypedDict):
    """A recorded variable that differs between the runs: its value in each (a setting, a dict for the SLO)."""

    what: str
    a: object
    b: object


class Comparability(TypedDict):
    comparable: bool
    problems: list[str]
    changed: list[Changed]
    attribution: str
    levels_only_in_a: list[str]
    levels_only_in_b: list[str]
    host_drift: NotRequired[list[str]]  # two traces: not compared


class FindingChange(TypedDict):
    """A rule that fired in either run: appeared, disappeared, severity changed, share changed, unchanged."""

    rule: str
    change: str
    title_a: str | None
    title_b: str | None
    severity_a: str | None
    severity_b: str | None
    share_a: float | None
    share_b: float | None


class GateRow(TypedDict):
    """One gate metric at one matched level (``level`` None: no level matched)."""

    level: str | None
    metric: str
    allowed: float
    rel: float | None
    verdict: str
    regressed: bool
    outcome: str  # "regressed" | "passed" | "undecided"
    why: str


class TraceRow(TypedDict):
    """Two traces: one figure A beside B."""

    what: str
    unit: str
    a: float | None
    b: float | None
    diff: float | None
    rel: float | None


class CdfPair(TypedDict):
    a: list[list[float]]
    b: list[list[float]]


class LevelPictures(TypedDict):
    level: str
    ttft: CdfPair
    itl: CdfPair


class Curves(TypedDict):
    """Per side, one row per level: its ``label`` and the values of ``pictures.CURVE_KEYS`` it has."""

    a: list[dict[str, str | float | None]]
    b: list[dict[str, str | float | None]]


class Pictures(TypedDict, total=False):
    """What the compare page draws (``pictures.pictures``); empty for two traces."""

    levels: list[LevelPictures]
    curves: Curves


# -- the quality guard (quality.py) -----------------------------------------------------------------------
class Agreement(TypedDict, total=False):
    sampling_a: Mapping[str, Any] | None  # the workload's sampling, as its manifest recorded it
    sampling_b: Mapping[str, Any] | None
    step_tokens: int
    pairs: int
    note: str
    hashed: str
    identical: int
    share: float | None
    share_lo: float | None
    share_hi: float | None
    diverged: int
    greedy: bool
    agreed_tokens_min: int | None
    agreed_tokens_p50: float | None
    diverged_first_step: int
    kind_mismatched: int


class RunScore(TypedDict, total=False):
    """One run's --quality-cmd: its score, or why there is none."""

    score: float
    error: str


class Scores(TypedDict):
    cmd: str
    a: float | None
    b: float | None
    error: NotRequired[str]
    rel: NotRequired[float]


class Quality(TypedDict):
    agreement: Agreement | None
    score: Scores | None
    min_agreement: float
    max_score_drop: float
    failed: list[str]
    unmeasured: list[str]


class MoveRecord(TypedDict):
    """An expected move of verify (``Move.to_json``): the signal's values, its relative change and interval."""

    signal: str
    expect: str
    a: float | None
    b: float | None
    rel: float | None
    rel_lo: float | None
    rel_hi: float | None
    outcome: str
