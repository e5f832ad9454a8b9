"""`diagnose export BUNDLE --format parquet -o DIR`: every table of the analysis as Parquet files.

The bundle goes through the whole analysis (diagnose/pipeline.py), and each table it builds is written as
``DIR/<table>.parquet`` (pyarrow, with pandas metadata so pandas reads back the same dtypes), plus the
judgement as tables of its own: ``signals`` (one row per signal of the run window and of each phase),
``signal_series`` (the points of the signals that carry a series), ``findings`` and ``not_evaluated``.
``DIR/schema.json`` lists every table with its row count and its columns' Arrow types. docs/exports.md
documents the tables and their columns (units in the column names: ``_s``, ``_ms``, ``_ratio``...).

A column pandas holds as Python objects of mixed types (a list in one row, a number in the next) is
written as text (JSON for lists and dicts) so that every table has one Arrow type per column.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import orjson
import pandas as pd

from diagnose import __version__
from diagnose.analysis import Analysis
from diagnose.errors import require
from diagnose.export import Written
from diagnose.export.files import SCHEMA_FILE, NothingExported, output_dir
from diagnose.io import schemas
from diagnose.io.bundle import Bundle
from diagnose.io.manifest import Capture
from diagnose.model import Signal

SIGNAL_COLUMNS = ["window", "phase", "name", "value", "unit", "source", "description", "series_points"]
SERIES_COLUMNS = ["window", "phase", "name", "t_s", "value"]
FINDING_COLUMNS = ["rank", "rule_id", "name", "family", "kind", "severity", "title", "hypothesis", "confidence",
                   "impact", "score", "share", "explained_by", "held_back", "sources", "runbook", "evidence_json",
                   "causes_json"]
NOT_EVALUATED_COLUMNS = ["rule_id", "name", "missing"]
# tables that hold rows even when no stream gave a record: the judgement, and the planned workload and SLO
NOT_DATA = frozenset({"signals", "signal_series", "findings", "not_evaluated", "client_workload", "client_slo"})


@dataclass
class ParquetExport:
    tables: dict[str, int] = field(default_factory=dict)  # name -> rows
    warnings: list[str] = field(default_factory=list)


def _json(v: Any) -> str:
    return orjson.dumps(v, default=str, option=orjson.OPT_SERIALIZE_NUMPY).decode()


class SignalRow(TypedDict):
    """A row of the ``signals`` table: a signal of the run window or of one phase."""

    window: str
    phase: int | None
    name: str
    value: float
    unit: str
    source: str
    description: str
    series_points: int


class SeriesRow(TypedDict):
    """A row of the ``signal_series`` table: one point of a signal's series."""

    window: str
    phase: int | None
    name: str
    t_s: float
    value: float


class ColumnEntry(TypedDict):
    name: str
    type: str


class TableEntry(TypedDict):
    file: str
    rows: int
    columns: list[ColumnEntry]


class ParquetSchema(TypedDict):
    """schema.json beside the tables."""

    schema_version: int
    exporter: str
    source: str
    clock: str
    clock_anchor: dict[str, int] | None
    tables: dict[str, TableEntry]


