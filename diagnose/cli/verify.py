"""`diagnose verify BEFORE AFTER`: confirm or refute a finding's hypothesis from a run with its experiment."""

from __future__ import annotations

from pathlib import Path

import click

from diagnose.cli import exits, settings
from diagnose.cli.common import _analyze, _json, _write, check_seed, verification_lines
from diagnose.cli.quality_options import MAX_SCORE_DROP, MIN_AGREEMENT, QUALITY_TIMEOUT_S, quality_options
from diagnose.io import schemas
from diagnose.io.schemas import versioned


@click.command(epilog=exits.epilog(exits.VERIFY_CODES), context_settings=settings())
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option("--finding", metavar="RULE_ID", help="The finding of BEFORE to verify (default: the verdict's top one).")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write the verification as JSON.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the comparison as an HTML report.")
@click.option("--confidence", type=float, default=0.95, show_default=True, help="Confidence of the intervals.")
@click.option("--resamples", type=int, default=2000, show_default=True, help="Bootstrap resamples.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the resampling.")
@quality_options
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
def verify(before: Path, after: Path, finding: str | None, json_out: Path | None, output: Path | None,
           confidence: float, resamples: int, seed: int, quiet: bool, quality_cmd: str | None = None,
           quality_timeout: float = QUALITY_TIMEOUT_S, min_agreement: float = MIN_AGREEMENT,
           max_score_drop: float = MAX_SCORE_DROP) -> None:
    """Confirm or refute a finding of BEFORE from AFTER, a run with the finding's experiment applied: did
    the signals its hypothesis names move the predicted way, significantly, without breaking the SLO? With
    greedy captures (attach --greedy) or --quality-cmd, a change that alters the outputs or lowers the score is
    refuted on quality."""
    from diagnose import compare as cmp
    from diagnose.io.outputs import check_outputs, terminate_interrupts

    cmp.check_options(confidence, resamples, "blocks")
    check_seed(seed)
    check_outputs((("-o", output), ("--json", json_out)), (before, after))
    with terminate_interrupts():
        v = cmp.verify(_analyze(before), _analyze(after), finding=finding, confidence=confidence,
                       resamples=resamples, seed=seed, quality_cmd=quality_cmd,
                       quality_timeout_s=quality_timeout, min_agreement=min_agreement,
                       max_score_drop=max_score_drop)
        _write(json_out, _json(versioned(schemas.VERIFICATION, v.to_json())))
        if output is not None:
            from diagnose.reports.compare import render_comparison

            _write(output, render_comparison(v.comparison.to_json(), verification=v.to_json()).encode("utf-8"))
    if not quiet:
        for line in verification_lines(v):
            click.echo(line)
    if v.outcome == "refuted":
        raise click.exceptions.Exit(exits.REFUTED)
    if v.outcome == "inconclusive":
        raise click.exceptions.Exit(exits.INCONCLUSIVE)
