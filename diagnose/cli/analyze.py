"""`diagnose analyze BUNDLE_OR_TRACE -o report.html [--json findings.json]`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from diagnose.cli import exits, settings
from diagnose.errors import InputError
from diagnose.model import SEVERITY_WEIGHT

if TYPE_CHECKING:  # diagnose.analysis imports pandas: `diagnose --help` must not pay for it
    from diagnose.analysis import Analysis


def parse_threshold_overrides(values: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for v in values:
        if "=" not in v:
            raise InputError(f"--threshold {v!r}: use name=value")
        k, val = v.split("=", 1)
        try:
            num = float(val)
        except ValueError as e:
            raise InputError(f"--threshold {v!r}: {val!r} is not a number") from e
        if not math.isfinite(num):
            raise InputError(f"--threshold {v!r}: {val!r} is not a finite number")
        out[k.strip()] = num
    return out


def run_analysis(path: Path, rules_dirs: tuple[Path, ...] = (), threshold_files: tuple[Path, ...] = (),
                 overrides: dict[str, float] | None = None, include_python: bool = False,
                 price: float | None = None) -> Analysis:
    from diagnose.pipeline import analyze

    return analyze(path, rules_dirs=rules_dirs, threshold_files=threshold_files, threshold_overrides=overrides,
                   include_python=include_python, cost_per_hour=price)


def analysis_json(a: Analysis) -> dict[str, Any]:
    """The `analyze --json` document of ``a`` (reports/document.build_document, from the page's view model)."""
    from diagnose.reports.document import build_document

    return build_document(a)


@click.command(epilog=exits.epilog(exits.ANALYZE_CODES), context_settings=settings())
@click.argument("source", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("report.html"), show_default=True,
              help="Where to write the HTML report.")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Also write findings and signals as JSON.")
@click.option("--rules", "rules_dirs", multiple=True, type=click.Path(path_type=Path),
              help="A directory of your own rules (repeatable).")
@click.option("--thresholds", "threshold_files", multiple=True, type=click.Path(path_type=Path),
              help="A YAML file of threshold overrides (name: value).")
@click.option("--threshold", "threshold_values", multiple=True, metavar="NAME=VALUE",
              help="Override one threshold (repeatable); `diagnose rules thresholds` lists them.")
@click.option("--include-python", is_flag=True,
              help="Traces: also keep every python_function event and add the top Python functions by time to the "
                   "report (trace_python_functions; slower). vLLM V1 step frames are kept without it.")
@click.option("--fail-on", type=click.Choice(list(SEVERITY_WEIGHT)),
              help=f"Exit with status {exits.FAIL_ON} when a finding of this severity or worse fires (for CI).")
@click.option("--cost-per-hour", "cost", metavar="PRICE[xDEVICES]",
              help="Price of an hour of the deployment (or per device-hour x devices, e.g. 4.1x8): the workload "
                   "card adds cost per million output tokens, per request and per request within the SLO. "
                   "Default: the price `attach --cost-per-hour` recorded.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
@click.option("--scheduler", metavar="ADDRESS",
              help="Trace sets: analyse the ranks on this running Dask scheduler (tcp://host:8786); its workers "
                   "must see the traces at the same paths.")
@click.option("--workers", type=click.IntRange(min=1), metavar="N",
              help="Trace sets: local worker processes, one rank each at a time (default: one per core for sets "
                   "of 8 or more ranks on 4 or more cores, else 1; 1: analyse in this process).")
def analyze(source: Path, output: Path, json_out: Path | None, rules_dirs: tuple[Path, ...],
            threshold_files: tuple[Path, ...], threshold_values: tuple[str, ...], include_python: bool,
            fail_on: str | None, quiet: bool, scheduler: str | None = None, workers: int | None = None,
            cost: str | None = None) -> None:
    """Analyse a capture bundle (or a profiler trace, or an OTLP JSON span file) into an HTML report.

    SOURCE is a bundle directory written by `diagnose attach`, a torch.profiler / Kineto trace
    (.json or .json.gz, or a directory of per-rank traces), or OTLP JSON spans.

    An invalid run (a validity check failed: the load client was the bottleneck, say) is still reported,
    and then exits with status 5, so that a script never takes it for a result.
    """
    from diagnose.io.outputs import check_outputs, terminate_interrupts

    check_outputs((("-o", output), ("--json", json_out)), (source, *rules_dirs, *threshold_files))
    with terminate_interrupts():  # SIGTERM: exit 130 with no temporary file left, as Ctrl-C
        _analyze(source, output, json_out, rules_dirs, threshold_files, threshold_values, include_python, fail_on,
                 quiet, scheduler, workers, cost)


def _analyze(source: Path, output: Path, json_out: Path | None, rules_dirs: tuple[Path, ...],
             threshold_files: tuple[Path, ...], threshold_values: tuple[str, ...], include_python: bool,
             fail_on: str | None, quiet: bool, scheduler: str | None, workers: int | None, cost: str | None) -> None:
    import orjson

    from diagnose.io.outputs import write_bytes
    from diagnose.io.schemas import dumps
    from diagnose.reports.document import build_document, verdict_line
    from diagnose.reports.render import write_report
    from diagnose.reports.view_model import build_view

    overrides = parse_threshold_overrides(threshold_values)
    from diagnose.signals.cost import parse_price
    from diagnose.trace.distributed import ScaleOut, scale_out

    price = parse_price(cost) if cost is not None else None  # a bad price fails before any work

    if scheduler and workers:
        raise click.UsageError("--workers sizes a local cluster; with --scheduler the scheduler's workers run")
    with scale_out(ScaleOut(scheduler=scheduler, workers=workers)):  # trace sets fan out on Dask (trace-analysis.md)
        # the price is an argument of the analysis (the workload card's cost), never written into its manifest
        analysis = run_analysis(source, rules_dirs, threshold_files, overrides, include_python, price)
    view = build_view(analysis)  # one view model: the page renders it, the --json document projects it
    write_report(analysis, output, view=view)
    if json_out is not None:
        # schema_version written first (a reader tells the version from the file's first bytes), the rest sorted
        write_bytes(json_out, dumps(build_document(analysis, view), option=orjson.OPT_INDENT_2
                                    | orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY))
    if not quiet:
        for w in analysis.warnings:
            click.echo(f"warning: {w}", err=True)
        click.echo(verdict_line(analysis))
        v = analysis.verdict
        if v is not None and v.symptom:
            click.echo(f"  symptom: {v.symptom}")
        if v is not None and v.cause:
            share = f", explains {v.share:.0%}: {v.share_of}" if v.share is not None else ""
            click.echo(f"  cause ({v.cause_status}{share}): {v.cause}")
            if v.experiment:
                click.echo(f"  next experiment: {v.experiment}")
        for f in analysis.findings[:5]:
            tag = f" (consequence of {f.explained_by})" if f.explained_by else ""
            tag += f" (held back by {f.held_back})" if f.held_back else ""
            click.echo(f"  [{f.severity}] {f.rule_id} {f.title}{tag}")
        if analysis.not_evaluated:
            click.echo(f"  ({len(analysis.not_evaluated)} rules not evaluated: missing evidence; see the report)")
        click.echo(f"report: {output}" + (f"  json: {json_out}" if json_out else ""))
    if not analysis.run_valid:  # before --fail-on: nothing judged on an invalid run is a result
        raise click.exceptions.Exit(exits.INVALID_RUN)
    if fail_on:
        limit = SEVERITY_WEIGHT[fail_on]
        if any(SEVERITY_WEIGHT.get(f.severity, 0) >= limit for f in analysis.findings):
            raise click.exceptions.Exit(exits.FAIL_ON)
