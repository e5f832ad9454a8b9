"""Normalisers: one module per evidence source, each turning bundle streams into tables, signals and
report sections (see docs/ARCHITECTURE.md). The pipeline runs them in this order; ``derived`` runs last
over the signals of all the others."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from diagnose.model import Window

NORMALIZERS: tuple[str, ...] = ("client", "prometheus", "slots", "otel", "attribution", "tasks", "host", "gpu", "trace", "fleet")


@dataclass
class TableContext:
    """What the table stage is given and what it says, both explicit (no side channel through the bundle):
    ``thresholds``, the numbers the analysis judges by (rules/thresholds.yaml with the user's overrides), for the
    few judgements made while building tables (which requests a short client stall touched); ``notes``, what a
    normaliser has to say about its input (records skipped, a trace not analysed), which the pipeline adds to the
    analysis's warnings. Each normaliser's ``tables(bundle, ctx)`` reads the one and appends to the other."""

    thresholds: Mapping[str, float]
    notes: list[str] = field(default_factory=list)

    def note(self, message: str) -> None:
        """Adds ``message`` once (several normalisers may read the same stream)."""
        if message not in self.notes:
            self.notes.append(message)

    @classmethod
    def defaults(cls) -> TableContext:
        """The shipped thresholds and no note yet: for a normaliser called alone (tests, tools)."""
        from diagnose.rules.spec import load_thresholds

        return cls(thresholds=dict(load_thresholds()))


def load_normalizers() -> list[ModuleType]:
    return [importlib.import_module(f"diagnose.normalize.{name}") for name in NORMALIZERS]


def sampled_in(df: pd.DataFrame, w: Window) -> pd.DataFrame:
    """The rows of a table of point samples (column ``t_s``) taken inside window ``w``, ends included."""
    return df if df.empty else df[(df["t_s"] >= w.start_s) & (df["t_s"] <= w.end_s)]
