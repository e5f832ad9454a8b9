"""Normalisers: one module per evidence source, each turning bundle streams into tables, signals and
report sections (see docs/ARCHITECTURE.md). The pipeline runs them in this order; ``derived`` runs last
over the signals of all the others."""

from __future__ import annotations

import importlib
from types import ModuleType

NORMALIZERS: tuple[str, ...] = ("client", "prometheus", "slots", "otel", "host", "gpu", "trace", "fleet")


def load_normalizers() -> list[ModuleType]:
    return [importlib.import_module(f"diagnose.normalize.{name}") for name in NORMALIZERS]
