"""`diagnose attach`: capture evidence from a live OpenAI-compatible server into a bundle.

The options are the capture's own (declared below: target, output, duration, SLO, ...) plus every probe's:
each probe module declares its options, when it runs and how it is built in its ``SPEC``
(``diagnose.probes.PROBE_MODULES`` lists them). ``AttachCommand`` adds the probes' options when click first
asks for the command's parameters, not at import, so ``diagnose --help`` loads no probe; ``attach --help``
shows them in one section per probe.

This module parses and dispatches; each mode lives in its own module, imported when it runs:
``--launch`` / ``--verify`` in cli/attach_launch.py (``--verify`` runs ``diagnose experiment``,
cli/experiment.py), ``--find-max-goodput`` in runs/goodput_search.py, ``--prometheus`` in fleet/attach.py,
and the capture itself (``--url``, with or without ``--observe``) in cli/attach_capture.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from diagnose.capture.workload import parse_slo
from diagnose.cli import settings
from diagnose.cli.attach_config import config_api_key, load_config, print_config
from diagnose.errors import InputError
from diagnose.probes import probe_specs
from diagnose.probes.base import ProbeOption, ProbeSpec

HELP_COL_MAX = 30  # click's default: the option column of every help section is this wide


def click_option(opt: ProbeOption) -> click.Option:
    """The click option for one probe option (help text, default and type as declared)."""
    decls = [opt.key, opt.name, *([opt.short] if opt.short else [])]
    kw: dict[str, Any] = {"help": opt.help, "metavar": opt.metavar}
    if opt.show_default:
        kw["show_default"] = True
    if opt.flag:
        kw["is_flag"] = True
        if "/" in opt.name or opt.default is not None:  # an on/off pair may default to None: "not given"
            kw["default"] = opt.default
    else:
        kw["default"] = opt.default
        if opt.choices:
            kw["type"] = click.Choice(list(opt.choices))
        elif opt.type is Path:
            kw["type"] = click.Path(path_type=Path)
        elif opt.type is not str:
            kw["type"] = opt.type
    return click.Option(decls, **kw)


class AttachCommand(click.Command):
    """A command whose parameters are its own plus those of every registered probe (in registry order).

    They are assembled on first use and again whenever the registry changes; ``--help`` lists the
    command's own options first, then one section per probe headed by its ``title``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._own: list[click.Parameter] = []
        self._assembled: list[click.Parameter] = []
        self._sections: list[tuple[str, list[click.Parameter]]] = []
        self._for: tuple[int, ...] | None = None
        super().__init__(*args, **kwargs)

    @property
    def params(self) -> list[click.Parameter]:
        specs = probe_specs()
        if self._for != tuple(map(id, specs)):
            self._assemble(specs)
        return self._assembled

    @params.setter
    def params(self, value: list[click.Parameter]) -> None:
        self._own = list(value)
        self._for = None

    def _assemble(self, specs: tuple[ProbeSpec, ...]) -> None:
        owner = {name: "attach" for p in self._own for name in (*p.opts, *p.secondary_opts, p.name or "")}
        sections: list[tuple[str, list[click.Parameter]]] = []
        for spec in specs:
            params: list[click.Parameter] = [click_option(opt) for opt in spec.options]
            for p in params:
                for name in (*p.opts, *p.secondary_opts, p.name or ""):
                    if name in owner:
                        raise ValueError(f"probe {spec.name!r}: option {name} is already {owner[name]}'s")
                    owner[name] = f"probe {spec.name!r}"
            sections.append((spec.title, params))
        self._sections = sections
        self._assembled = [*self._own, *(p for _, ps in sections for p in ps)]
        self._for = tuple(map(id, specs))

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        params = self.get_params(ctx)  # assembles; its last one is --help
        probe_params = {id(p) for _, ps in self._sections for p in ps}
        groups = [("Options", [p for p in params if id(p) not in probe_params]), *self._sections]
        rows = [(title, [rv for p in ps if (rv := p.get_help_record(ctx)) is not None]) for title, ps in groups]
        # pad the option column to one width so that every section lines up with the others
        width = min(HELP_COL_MAX, max((len(r[0]) for _, rs in rows for r in rs), default=0))
        for title, rs in rows:
            if rs:
                with formatter.section(title):
                    formatter.write_dl([(name.ljust(width), text) for name, text in rs], col_max=HELP_COL_MAX)


@click.command(cls=AttachCommand, context_settings=settings())
@click.option("--config", type=click.Path(path_type=Path), metavar="FILE", is_eager=True, callback=load_config,
              help="Read attach options from this YAML file (each by its long name, e.g. input-tokens: 512; "
                   "api_key: the key itself, never stored); an option on the command line overrides the file's.")
@click.option("--print-config", is_flag=True,
              help="Write the current options (command line over --config) as a config file to stdout; run nothing.")