def judgement_tables(a: Analysis) -> dict[str, pd.DataFrame]:
    """Signals (run window and each phase), their series, findings and the rules not evaluated, as tables."""
    sig_rows: list[SignalRow] = []
    ser_rows: list[SeriesRow] = []

    def add(signals: dict[str, Signal], window: str, phase: int | None) -> None:
        for name, s in sorted(signals.items()):
            sig_rows.append({"window": window, "phase": phase, "name": name, "value": s.value, "unit": s.unit,
                             "source": s.source, "description": s.description, "series_points": len(s.series)})
            ser_rows.extend({"window": window, "phase": phase, "name": name, "t_s": float(t), "value": float(v)}
                            for t, v in s.series)

    add(a.signals, "run", None)
    for p, ps in zip(a.phases, a.phase_signals, strict=False):
        add(ps, p.name, p.phase)
    findings = [{"rank": i, "rule_id": f.rule_id, "name": f.name, "family": f.family, "kind": f.kind,
                 "severity": f.severity, "title": f.title, "hypothesis": f.hypothesis, "confidence": f.confidence,
                 "impact": f.impact, "score": f.score, "share": f.share, "explained_by": f.explained_by,
                 "held_back": f.held_back, "sources": ",".join(f.sources), "runbook": f.runbook,
                 "evidence_json": _json(f.to_json()["evidence"]), "causes_json": _json(f.to_json()["causes"])}
                for i, f in enumerate(a.findings)]
    ne = [{"rule_id": n.rule_id, "name": n.name, "missing": ",".join(n.missing)} for n in a.not_evaluated]
    phase_int = "Int64"
    return {
        "signals": pd.DataFrame(sig_rows, columns=SIGNAL_COLUMNS).astype({"phase": phase_int}),
        "signal_series": pd.DataFrame(ser_rows, columns=SERIES_COLUMNS).astype({"phase": phase_int}),
        "findings": pd.DataFrame(findings, columns=FINDING_COLUMNS),
        "not_evaluated": pd.DataFrame(ne, columns=NOT_EVALUATED_COLUMNS),
    }


def _anchor(cap: Capture) -> dict[str, int] | None:
    """The bundle's clock anchor as the manifest records it, None without one."""
    return {"unix_ns": cap.anchor.unix_ns, "monotonic_ns": cap.anchor.monotonic_ns} if cap.anchored else None


def _as_text(v: Any) -> str | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if v is pd.NA or v is pd.NaT:
        return None
    return v if isinstance(v, str) else _json(v)


def to_arrow(df: pd.DataFrame) -> Any:
    """A pyarrow Table of ``df`` (index dropped); object columns pyarrow cannot type become text."""
    import pyarrow as pa

    df = df.reset_index(drop=True)
    df.columns = [str(c) for c in df.columns]
    try:
        return pa.Table.from_pandas(df, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError):
        pass
    fixed = df.copy()
    for c in fixed.columns:
        if fixed[c].dtype == object:
            try:
                pa.array(fixed[c], from_pandas=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError):
                fixed[c] = fixed[c].map(_as_text).astype(object)
    return pa.Table.from_pandas(fixed, preserve_index=False)


def export(bundle: Bundle, out: Path) -> ParquetExport:
    require("pyarrow", "parquet", "export --format parquet")
    import pyarrow.parquet as pq

    from diagnose.pipeline import analyze_opened

    a = analyze_opened(bundle)
    tables = {**a.tables, **judgement_tables(a)}
    res = ParquetExport(warnings=list(a.warnings))
    schema: ParquetSchema = {"schema_version": schemas.PARQUET_SCHEMA, "exporter": f"diagnose {__version__}", "source": a.source,
                              "clock": "t_s and *_s columns: seconds since the bundle's clock anchor "
                                       "(manifest capture.clock_anchor)",
                              "clock_anchor": _anchor(bundle.meta.capture),
                              "tables": {}}
    if not any(len(t) for name, t in tables.items() if name not in NOT_DATA):
        raise NothingExported(f"{bundle.source}: nothing usable to export: every table of measured data is empty "
                              "(see the warnings)", res.warnings)
    with output_dir(out) as tmp:
        for name in sorted(tables):
            table = to_arrow(tables[name])
            pq.write_table(table, tmp / f"{name}.parquet")
            res.tables[name] = table.num_rows
            schema["tables"][name] = {"file": f"{name}.parquet", "rows": table.num_rows,
                                      "columns": [{"name": f.name, "type": str(f.type)} for f in table.schema]}
        (tmp / SCHEMA_FILE).write_bytes(orjson.dumps(schema, option=orjson.OPT_INDENT_2))
    return res


def run(bundle: Bundle, out: Path, *, include_text: bool = False) -> Written:
    """The registry's entry point (diagnose/export/__init__.py); ``include_text``: the tables hold no request text."""
    res = export(bundle, out)
    return Written(f"{len(res.tables)} tables, {sum(res.tables.values())} rows", list(res.warnings))
