"""The report's view model as types: the chart specs (reports/sections_view.py, timeline.py, curve.py,
workload_charts.py; drawn by render.svg) and the records the page displays (view_model.build_view). Plain
JSON data at run time: TypedDicts only name the keys and their value types, so mypy checks builder and reader.

Values that hold a section cell, label or note (``formatting.view_value``: a str, a number, None or a
quantity/phrase as view data) are typed ``Any``: they are whatever the section gave.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, Required, TypedDict


class QuantityView(TypedDict):
    """A Quantity as view data (formatting.view_value): an infinite value as value None with "inf" +1/-1."""

    value: float | int | None
    unit: str
    digits: int | None
    style: str
    inf: NotRequired[int]


# -- chart specs ---------------------------------------------------------------------------------------
class Series(TypedDict, total=False):
    """A line chart's series: points [[x, y], ...] on the left or right axis."""

    name: Required[str]
    points: Required[list[list[float]]]
    axis: str  # "left" | "right"
    style: str  # "line" | "dots" | "step" | "marker"
    ordered: bool  # joined in the order given instead of sorted by x
    labels: list[str]  # with "ordered": one per point


class Band(TypedDict):
    """A shaded x range (a sweep's phase, a window left out)."""

    start: float
    end: float
    label: str


class Marker(TypedDict):
    """A vertical percentile marker on a histogram."""

    label: str
    x: float


class Binned(TypedDict):
    """Values binned (sections_view.bin_values): [[lo, hi, count], ...], the percentile markers, the count."""

    bins: list[list[float]]
    log_x: bool
    markers: list[Marker]
    n: int


class BarSeries(TypedDict):
    name: str
    values: list[float]


class Segment(TypedDict):
    name: str
    start: float
    end: float


class WaterfallRow(TypedDict):
    label: Any  # a section label (view data)
    segments: list[Segment]


class FlameNode(TypedDict, total=False):
    """A flame graph's node: its time (or samples) and its callees."""

    name: Required[str]
    value: Required[float]
    children: list[FlameNode]


class _Spec(TypedDict, total=False):
    """What every chart spec may carry: a title, a note, and a section's place on the page."""

    title: str
    note: Any  # a section note (view data) or a sentence
    id: str
    group: str
    order: int


class LineChartSpec(_Spec, total=False):
    kind: Required[Literal["line_chart"]]
    series: Required[list[Series]]
    bands: list[Band]
    x_label: str
    y_label: str
    y2_label: str


class HistogramSpec(_Spec, total=False):
    kind: Required[Literal["histogram"]]
    bins: Required[list[list[float]]]
    log_x: bool
    markers: list[Marker]
    n: int
    x_label: str
    y_label: str


class StackedBarsSpec(_Spec, total=False):
    kind: Required[Literal["stacked_bars"]]
    categories: Required[list[Any]]  # section labels (view data)
    series: Required[list[BarSeries]]
    unit: str
    x_label: str
    y_label: str


class WaterfallSpec(_Spec, total=False):
    kind: Required[Literal["waterfall"]]
    rows: Required[list[WaterfallRow]]
    unit: str
    y_label: str


class FlameSpec(_Spec, total=False):
    kind: Required[Literal["flamegraph"]]
    root: Required[FlameNode]
    unit: str


class TableSpec(_Spec, total=False):
    kind: Required[Literal["table"]]
    columns: Required[list[str]]
    rows: Required[list[list[Any]]]  # cells (view data)


class TextSpec(_Spec, total=False):
    kind: Required[Literal["text"]]
    text: Required[Any]  # a phrase (view data) or the text cut to its bound


class UnavailableSpec(_Spec, total=False):
    kind: Required[Literal["unavailable"]]
    reason: Required[str]


ChartSpec = (LineChartSpec | HistogramSpec | StackedBarsSpec | WaterfallSpec | FlameSpec | TableSpec | TextSpec
             | UnavailableSpec)


# -- the view's records --------------------------------------------------------------------------------
class Tile(TypedDict):
    """A headline number: a signal's value with its label, unit and the window it is of."""

    signal: str
    label: str
    value: float | None
    unit: str
    window: str


class LevelTiles(TypedDict):
    label: str
    key_numbers: list[Tile]


class AttributionPart(TypedDict):
    signal: str
    label: str
    value: float | None
    unit: str


class AttributionRow(TypedDict):
    label: str
    parts: list[AttributionPart]
    primary: bool


