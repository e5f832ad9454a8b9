"""`diagnose experiment`: start the server, capture, diagnose, restart it with the top finding's one flag
changed, capture again and verify."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from diagnose.cli import exits, settings
from diagnose.cli.common import _analyze, _json, _write, verification_lines
from diagnose.cli.quality_options import MAX_SCORE_DROP, MIN_AGREEMENT, QUALITY_TIMEOUT_S, quality_options
from diagnose.errors import DiagnoseError, InputError
from diagnose.io import schemas
from diagnose.io.schemas import versioned


@click.command(epilog=exits.epilog(exits.VERIFY_CODES + (exits.TARGET,)),
               context_settings=settings(ignore_unknown_options=True))
@click.option("--launch", "launch_cmd", required=True, metavar="COMMAND",
              help="The server command line, e.g. \"vllm serve MODEL --port 8000 --max-num-seqs 2\". diagnose "
                   "starts it, and restarts it with the experiment's one flag changed.")
@click.option("--url", required=True, help="Where that server answers, e.g. http://127.0.0.1:8000.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Folder for both bundles, the verification (verify.json) and its report (report.html).")
@click.option("--finding", metavar="RULE_ID", help="Run this finding's experiment (default: the verdict's top one).")
@click.option("--set", "override", metavar="FLAG=VALUE",
              help="Change this engine flag instead of the finding's variable (e.g. to test another cause).")
@click.option("--startup-timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for the server.")
@click.option("--warmup-s", "warmup_s", type=float, default=10.0, show_default=True,
              help="After each start, send this many seconds of the same load first (not measured), so both "
                   "runs are warm; 0: measure from a cold start.")
@click.option("--top", "top", type=int, metavar="N",
              help="Run the experiments of the top N findings one at a time against one shared baseline, each "
                   "verified, then all of them together: a what-if table (top.json). Not with --finding/--set.")
@quality_options
@click.argument("attach_args", nargs=-1, type=click.UNPROCESSED)
def experiment(launch_cmd: str, url: str, output: Path, finding: str | None, override: str | None,
               startup_timeout: float, warmup_s: float, attach_args: tuple[str, ...], quality_cmd: str | None = None,
               quality_timeout: float = QUALITY_TIMEOUT_S, min_agreement: float = MIN_AGREEMENT,
               max_score_drop: float = MAX_SCORE_DROP, top: int | None = None) -> None:
    """Run the top finding's experiment: start the server, capture (ATTACH_ARGS are `diagnose attach`'s
    workload options, e.g. -- --concurrency 16 --duration 15s), diagnose, restart it with the one engine
    flag the experiment names changed, capture the same workload again, and verify: confirmed (0),
    refuted (7) or inconclusive (8). With attach's --greedy among ATTACH_ARGS, or --quality-cmd, a change that
    alters the outputs or lowers the score is refuted on quality. diagnose only ever changes the server it
    started here."""
    from diagnose import compare as cmp
    from diagnose.runs import experiment as er

    def log(msg: str) -> None:
        click.echo(msg, err=True)

    import signal

    def _term(_sig: int, _frame: object) -> None:  # SIGTERM: stop the server we started, as Ctrl-C does
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    from diagnose.compare.quality import check_options as check_quality

    check_quality(min_agreement, max_score_drop, quality_timeout)
    if top is not None and (finding or override):
        raise InputError("--top runs the top findings' own experiments: drop --finding and --set")
    if top is not None and not 1 <= top <= 10:
        raise InputError(f"--top {top}: use 1 to 10 experiments")
    url = er.check_url(url)
    argv = er.split_launch(launch_cmd)  # bad input is a usage error (exit 2), before anything starts
    pair = er.parse_set(override) if override else None
    startup_timeout = er.check_startup_timeout(startup_timeout)
    er.refuse_running(url)
    output.mkdir(parents=True, exist_ok=True)
    args = list(attach_args[1:] if attach_args[:1] == ("--",) else attach_args)
    log("run 1 of 2: as given")
    if not (warmup_s >= 0 and math.isfinite(warmup_s)):
        raise DiagnoseError(f"--warmup-s {warmup_s}: expected seconds >= 0")
    record: dict[str, Any] = {"launch": argv, "url": url, "attach_args": args, "warmup_s": warmup_s}
    record["invalid_tries_before"] = er.valid_capture(argv, url, output / "before", args, log, startup_timeout,
                                                      warmup_s)
    qopts: dict[str, Any] = {"quality_cmd": quality_cmd, "quality_timeout_s": quality_timeout, "min_agreement": min_agreement,
             "max_score_drop": max_score_drop}
    if top is not None:
        _top(top, argv, url, output, args, log, startup_timeout, warmup_s, record, qopts)
        return
    p, why = er.plan(output / "before", argv, finding, pair)
    if p is None:
        record["not_run"] = why
        _write(output / "experiment.json", _json(versioned(schemas.EXPERIMENT, record)))
        click.echo(f"inconclusive: not run: {why}")
        raise click.exceptions.Exit(exits.INCONCLUSIVE)
    record.update(finding=p.finding, variable=p.variable, flag=p.flag, value=p.value, launch_after=p.argv_after)
    _write(output / "experiment.json", _json(versioned(schemas.EXPERIMENT, record)))
    how = "the flag given with --set" if pair else f"{p.finding}'s experiment"
    log(f"run 2 of 2: {how}: {p.flag} {p.value}".rstrip())
    record["invalid_tries_after"] = er.valid_capture(p.argv_after, url, output / "after", args, log,
                                                     startup_timeout, warmup_s)
    _write(output / "experiment.json", _json(versioned(schemas.EXPERIMENT, record)))
    v = cmp.verify(_analyze(output / "before"), _analyze(output / "after"), finding=p.finding, **qopts)
    _write(output / "verify.json", _json(versioned(schemas.VERIFICATION, {**v.to_json(), "experiment": record})))
    from diagnose.reports.compare import render_comparison

    _write(output / "report.html", render_comparison(v.comparison.to_json(), verification=v.to_json()).encode())
    for line in verification_lines(v):
        click.echo(line)
    click.echo(f"written: {output / 'verify.json'}, {output / 'report.html'}")
    if v.outcome == "refuted":
        raise click.exceptions.Exit(exits.REFUTED)
    if v.outcome == "inconclusive":
        raise click.exceptions.Exit(exits.INCONCLUSIVE)


def _top(n: int, argv: list[str], url: str, output: Path, args: list[str], log: Any, startup_timeout: float,
         warmup_s: float, record: dict[str, Any], qopts: dict[str, Any]) -> None:
    """--top N (diagnose/runs/experiment_top.py): each experiment alone against the shared baseline ("before"),
    then all together; exit status by the combined change's verification (by the one experiment's with N = 1)."""
    from diagnose import compare as cmp
    from diagnose.runs import experiment as er
    from diagnose.runs import experiment_top as et

    plans, skipped = et.top_plans(output / "before", argv, n)
    record["skipped"] = skipped
    for why in skipped:
        log(f"not run: {why}")
    if not plans:
        record["not_run"] = "; ".join(skipped) or "no finding has an experiment diagnose can run"
        _write(output / "top.json", _json(record))
        click.echo(f"inconclusive: not run: {record['not_run']}")
        raise click.exceptions.Exit(exits.INCONCLUSIVE)
    before = _analyze(output / "before")
    runs: list[tuple[str, str, list[str]]] = [
        (f"{p.finding}: {p.flag.split(' ')[0]} {p.value}".rstrip(), p.finding, p.argv_after) for p in plans]
    if len(plans) > 1:
        runs.append(("combined: " + ", ".join(f"{p.flag.split(' ')[0]} {p.value}".rstrip() for p in plans),
                     plans[0].finding, et.combined_argv(argv, plans)))
    rows: list[dict[str, Any]] = []
    last = None
    for i, (name, fid, after_argv) in enumerate(runs, start=1):
        folder = output / ("combined" if name.startswith("combined") else f"exp{i}-{fid}")
        log(f"run {i + 1} of {len(runs) + 1}: {name}")
        invalid = er.valid_capture(after_argv, url, folder, args, log, startup_timeout, warmup_s)
        last = cmp.verify(before, _analyze(folder), finding=fid, **qopts)
        rows.append({**et.WhatIf(name, last).row(), "launch": after_argv, "bundle": str(folder),
                     "invalid_tries": invalid})
        record["what_if"] = rows
        _write(output / "top.json", _json(record))
    for line in et.what_if_lines(rows):
        click.echo(line)
    click.echo(f"written: {output / 'top.json'}")
    assert last is not None
    if last.outcome == "refuted":
        raise click.exceptions.Exit(exits.REFUTED)
    if last.outcome == "inconclusive":
        raise click.exceptions.Exit(exits.INCONCLUSIVE)
