"""`diagnose export SOURCE --format perfetto|speedscope|parquet [-o OUT]`."""

from __future__ import annotations

from pathlib import Path

import click

from diagnose.cli import exits
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


@click.command(epilog=exits.epilog(EXPORT_CODES))
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
    from diagnose.pipeline import open_input

    out = output if output is not None else default_output(source, fmt)
    bundle = open_input(source)
    if fmt == "perfetto":
        from diagnose.export.perfetto import export as export_perfetto

        res = export_perfetto(bundle, out, include_text=include_text)
        summary = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in res.counts.items() if v)
        warnings = res.warnings
    elif fmt == "speedscope":
        from diagnose.export.speedscope import export as export_speedscope

        sres = export_speedscope(bundle, out)
        summary = f"{sres.profiles} profiles, {sres.frames} frames, {sres.samples} samples"
        warnings = []
    else:
        from diagnose.export.parquet import export as export_parquet

        pres = export_parquet(bundle, out)
        summary = f"{len(pres.tables)} tables, {sum(pres.tables.values())} rows"
        warnings = pres.warnings
    if not quiet:
        for w in [*bundle.warnings, *warnings]:
            click.echo(f"warning: {w}", err=True)
        click.echo(f"{fmt}: {out} ({summary})")