class VerdictView(TypedDict, total=False):
    level: Required[str]
    headline: Required[str]
    detail: Required[str]
    key_numbers: Required[list[Tile]]
    by_level: Required[list[LevelTiles]]
    partial: Required[bool]
    note: Required[str]
    top_rule: Required[str | None]
    detail_shown: Required[str]
    symptom_shown: Required[str]
    attribution: list[AttributionRow]
    attribution_level: str | None
    symptom: str
    judged: bool
    cause: str
    cause_status: str
    cause_evidence: str
    refute: str
    experiment: str
    share: float | None
    share_of: str
    explains: list[str]


class MetricRow(TypedDict):
    metric: str
    key: str
    description: str
    unit: str
    values: dict[str, float | None]


class Throughput(TypedDict):
    signal: str
    label: str
    value: float | None
    unit: str


class WindowTable(TypedDict):
    rows: list[MetricRow]
    throughput: list[Throughput]
    note: str


class LabelledWindow(WindowTable):
    label: str


class SloLimit(TypedDict):
    signal: str
    value: float | None
    unit: str


class SweepColumn(TypedDict):
    group: str
    label: str
    unit: str


class SweepGroup(TypedDict):
    label: str
    span: int


class SweepCell(TypedDict):
    value: float | None
    unit: str
    signal: str


class SweepRow(TypedDict):
    label: str
    cells: list[SweepCell]


class SweepTable(TypedDict):
    groups: list[SweepGroup]
    columns: list[SweepColumn]
    rows: list[SweepRow]


class Percentiles(TypedDict):
    columns: list[str]
    windows: list[LabelledWindow]
    slos: list[SloLimit]
    sweep: SweepTable | None
    pooled: bool
    levels: int


class ErrorRow(TypedDict):
    category: str
    count: int
    warmup: int
    example: Any  # the detail, redacted


class Errors(TypedDict):
    total: int
    requests: NotRequired[int]
    rows: list[ErrorRow]


class ProbeCost(TypedDict):
    line: Any  # redacted
    over_budget: bool
    adapted: list[Any]


class ProbeView(TypedDict):
    name: str
    state: str
    reason: Any  # redacted
    detail: list[list[str]]


class EnvGroup(TypedDict):
    group: str
    rows: list[list[str]]


class Charts(TypedDict, total=False):
    ttft: ChartSpec | None
    itl: ChartSpec | None
    ttft_by_phase: ChartSpec | None
    itl_by_phase: ChartSpec | None
    curve: ChartSpec | None
    timeline: ChartSpec | None
    input_lengths: ChartSpec | None
    output_lengths: ChartSpec | None
    arrivals: ChartSpec | None


class SectionGroup(TypedDict):
    group: str
    title: str
    sections: list[ChartSpec]


class PageKind(TypedDict):
    kind: str
    omitted: list[str]


class ExpectView(TypedDict):
    signal: str
    direction: str
    arrow: str


class ExperimentView(TypedDict):
    change: str
    expect: list[ExpectView]


class CauseView(TypedDict):
    cause: str
    confirm: str
    refute: str
    status: str
    status_evidence: str
    experiment: ExperimentView | None


class EvidenceView(TypedDict):
    signal: str
    value: float | None
    unit: str
    source: str
    note: str
    window: str


class FindingView(TypedDict):
    rule_id: str
    name: str
    family: str
    severity: str
    severity_weight: float
    title: str
    hypothesis: str
    confidence: float | None
    impact: float | None
    score: float | None
    fit: float | None
    evidence: list[EvidenceView]
    causes: list[CauseView]
    sources: list[str]
    runbook: str
    kind: str
    explained_by: str
    held_back: str
    share: float | None
    in_verdict: NotRequired[bool]  # a card's: whether it is the verdict's own finding
    also_seen: NotRequired[list[FindingView]]  # a card's: the findings folded into it
    why: NotRequired[str]  # a folded finding's: why it is inside its card


class NotJudged(TypedDict):
    rule_id: str
    title: str
    severity: str


class NotEvaluated(TypedDict):
    rule_id: str
    name: str
    missing: list[str]


class View(TypedDict):
    """The whole report (view_model.build_view)."""

    schema: int
    title: str
    engine_settings: str
    source: str
    captured_at: str
    tool_version: str
    banners: list[dict[str, str]]
    run_label: str
    page: PageKind
    verdict: VerdictView
    findings: list[FindingView]
    not_judged: list[NotJudged]
    not_evaluated: list[NotEvaluated]
    percentiles: Percentiles | None
    errors: Errors
    charts: Charts
    section_groups: list[SectionGroup]
    show_probes: bool
    probes: list[ProbeView]
    probe_cost: ProbeCost | None
    environment: list[EnvGroup]
    workload_card: list[dict[str, str]]
