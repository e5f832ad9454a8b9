"""`diagnose readiness --url URL -o OUT [--launch COMMAND]`: production-readiness checks and their card."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import click

from diagnose.cli import exits, settings

CODES = (exits.OK, exits.ERROR, exits.USAGE, exits.TARGET, exits.INTERNAL, exits.INTERRUPTED)


@click.command(context_settings=settings(), epilog=exits.epilog(
    CODES, extra="readiness: 1 also when a check failed (the card says which)"))
@click.option("--url", help="The server to check, e.g. http://127.0.0.1:8000 (all traffic goes there).")
@click.option("--from", "from_dir", type=click.Path(path_type=Path), metavar="FOLDER",
              help="Judge again, offline, the measurements of an earlier run (its folder or readiness.json) "
                   "with its recorded thresholds, --threshold and --slo on top; sends nothing (instead of "
                   "--url).")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Folder for readiness.json, readiness.html (the card) and, with --launch, server.log (and "
                   "server-restart.log after the failure check); with --url also a capture bundle of every request "
                   "the checks sent, one phase per check (diagnose analyze opens it).")
@click.option("--launch", metavar="COMMAND",
              help="Start this server command (it must answer at --url) for the cold-start and failure checks "
                   "(the failure check kills it and starts it again); diagnose stops it at the end. Without it "
                   "neither is run.")
@click.option("--slo", help="SLO terms, e.g. ttft_p99=500ms (the cold start's first request and the requests the "
                            "overload check admits are judged against the TTFT term).")
@click.option("--cancel-streams", type=int, default=8, show_default=True,
              help="Streams opened at once for the cancellation check (2 to 64).")
@click.option("--abort-share", type=float, default=0.5, show_default=True,
              help="Share of them aborted after their first tokens.")
@click.option("--cancel-tokens", type=int, default=512, show_default=True,
              help="Tokens each of those streams asks for (long enough to be open when aborted; when too "
                   "few were, the check runs once more with 4x, at most 8192).")
@click.option("--cancel-dwell", type=float, default=1.0, show_default=True, metavar="SECONDS",
              help="How long the streams run together after their first tokens before the abort (the kept "
                   "streams' rate before it is measured over this time).")
@click.option("--checks", default="cancellation,cold-start,overload,failure", show_default=True,
              help="The checks to run, comma-separated (cold-start and failure run only with --launch).")
@click.option("--failure-clients", type=int, default=4, show_default=True,
              help="Failure check: clients sending requests back to back (retrying with backoff) across the crash.")
@click.option("--failure-before", type=float, default=5.0, show_default=True, metavar="SECONDS",
              help="Failure check: how long they run before the server is killed.")
@click.option("--failure-tokens", type=int, default=32, show_default=True,
              help="Failure check: tokens each request asks for (longer requests are surely open when the server "
                   "is killed; short ones on a fast server may all have ended).")
@click.option("--overload-factors", default="0.5,1,1.5,2", show_default=True, metavar="LIST",
              help="Overload ramp: the open-loop rates sent, as rising multiples of the measured capacity (at most 4).")
@click.option("--overload-step", type=float, default=10.0, show_default=True, metavar="SECONDS",
              help="How long each rate of the ramp is sent.")
@click.option("--overload-concurrency", type=int, default=16, show_default=True,
              help="Streams of the closed loop that measures the capacity (for --overload-capacity-time seconds).")
@click.option("--overload-capacity-time", type=float, default=10.0, show_default=True, metavar="SECONDS",
              help="How long the capacity is measured.")
@click.option("--overload-capacity", type=float, default=None, metavar="RPS",
              help="The server's capacity in completions per second, instead of measuring it.")
@click.option("--overload-tokens", type=int, default=32, show_default=True,
              help="Tokens each request of the overload check asks for.")
@click.option("--overload-max-requests", type=int, default=2000, show_default=True,
              help="The overload ramp's budget: requests sent in all; an arrival past it is not sent (counted).")
@click.option("--startup-timeout", type=float, default=600.0, show_default=True,
              help="Seconds to wait for a launched server to be healthy.")
@click.option("--threshold", "threshold_values", multiple=True, metavar="NAME=VALUE",
              help="Override one threshold (repeatable): readiness_cancel_release_max_s, "
                   "readiness_cold_ttft_ratio_max, readiness_overload_wait_requests_max, readiness_recovery_max_s, "
                   "readiness_recovery_ttft_ratio, readiness_restart_recovery_max_s, readiness_health_gap_max_s, "
                   "readiness_retry_amplification_max.")
@click.option("--force", is_flag=True, help="Write into a folder that is not empty.")
def readiness(url: str | None, from_dir: Path | None, output: Path, launch: str | None, slo: str | None, cancel_streams: int, abort_share: float,
              cancel_tokens: int, cancel_dwell: float, checks: str, overload_factors: str, overload_step: float,
              overload_concurrency: int, overload_capacity_time: float, overload_capacity: float | None,
              overload_tokens: int, overload_max_requests: int, failure_clients: int, failure_before: float,
              failure_tokens: int, startup_timeout: float, threshold_values: tuple[str, ...], force: bool) -> None:
    """Check that the server at --url is ready for production: aborted streams release their work on the engine
    (RDY001, from llama.cpp's /slots or vLLM's running/waiting gauges); with --launch, how long a fresh server
    takes to its first token and how much slower its first requests are than warm ones (RDY002); past its
    measured capacity (an open-loop ramp to 2x), whether it bounds its queue or rejects with 429/503, keeps the
    latency of what it admits and recovers once the overload ends (RDY003); with --launch, after a crash and a
    restart, how long until it serves again, how many requests are lost and whether retries stay bounded
    (RDY004). Writes a readiness card (pass / fail / not run, the numbers, the fix to try) into a folder that is
    also a capture bundle of the checks' requests (diagnose analyze opens it); docs/readiness.md."""
    from diagnose.capture.workload import parse_slo
    from diagnose.cli.analyze import parse_threshold_overrides
    from diagnose.errors import InputError
    from diagnose.readiness import run as rr
    from diagnose.readiness.cancel import CancelPlan
    from diagnose.readiness.coldstart import ColdPlan
    from diagnose.readiness.failure import FailurePlan
    from diagnose.readiness.overload import OverloadPlan
    from diagnose.rules.spec import load_thresholds
    from diagnose.runs.experiment import check_startup_timeout

    if (url is None) == (from_dir is None):
        raise InputError("give --url (check a server) or --from FOLDER (judge an earlier run again), not both"
                         if url else "--url is required (or --from FOLDER to judge an earlier run again)")
    if from_dir is not None:
        _show(rr.rejudge(from_dir, output, parse_threshold_overrides(threshold_values),
                         parse_slo(slo) if slo else None, force), output)
        return
    asked = frozenset(x.strip() for x in checks.split(",") if x.strip())
    if not asked or asked - set(rr.CHECKS):
        raise InputError(f"--checks {checks}: name one or more of {', '.join(rr.CHECKS)}")
    try:
        factors = tuple(float(x) for x in overload_factors.split(","))
    except ValueError:
        raise InputError(f"--overload-factors {overload_factors}: numbers separated by commas, e.g. 0.5,1,1.5,2") from None
    over = OverloadPlan(factors=factors, step_s=overload_step, capacity_s=overload_capacity_time,
                        concurrency=overload_concurrency, capacity_rps=overload_capacity, max_tokens=overload_tokens,
                        max_requests=overload_max_requests)
    startup_s = check_startup_timeout(startup_timeout)
    fail = FailurePlan(workers=failure_clients, before_s=failure_before, max_tokens=failure_tokens,
                       recover_limit_s=startup_s + 60.0)
    thr = load_thresholds(overrides=parse_threshold_overrides(threshold_values))
    assert url is not None
    req = rr.Request(url=url, output=output, launch=launch, slo=parse_slo(slo), thresholds=thr,
                     cancel=CancelPlan(streams=cancel_streams, abort_share=abort_share, max_tokens=cancel_tokens,
                                       dwell_s=cancel_dwell),
                     cold=ColdPlan(startup_timeout_s=startup_s), overload=over,
                     failure=fail, checks=asked, force=force)
    _show(rr.run(req, lambda m: click.echo(m, err=True)), output, bundle=True)


def _show(doc: Mapping[str, object], output: Path, bundle: bool = False) -> None:
    """The card on stdout, where it was written (and, for a live run, that the folder is a bundle); exit 1 when a
    check failed."""
    from diagnose.readiness import card
    from diagnose.readiness import run as rr

    for line in card.lines(doc):
        click.echo(line)
    click.echo(f"written: {output / rr.JSON_NAME}, {output / rr.HTML_NAME}")
    if bundle and (output / "manifest.json").is_file():
        click.echo(f"bundle: {output} (the checks' requests, one phase per check: diagnose analyze {output})")
    if doc["failed"]:
        raise click.exceptions.Exit(exits.ERROR)
