"""`diagnose workload BUNDLE -o workload.jsonl`: the replayable, text-free workload of a capture
(docs/workload.md); `diagnose attach --workload workload.jsonl` replays it."""

from __future__ import annotations

from pathlib import Path

import click

from diagnose.cli import exits, settings

WORKLOAD_CODES = (exits.OK, exits.ERROR, exits.USAGE, exits.INTERNAL, exits.INTERRUPTED)


@click.command(epilog=exits.epilog(WORKLOAD_CODES), context_settings=settings())
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("workload.jsonl"), show_default=True,
              help="Where to write the workload file (JSONL).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
def workload(bundle: Path, output: Path, quiet: bool) -> None:
    """Write a bundle's workload as a replayable file: per request its arrival offset, input and output
    token counts and prefix-group hashes (which requests share a prefix), never prompt text.

    From a bundle captured with load, its own requests. From an observe-mode bundle (`attach --observe`),
    the server's telemetry: arrivals at its finished counts per scrape interval, lengths drawn from its length
    histograms (token totals exact), one prefix group as large as its prefix-cache hit ratio. Replay it with
    `diagnose attach --workload FILE`.
    """
    from diagnose.io.outputs import check_outputs, terminate_interrupts

    check_outputs((("-o", output),), (bundle,))
    with terminate_interrupts():  # SIGTERM: exit 130 with no temporary file left, as Ctrl-C
        _workload(bundle, output, quiet)


def _workload(bundle: Path, output: Path, quiet: bool) -> None:
    from diagnose.capture.workload import prefix_share
    from diagnose.io.bundle import open_bundle
    from diagnose.io.outputs import write_bytes
    from diagnose.io.workload_file import encode_workload, from_bundle

    b = open_bundle(bundle)
    reqs, block, note = from_bundle(b)
    data = encode_workload(reqs, block_tokens=block, source=f"diagnose workload {b.path.name}: {note}")
    write_bytes(output, data, parents=True)
    if not quiet:
        for w in b.warnings:
            click.echo(f"warning: {w}", err=True)
        share = prefix_share(reqs, block)
        click.echo(f"workload: {len(reqs)} requests over {reqs[-1].offset_s:.3f} s, prefix share "
                   f"{0.0 if share is None else share:.0%} (blocks of {block} tokens) -> {output}")
