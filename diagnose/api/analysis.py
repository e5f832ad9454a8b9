"""``analyze``, ``report`` and ``document``: what ``diagnose analyze`` computes and writes, as calls (docs/api.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose.errors import InputError

if TYPE_CHECKING:
    from diagnose.analysis import Analysis


def analyze(path: str | os.PathLike[str], *, rules: Sequence[str | os.PathLike[str]] = (),
            threshold_files: Sequence[str | os.PathLike[str]] = (), thresholds: Mapping[str, float] | None = None,
            include_python: bool = False, cost_per_hour: str | float | None = None) -> Analysis:
    """Analyse a bundle, a profiler trace (file or directory of ranks) or an OTLP JSON span file, as
    ``diagnose analyze`` does, and return the typed, frozen :class:`diagnose.analysis.Analysis` (nothing written).

    ``rules``: directories of your own rules; ``threshold_files`` / ``thresholds``: overrides (name: value) as
    ``--thresholds`` / ``--threshold``; ``cost_per_hour``: a price (4.1, or "4.1x8") instead of the recorded one.
    Raises BundleError / InputError (one line naming the file) for an input it cannot read."""
    from diagnose.pipeline import analyze as run

    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"analyze(): path must be a file or directory path, got {type(path).__name__}")
    src = Path(path)
    if not src.exists():
        raise InputError(f"{src}: no such file or directory")
    price: float | None = None
    if cost_per_hour is not None:
        from diagnose.signals.cost import parse_price

        price = parse_price(str(cost_per_hour))
    overrides: dict[str, float] | None = None
    if thresholds is not None:
        overrides = {}
        for k, v in thresholds.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InputError(f"analyze(): threshold {k!r}: expected a number, got {type(v).__name__}")
            overrides[str(k)] = float(v)
    return run(src, rules_dirs=[Path(r) for r in rules], threshold_files=[Path(f) for f in threshold_files],
               threshold_overrides=overrides, include_python=include_python, cost_per_hour=price)


def report(analysis: Analysis, path: str | os.PathLike[str]) -> Path:
    """Write the self-contained HTML report of ``analysis`` to ``path`` (as ``diagnose analyze -o``); returns it.
    Raises ReportError (a DiagnoseError) when it cannot be written."""
    from diagnose.reports.render import write_report

    return write_report(analysis, path)


def document(analysis: Analysis) -> dict[str, Any]:
    """The ``diagnose analyze --json`` document of ``analysis`` (schema_version first; docs/json-schemas.md)."""
    from diagnose.reports.document import build_document

    return build_document(analysis)
