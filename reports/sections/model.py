"""The report's section records: frozen dataclasses holding typed values (numbers with units), checked when
they are made. Nothing here formats a number; reports/formatting.py does that when the report is rendered.

A table cell is a plain label (str), an identifier (int), a :class:`Quantity` (a number with its unit and how
to show it) or a :class:`Phrase` (text with quantities inside, e.g. "queue 41.0%, prefill 12.5%"). Notes,
texts and chart labels may be phrases too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

SectionKind = Literal["table", "stacked_bars", "flamegraph", "waterfall", "line_chart", "histogram", "text"]
Group = str  # where a section goes: "latency", "server", "host", "gpu", "trace", "details"

# How a quantity is shown (reports/formatting.py):
#   sig      three significant digits (thousands grouped from 1,000), after rounding to ``digits`` decimals;
#            an int value is shown as it is
#   fixed    ``digits`` decimals ("%.{digits}f")
#   signed   like fixed, with its sign ("+1.5")
#   percent  a ratio as a percentage with ``digits`` decimals ("41.0%")
#   grouped  an integer with thousands separators ("1,234,567")
#   general  Python's "%g" (up to six significant digits, no trailing zeros: "99.9")
#   bound    a histogram bucket bound: "+Inf", or the value in ``unit`` ("%g") followed by the unit
Style = Literal["sig", "fixed", "signed", "percent", "grouped", "general", "bound"]
STYLES: tuple[str, ...] = ("sig", "fixed", "signed", "percent", "grouped", "general", "bound")


@dataclass(frozen=True)
class Quantity:
    """A number with its unit. ``value`` None (or NaN) is missing and shown as a dash, never as zero."""

    value: float | int | None
    unit: str = ""
    digits: int | None = None
    style: Style = "sig"

    def __post_init__(self) -> None:
        if self.value is not None and (isinstance(self.value, bool) or not isinstance(self.value, (int, float))):
            raise TypeError(f"Quantity value must be a number or None, not {type(self.value).__name__}")
        if self.style not in STYLES:
            raise ValueError(f"Quantity style {self.style!r} is not one of {', '.join(STYLES)}")
        if self.digits is not None and not (isinstance(self.digits, int) and 0 <= self.digits <= 12):
            raise ValueError(f"Quantity digits must be an int in 0..12, not {self.digits!r}")
        if self.style in ("fixed", "signed", "percent") and self.digits is None:
            raise ValueError(f"Quantity style {self.style!r} needs digits")

    @property
    def missing(self) -> bool:
        return self.value is None or (isinstance(self.value, float) and math.isnan(self.value))


@dataclass(frozen=True)
class Phrase:
    """Text with quantities inside it, joined without separators when shown."""

    parts: tuple[str | Quantity, ...]

    def __post_init__(self) -> None:
        for p in self.parts:
            if not isinstance(p, (str, Quantity)):
                raise TypeError(f"Phrase part must be str or Quantity, not {type(p).__name__}")


Text = str | Phrase
Cell = str | int | Quantity | Phrase | None


def _check_text(v: Any, what: str) -> None:
    if not isinstance(v, (str, Phrase)):
        raise TypeError(f"{what} must be str or Phrase, not {type(v).__name__}")


def _check_number(v: Any, what: str) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{what} must be a number, not {type(v).__name__}")


@dataclass(frozen=True)
class Table:
    kind: ClassVar[SectionKind] = "table"
    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    note: Text = ""

    def __post_init__(self) -> None:
        for i, r in enumerate(self.rows):
            if len(r) != len(self.columns):
                raise ValueError(f"table row {i} has {len(r)} cells for {len(self.columns)} columns")
            for c in r:
                if c is not None and (isinstance(c, (bool, float)) or not isinstance(c, (str, int, Quantity, Phrase))):
                    raise TypeError(f"table row {i}: cell {c!r} is not str, int, Quantity, Phrase or None "
                                    "(a float needs its unit: Quantity)")
        _check_text(self.note, "table note")


@dataclass(frozen=True)
class BarSeries:
    name: str
    values: tuple[float, ...]


@dataclass(frozen=True)
class StackedBars:
    kind: ClassVar[SectionKind] = "stacked_bars"
    categories: tuple[Text, ...]
    series: tuple[BarSeries, ...]
    unit: str
    x_label: str = ""
    y_label: str = ""

    def __post_init__(self) -> None:
        for c in self.categories:
            _check_text(c, "bar category")
        for s in self.series:
            if len(s.values) != len(self.categories):
                raise ValueError(f"bar series {s.name!r} has {len(s.values)} values for {len(self.categories)} "
                                 "categories")
            for v in s.values:
                _check_number(v, f"bar series {s.name!r} value")


@dataclass(frozen=True)
class FlameGraph:
    kind: ClassVar[SectionKind] = "flamegraph"
    root: Mapping[str, Any]  # {"name": str, "value": float, "children": [...]}
    unit: str = "samples"

    def __post_init__(self) -> None:
        if not isinstance(self.root, Mapping) or "name" not in self.root or "value" not in self.root:
            raise ValueError("flame graph root needs a name and a value")


@dataclass(frozen=True)
class Segment:
    name: str
    start: float
    end: float


@dataclass(frozen=True)
class WaterfallRow:
    label: Text
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class Waterfall:
    kind: ClassVar[SectionKind] = "waterfall"
    rows: tuple[WaterfallRow, ...]
    unit: str = "ms"

    def __post_init__(self) -> None:
        for r in self.rows:
            _check_text(r.label, "waterfall label")
            for s in r.segments:
                _check_number(s.start, f"segment {s.name!r} start")
                _check_number(s.end, f"segment {s.name!r} end")


@dataclass(frozen=True)
class LineSeries:
    name: str
    points: tuple[tuple[float, float], ...]
    axis: Literal["left", "right"] = "left"


@dataclass(frozen=True)
class LineChart:
    kind: ClassVar[SectionKind] = "line_chart"
    series: tuple[LineSeries, ...]
    x_label: str = ""
    y_label: str = ""
    y2_label: str = ""

    def __post_init__(self) -> None:
        for s in self.series:
            if s.axis not in ("left", "right"):
                raise ValueError(f"line series {s.name!r}: axis must be left or right, not {s.axis!r}")
            if not isinstance(s.points, tuple) or any(not isinstance(p, tuple) or len(p) != 2 for p in s.points):
                raise TypeError(f"line series {s.name!r}: points must be (x, y) pairs")


@dataclass(frozen=True)
class Histogram:
    kind: ClassVar[SectionKind] = "histogram"
    values: tuple[float, ...]
    unit: str
    x_label: str = ""
    bins: int = 40

    def __post_init__(self) -> None:
        if not isinstance(self.bins, int) or self.bins < 1:
            raise ValueError(f"histogram bins must be a positive int, not {self.bins!r}")


@dataclass(frozen=True)
class TextBlock:
    kind: ClassVar[SectionKind] = "text"
    text: Text

    def __post_init__(self) -> None:
        _check_text(self.text, "text")


Payload = Table | StackedBars | FlameGraph | Waterfall | LineChart | Histogram | TextBlock
PAYLOADS: tuple[type, ...] = (Table, StackedBars, FlameGraph, Waterfall, LineChart, Histogram, TextBlock)


@dataclass(frozen=True)
class Section:
    """One report section: where it goes (``group``, ``order``) and what it shows (``payload``)."""

    id: str
    title: str
    payload: Payload
    group: Group = "details"
    order: int = 100

    @property
    def kind(self) -> str:
        return str(getattr(self.payload, "kind", type(self.payload).__name__))
