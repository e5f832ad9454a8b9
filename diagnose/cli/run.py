"""`diagnose run -- python server.py ...`: run a Python server under pyinstrument, profiling its event loop."""

from __future__ import annotations

from pathlib import Path

import click

from diagnose.cli import settings


@click.command(context_settings=settings(ignore_unknown_options=True, allow_interspersed_args=False))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Bundle directory for the profile.")
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, required=True)
def run(output: Path, argv: tuple[str, ...]) -> None:
    """Start a Python server under pyinstrument (e.g. diagnose run -o prof/ -- python server.py --port 8000).

    The profile lands in the bundle when the server exits (Ctrl-C stops it).
    """
    from diagnose.probes.pyinstrument_probe import run_under_profiler

    code = run_under_profiler(list(argv), str(output))
    if code:
        raise click.exceptions.Exit(code)
