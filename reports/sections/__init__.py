"""Report sections, built from the analysis's tables at the view stage: one module per source.

``build_sections(tables)`` is the one entry point (reports/view_model.py calls it). Each module's
``sections(tables)`` returns typed records (model.py); the normalisers under diagnose/normalize/ and
diagnose/trace/ only make the tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pandas as pd

from diagnose.model import Signal, Window

from . import client, fleet, gpu, host, otel, prometheus, trace
from .model import Section, TextBlock

Tables = Mapping[str, pd.DataFrame]
Builder = Callable[[Tables, Mapping[str, Signal] | None, Window | None], list[Section]]
BUILDERS: tuple[tuple[str, Builder], ...] = (
    ("client", lambda t, s, w: client.sections(t, s)), ("prometheus", lambda t, s, w: prometheus.sections(t, w)),
    ("otel", lambda t, s, w: otel.sections(t)), ("host", lambda t, s, w: host.sections(t)),
    ("gpu", lambda t, s, w: gpu.sections(t)), ("trace", lambda t, s, w: trace.sections(t)),
    ("fleet", lambda t, s, w: fleet.sections(t)),
)


def build_sections(tables: Tables, signals: Mapping[str, Signal] | None = None,
                   run_window: Window | None = None) -> list[Section]:
    """Every source's sections, in report order, over the analysis's run window and signals when given. A
    source whose tables cannot be read gives one "not available" text saying why, never an exception."""
    out: list[Section] = []
    for name, build in BUILDERS:
        try:
            out.extend(build(tables, signals, run_window))
        except (KeyError, ValueError, TypeError, AttributeError, IndexError) as e:
            out.append(Section(f"{name}_unavailable", f"{name} sections", TextBlock(
                f"not available: the {name} tables are malformed ({type(e).__name__}: {str(e)[:200]})"),
                group="details", order=999))
    return sorted(out, key=lambda s: (s.order, s.id))


__all__ = ["Section", "build_sections"]
