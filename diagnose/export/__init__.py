"""Exports of a bundle for other tools (docs/exports.md), behind one registry: each format is its module under
diagnose/export/ with a ``run(bundle, out, *, include_text) -> Written`` function, and one :data:`EXPORTERS`
entry; ``diagnose export --format NAME`` finds it here (adding a format touches no CLI code). The modules are
imported only when their format is asked for (pyarrow is an extra: docs/exports.md)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diagnose.io.bundle import Bundle


@dataclass(frozen=True)
class Written:
    """What an export wrote: one line the CLI prints after the output's path, and what it skipped."""

    summary: str
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Exporter:
    name: str
    description: str
    suffix: str  # of the default output name
    module: str  # diagnose.export.<module>, whose run() writes it

    def run(self, bundle: Bundle, out: Path, *, include_text: bool = False) -> Written:
        written: Written = importlib.import_module(f"diagnose.export.{self.module}").run(
            bundle, out, include_text=include_text)
        return written


EXPORTERS: dict[str, Exporter] = {e.name: e for e in (
    Exporter("perfetto", "one Chrome-trace JSON timeline (Perfetto UI, chrome://tracing)", ".perfetto.json",
             "perfetto"),
    Exporter("speedscope", "the py-spy host stacks as a speedscope file (one sampled profile per thread)",
             ".speedscope.json", "speedscope"),
    Exporter("parquet", "every table of the analysis as Parquet files in a directory, with schema.json", ".parquet",
             "parquet"),
)}
FORMATS: dict[str, str] = {n: e.description for n, e in EXPORTERS.items()}
SUFFIX: dict[str, str] = {n: e.suffix for n, e in EXPORTERS.items()}
