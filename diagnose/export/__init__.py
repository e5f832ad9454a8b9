"""Exports of a bundle for other tools (docs/exports.md): ``perfetto`` (Chrome-trace JSON of the whole
timeline), ``speedscope`` (the host stacks), ``parquet`` (every table the analysis builds)."""

from __future__ import annotations

FORMATS: dict[str, str] = {
    "perfetto": "one Chrome-trace JSON timeline (Perfetto UI, chrome://tracing)",
    "speedscope": "the py-spy host stacks as a speedscope file (one sampled profile per thread)",
    "parquet": "every table of the analysis as Parquet files in a directory, with schema.json",
}
SUFFIX: dict[str, str] = {"perfetto": ".perfetto.json", "speedscope": ".speedscope.json", "parquet": ".parquet"}
