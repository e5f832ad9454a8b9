"""`diagnose experiment`: start the server, capture, diagnose, restart it with the top finding's one flag
changed, capture again and verify."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from diagnose.cli import exits, settings
from diagnose.cli.common import _analyze, _json, _write, verification_lines
from diagnose.errors import DiagnoseError


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
@click.argument("attach_args", nargs=-1, type=click.UNPROCESSED)
def experiment(launch_cmd: str, url: str, output: Path, finding: str | None, override: str | None,
               startup_timeout: float, warmup_s: float, attach_args: tuple[str, ...]) -> None:
    """Run the top finding's experiment: start the server, capture (ATTACH_ARGS are `diagnose attach`'s
    workload options, e.g. -- --concurrency 16 --duration 15s), diagnose, restart it with the one engine
    flag the experiment names changed, capture the same workload again, and verify: confirmed (0),
    refuted (7) or inconclusive (8). diagnose only ever changes the server it started here."""
    from diagnose import compare as cmp
    from diagnose.runs import experiment as er

    def log(msg: str) -> None:
        click.echo(msg, err=True)

    import signal

    def _term(_sig: int, _frame: object) -> None:  # SIGTERM: stop the server we started, as Ctrl-C does
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
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
    p, why = er.plan(output / "before", argv, finding, pair)
    if p is None:
        record["not_run"] = why
        _write(output / "experiment.json", _json(record))
        click.echo(f"inconclusive: not run: {why}")
        raise click.exceptions.Exit(exits.INCONCLUSIVE)
    record.update(finding=p.finding, variable=p.variable, flag=p.flag, value=p.value, launch_after=p.argv_after)
    _write(output / "experiment.json", _json(record))
    how = "the flag given with --set" if pair else f"{p.finding}'s experiment"
    log(f"run 2 of 2: {how}: {p.flag} {p.value}".rstrip())
    record["invalid_tries_after"] = er.valid_capture(p.argv_after, url, output / "after", args, log,
                                                     startup_timeout, warmup_s)
    _write(output / "experiment.json", _json(record))
    v = cmp.verify(_analyze(output / "before"), _analyze(output / "after"), finding=p.finding)
    _write(output / "verify.json", _json({**v.to_json(), "experiment": record}))
    from diagnose.reports.compare import render_comparison

    _write(output / "report.html", render_comparison(v.comparison.to_json(), verification=v.to_json()).encode())
    for line in verification_lines(v):
        click.echo(line)
    click.echo(f"written: {output / 'verify.json'}, {output / 'report.html'}")
    if v.outcome == "refuted":
        raise click.exceptions.Exit(exits.REFUTED)
    if v.outcome == "inconclusive":
        raise click.exceptions.Exit(exits.INCONCLUSIVE)
