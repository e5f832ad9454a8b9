"""`diagnose export SOURCE --format perfetto|speedscope|parquet [-o OUT]`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from diagnose.cli import exits, settings
from diagnose.errors import InputError
from diagnose.export import FORMATS, SUFFIX

EXPORT_CODES = (exits.OK, exits.ERROR, exits.USAGE, exits.INTERNAL, exits.INTERRUPTED)


def default_output(source: Path, fmt: str) -> Path:
    name = source.resolve().name
    if name == "bundle" and (source / "manifest.json").exists():
        name = source.resolve().parent.name  # a sample folder's bundle: name it after the sample
    for ext in (".json.gz", ".json", ".jsonl"):
        if name.endswith(ext):
            name = name[: -len(ext)]
    return Path(name + SUFFIX[fmt])


@click.command(epilog=exits.epilog(EXPORT_CODES), context_settings=settings())
@click.argument("source", type=click.Path(path_type=Path))
@click.option("-f", "--format", "fmt", metavar="FORMAT", default="perfetto", show_default=True,
              help="perfetto | speedscope | parquet.")
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Output file (perfetto, speedscope) or directory (parquet); default: named after SOURCE.")
@click.option("--include-text", is_flag=True,
              help="perfetto: include prompt and output text, when the bundle stored it (attach --store-text).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
def export(source: Path, fmt: str, output: Path | None, include_text: bool, quiet: bool) -> None:
    """Export a bundle (or a profiler trace, or an OTLP span file) for other tools.

    \b
    perfetto    one timeline of requests, engine spans, metrics, GPU counters, py-spy stacks
                and profiler kernels, on the bundle's clock (open in ui.perfetto.dev)
    speedscope  the py-spy host stacks, one sampled profile per thread (open in speedscope.app)
    parquet     every table of the analysis (requests, ITL, spans, metrics, host, GPU, trace,
                findings, signals) as Parquet files in a directory, with schema.json
    docs/exports.md describes each format.
    """
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: unknown export format (expected {', '.join(FORMATS)})")
    from diagnose.io.outputs import check_outputs, terminate_interrupts

    out = output if output is not None else default_output(source, fmt)
    check_outputs((("-o", out),), (source,))
    with terminate_interrupts():  # SIGTERM: exit 130, no partial output or temporary file left, as Ctrl-C
        _export(source, fmt, out, include_text, quiet)


def _warn(warnings: list[str]) -> None:
    """Each warning once (the analysis repeats the bundle's), counted lines as the readers wrote them."""
    for w in dict.fromkeys(warnings):
        click.echo(f"warning: {w}", err=True)


def _export(source: Path, fmt: str, out: Path, include_text: bool, quiet: bool) -> None:
    from diagnose.export.files import NothingExported
    from diagnose.pipeline import open_input

    bundle = open_input(source)
    try:
        summary, warnings = _run(bundle, fmt, out, include_text)
    except NothingExported as e:  # the warnings say what was skipped; then the one-line error, exit 1
        _warn([*bundle.warnings, *e.warnings])
        raise
    if not quiet:
        _warn([*bundle.warnings, *warnings])
        click.echo(f"{fmt}: {out} ({summary})")


def _run(bundle: Any, fmt: str, out: Path, include_text: bool) -> tuple[str, list[str]]:
    from diagnose.export import EXPORTERS

    written = EXPORTERS[fmt].run(bundle, out, include_text=include_text)
    return written.summary, written.warnings