@click.option("--url", help="Server base URL, e.g. http://127.0.0.1:8000 (no /v1).")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Bundle directory (default: ./diagnose-<time>).")
@click.option("--force", is_flag=True, help="Replace the output directory if it exists.")
@click.option("--api-key-env", metavar="VAR", help="Read the API key from this environment variable "
              "(default: OPENAI_API_KEY when set). The key is never written to disk.")
@click.option("--model", help="Model name (default: the first model of /v1/models).")
@click.option("--duration", "-d", help="Per load level (e.g. 30s, 2m). Default 30s unless --num-requests.")
@click.option("--slo", help="Service-level objective, e.g. ttft_p99=500ms,itl_p99=50ms (goodput and judgements use "
              "it); every value needs its unit (ms, s, m, h).")
@click.option("--observe", is_flag=True, help="Send no requests: only observe a server carrying real traffic.")
@click.option("--store-text", is_flag=True, help="Store prompt and output text in the bundle (off by default).")
@click.option("--realtime", is_flag=True,
              help="Run the load client's event loop at real-time priority (SCHED_RR 1; needs root or "
                   "CAP_SYS_NICE), so a CPU-bound engine on the same machine cannot starve it and invalidate the "
                   "run. Threads and processes the capture starts inherit it (like chrt -r 1). If not permitted, "
                   "the capture runs at normal priority and the bundle says so.")
@click.option("--overhead-budget", default="1%", show_default=True, metavar="SHARE",
              help="Keep what the probes cost the server under this share of one core (e.g. 0.5%, or off): the "
                   "Prometheus interval and py-spy's rate grow coarser when needed, and the report says so "
                   "and states the measured cost (docs/probe-cost.md).")
@click.option("--cost-per-hour", "cost_per_hour", metavar="PRICE[xDEVICES]",
              help="Price of an hour of the deployment (or per device-hour x devices, e.g. 4.1x8), recorded in the "
                   "bundle: the report prices the run per million output tokens, per request and per request "
                   "within the SLO, and compare uses it (docs/workload.md).")
@click.option("--report", type=click.Path(path_type=Path), help="Also analyse the bundle into this HTML report.")
@click.option("--prometheus", metavar="URL", help="Diagnose a fleet instead of one server: read every replica's "
              "engine metrics from this Prometheus query API (Prometheus, Thanos, Mimir; docs/fleet.md). No --url.")
@click.option("--selector", metavar="'{job=\"vllm\"}'", help="With --prometheus: the label matchers that pick "
              "the fleet's series (default: every series with engine metrics).")
@click.option("--since", metavar="DURATION", help="With --prometheus: how far back to read (default 1h). With "
              "--observe the fleet is watched from now for --duration instead.")
@click.option("--find-max-goodput", is_flag=True,
              help="Search the load (the -c or -r ladder, default -c 1:256:x2) for the highest level that "
                   "meets --slo and for saturation: one capture per level under -o/levels/, then bisection; writes "
                   "search.json and report.html (docs/compare.md).")
@click.option("--search-steps", type=int, default=4, show_default=True,
              help="With --find-max-goodput: at most this many bisection levels after the ladder.")
@click.option("--launch", metavar="COMMAND",
              help="Start the server with this command line first (diagnose owns it: stopped after the capture), "
                   "e.g. \"vllm serve MODEL --port 8000 --max-num-seqs 2\"; --url is where it answers.")
@click.option("--verify", is_flag=True,
              help="With --launch: diagnose, then run the top finding's experiment (the server restarted with "
                   "the one flag changed, the same workload) and verify it: confirmed (0), refuted (7), "
                   "inconclusive (8); -o gets before/, after/, verify.json and report.html (docs/compare.md).")
def attach(**o: Any) -> None:
    """Capture evidence from a live server: load + metrics (+ spans, host stacks, GPU counters, profiler)."""
    from diagnose.probes.load_options import check_options

    check_options(o)  # --duration, --slo, --speed, --loop, --max-concurrency: one line, before anything runs
    ctx = click.get_current_context()
    if o["print_config"]:
        print_config(ctx)
        return
    if config_api_key(ctx) is not None and (o["launch"] or o["verify"] or o["find_max_goodput"] or o["prometheus"]):
        raise InputError(f"--config {o['config']}: api_key works for a capture with --url; with --launch, --verify, "
                         "--find-max-goodput or --prometheus give api_key_env (an environment variable's name)")
    if o["launch"] or o["verify"]:
        from diagnose.cli.attach_launch import launched

        launched(o)
        return
    if o["find_max_goodput"]:
        from diagnose.runs.goodput_search import run_search

        if not o["url"]:
            raise click.UsageError("Missing option '--url'.")
        raise click.exceptions.Exit(run_search(o, click.get_current_context(), parse_slo(o["slo"]),
                                               lambda msg: click.echo(msg, err=True)))
    if o["prometheus"]:
        from diagnose.fleet.attach import attach_fleet

        raise click.exceptions.Exit(attach_fleet(o))
    if not o["url"]:
        raise click.UsageError("Missing option '--url' (or --prometheus URL to diagnose a fleet).")
    from diagnose.cli.attach_capture import capture

    capture(o)
