"""`diagnose attach --launch COMMAND` (and `--verify`): the server started, captured and stopped by
diagnose, or the whole experiment."""

from __future__ import annotations

import time
from pathlib import Path

import click

from diagnose.probes.base import Options


def launched(o: Options) -> None:
    """``--launch`` (and ``--verify``): the server started, captured and stopped by diagnose, or the whole
    experiment (``diagnose experiment``, which this delegates to)."""
    from diagnose.runs import experiment as er
    from diagnose.runs.goodput_search import _OWN, level_args

    if not o["launch"]:
        raise click.UsageError("--verify needs --launch COMMAND: diagnose only changes a server it started")
    if not o["url"]:
        raise click.UsageError("Missing option '--url' (where the launched server answers).")
    if o["find_max_goodput"] or o["prometheus"] or o["observe"]:
        raise click.UsageError("--launch captures one server under load: drop --find-max-goodput, --prometheus "
                               "and --observe")
    ctx = click.get_current_context()
    out = o["output"] or Path(time.strftime("diagnose-%Y%m%d-%H%M%S"))
    if o["verify"]:
        from diagnose.cli.experiment import experiment

        args = level_args(ctx, _OWN - {"concurrency", "rate", "baseline", "workload", "speed", "loop"} | {"url"})
        ctx.invoke(experiment, launch_cmd=o["launch"], url=o["url"], output=out, finding=None, override=None,
                   startup_timeout=600.0, warmup_s=10.0, attach_args=tuple(args))
        return
    url = er.check_url(str(o["url"]))
    argv = er.split_launch(o["launch"])  # an unbalanced quote or an empty command: exit 2, one line
    er.refuse_running(url)
    args = level_args(ctx, frozenset({"output", "force", "launch", "verify", "url"}))
    er.capture(argv, url, out, args, lambda msg: click.echo(msg, err=True), 600.0)
    click.echo(f"written: {out}")
