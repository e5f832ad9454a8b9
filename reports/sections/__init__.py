"""Report sections, built from the analysis's tables at the view stage: one module per source.

``build_sections(tables)`` is the one entry point (reports/view_model.py calls it). Each module's
``sections(tables)`` returns typed records (model.py); the normalisers under diagnose/normalize/ and
diagnose/trace/ only make the tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pandas as pd

from . import client, gpu, host, otel, prometheus, trace
from .model import Section, TextBlock

Builder = Callable[[Mapping[str, pd.DataFrame]], list[Section]]
BUILDERS: tuple[tuple[str, Builder], ...] = (
    ("client", client.sections), ("prometheus", prometheus.sections), ("otel", otel.sections),
    ("host", host.sections), ("gpu", gpu.sections), ("trace", trace.sections),
)


def build_sections(tables: Mapping[str, pd.DataFrame]) -> list[Section]:
    """Every source's sections, in report order. A source whose tables cannot be read gives one
    "not available" text saying why, never an exception."""
    out: list[Section] = []
    for name, build in BUILDERS:
        try:
            out.extend(build(tables))
        except (KeyError, ValueError, TypeError, AttributeError, IndexError) as e:
            out.append(Section(f"{name}_unavailable", f"{name} sections", TextBlock(
                f"not available: the {name} tables are malformed ({type(e).__name__}: {str(e)[:200]})"),
                group="details", order=999))
    return sorted(out, key=lambda s: (s.order, s.id))


__all__ = ["Section", "build_sections"]
