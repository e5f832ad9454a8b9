"""Normalisers: one module per evidence source, each turning bundle streams into tables, signals and
report sections (see docs/ARCHITECTURE.md). The pipeline runs them in this order; ``derived`` runs last
over the signals of all the others."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from diagnose.model import Window

NORMALIZERS: tuple[str, ...] = ("client", "prometheus", "slots", "otel", "attribution", "tasks", "host", "gpu", "trace", "fleet")


def load_normalizers() -> list[ModuleType]:
    return [importlib.import_module(f"diagnose.normalize.{name}") for name in NORMALIZERS]


def sampled_in(df: pd.DataFrame, w: Window) -> pd.DataFrame:
    """The rows of a table of point samples (column ``t_s``) taken inside window ``w``, ends included."""
    return df if df.empty else df[(df["t_s"] >= w.start_s) & (df["t_s"] <= w.end_s)]
