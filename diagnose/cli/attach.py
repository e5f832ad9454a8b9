"""`diagnose attach`: capture evidence from a live OpenAI-compatible server into a bundle.

The options are the capture's own (declared below: target, output, duration, SLO, ...) plus every probe's:
each probe module declares its options, when it runs and how it is built in its ``SPEC``
(``diagnose.probes.PROBE_MODULES`` lists them). ``AttachCommand`` adds the probes' options when click first
asks for the command's parameters, not at import, so ``diagnose --help`` loads no probe; ``attach --help``
shows them in one section per probe. The one probe named here is the load probe: attach builds its workload
first (the manifest records it, and the target must then have a model) and notes --realtime in its status.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import click

from diagnose.capture.overhead import parse_budget
from diagnose.capture.realtime import RealtimePriority
from diagnose.capture.redact import Redactor, safe_url, url_secrets
from diagnose.capture.workload import WorkloadSpec, parse_duration, parse_slo
from diagnose.errors import InputError
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus
from diagnose.probes import probe_specs
from diagnose.probes.base import Options, Probe, ProbeOption, ProbeSetup, ProbeSpec, Target
from diagnose.signals.cost import parse_price

HELP_COL_MAX = 30  # click's default: the option column of every help section is this wide
FD_MARGIN = 128  # files besides the load's connections: streams, probes' pipes and sockets, the interpreter's


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


def _event_loop_policy() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        pass


def _api_key(api_key_env: str | None) -> str | None:
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise InputError(f"--api-key-env {api_key_env}: that environment variable is not set")
        return key
    return os.environ.get("OPENAI_API_KEY") or None


def _split_url(given: str) -> tuple[str, str | None]:
    """(base URL without credentials and without a trailing /v1, "user:password" or None).

    Credentials in the URL become a Basic ``Authorization`` header and are never stored (issue 12, defect 2);
    the URL's query string is kept as it is for every endpoint (``Target.endpoint``)."""
    from yarl import URL

    shown = safe_url(given)
    if not given.startswith(("http://", "https://")):
        raise InputError(f"--url {shown!r}: expected http://HOST:PORT")
    try:
        u = URL(given)
        host = u.host
    except (ValueError, TypeError) as e:
        raise InputError(f"--url {shown!r}: not a URL ({Redactor(url_secrets(given)).text(str(e))})") from None
    if not host:
        raise InputError(f"--url {shown!r}: expected http://HOST:PORT")
    auth = None
    if u.user is not None or u.password is not None:
        auth = f"{u.user or ''}:{u.password or ''}"
        u = u.with_user(None)
    path = u.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    base = str(u.with_path(path or "/").with_query(None)).rstrip("/")
    return (f"{base}?{u.raw_query_string}" if u.raw_query_string else base), auth


def fd_limit_check(needed: int) -> str | None:
    """Makes sure this process may open ``needed`` files (the load client's connections and the bundle's
    files): raises the soft RLIMIT_NOFILE up to the hard limit when that is enough, and returns a note saying
    so; raises InputError when even the hard limit is too low (issue 12, defect 12: running out of file
    descriptors is the client's own limit, never the server's)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    if hard == resource.RLIM_INFINITY or hard >= needed:
        new = needed if hard == resource.RLIM_INFINITY else min(hard, max(needed, 4096))
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError) as e:
            raise InputError(f"this run needs {needed} open files but this process may open {soft} "
                             f"(ulimit -n) and raising it failed ({e}): run `ulimit -n {needed}` first") from None
        return f"raised this process's open-file limit from {soft} to {new} (ulimit -n) for {needed} files"
    raise InputError(f"this run needs up to {needed} open files (one connection per request in flight, plus the "
                     f"bundle's) but this process may open only {soft} (ulimit -n; hard limit {hard}): that is "
                     f"diagnose's own limit, not the server's; raise it (ulimit -n {needed}) or lower --concurrency")


def _files_needed(workload: WorkloadSpec | None) -> int | None:
    """Open files the load probe may need at once (None: not bounded, an open loop without a cap)."""
    if workload is None:
        return FD_MARGIN
    most = 0
    for ph in workload.phases:
        c = ph.concurrency if ph.rate is None else ph.max_concurrency
        if c is None:
            return None
        most = max(most, int(c))
    return most + FD_MARGIN


@click.command(cls=AttachCommand)
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
    if o["launch"] or o["verify"]:
        _launched(o)
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
    parse_budget(o["overhead_budget"])  # a bad value fails here, before anything is set up or connects
    if o["cost_per_hour"] is not None:
        parse_price(o["cost_per_hour"])
    url, basic_auth = _split_url(str(o["url"]))
    target = Target(url=url, api_key=_api_key(o["api_key_env"]), basic_auth=basic_auth)
    slo = parse_slo(o["slo"])
    workload: WorkloadSpec | None = None
    if not o["observe"]:
        from diagnose.probes.load import workload_from_options

        workload = workload_from_options(o)
    probes = build_probes(o, ProbeSetup(target=target, workload=workload))  # bad values fail here, unconnected
    _event_loop_policy()  # after every check: a refused option leaves the process's asyncio policy as it was
    out = o["output"] or Path(time.strftime("diagnose-%Y%m%d-%H%M%S"))
    # set on this thread before the loop starts, so every thread and process the capture starts inherits it
    rt = RealtimePriority() if o["realtime"] else None
    if rt is not None:
        rt.apply()
    try:
        code = asyncio.run(_attach(target, workload, probes, out, o, slo, rt))
    finally:
        if rt is not None:
            rt.restore()
    if code:
        raise click.exceptions.Exit(code)


def _launched(o: Options) -> None:
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


async def _attach(target: Target, workload: WorkloadSpec | None, probes: list[Probe], out: Path, o: Options,
                  slo: dict[str, float], rt: RealtimePriority | None = None) -> int:
    from diagnose.capture.run import check_target, run_capture

    redactor = Redactor(target.secrets())

    def log(msg: str) -> None:  # every line on stderr is redacted like the bundle
        click.echo(redactor.text(msg), err=True)

    needed = _files_needed(workload)
    if needed is not None:
        note = fd_limit_check(needed)
        if note:
            log(f"note: {note}")
    info = await check_target(target, need_model=workload is not None and not workload.model)
    target.engine = info.name
    target.engine_version = info.version
    target.model = (workload.model if workload else None) or (info.models[0] if info.models else None)
    if workload is not None and target.model is None:
        raise InputError(f"{target.safe_url}/v1/models lists no model: pass --model")
    options: dict[str, Any] = {"slo": slo, "store_text": bool(o["store_text"]), "observe": bool(o["observe"]),
                               "overhead_budget": parse_budget(o["overhead_budget"])}
    if o["cost_per_hour"] is not None:
        options["cost_per_hour"] = parse_price(o["cost_per_hour"])
    for spec in probe_specs():
        if spec.record is not None:
            options.update(spec.record(o))
    if rt is not None:
        options["realtime"] = dict(rt.info)
        if not rt.info["applied"]:
            log(f"warning: {rt.info['reason']}")
    bundle = BundleWriter(out, overwrite=o["force"], options=options, redactor=redactor,
                          private=bool(o["store_text"]),
                          workload=workload.to_json() if workload else {"mode": "observe"},
                          target={"url": target.safe_url, "engine": info.name, "engine_version": info.version,
                                  "model": target.model, "models": list(info.models),
                                  "engine_evidence": list(info.evidence), "engine_config": info.config})
    duration = parse_duration(o["duration"]) if (o["observe"] and o["duration"]) else None
    if o["observe"] and duration is None:
        duration = 30.0
    log(f"capturing {info.name} {info.version or ''} at {target.safe_url} (model {target.model}) into {out}")
    result = await run_capture(bundle, target, probes, duration_s=duration, options=options, log=log)
    if rt is not None:
        rt.restore()  # the capture is over: the report below runs at normal priority
        _note_realtime(bundle, result.statuses, rt.info)
    for name, st in sorted(result.statuses.items()):
        detail = f": {st.reason}" if st.reason else ""
        log(f"  {name:12} {st.state}{detail}")
    log(f"bundle: {out}" + (" (partial)" if result.interrupted or result.write_error or result.target_gone else ""))
    if result.write_error:
        # the one line that says what failed and where; the manifest marks the capture failed with it
        log(f"diagnose: error: {result.write_error} (capture failed; the bundle keeps every record that fit)")
        return 1
    why = _failure(result.statuses, bool(o["observe"]))
    if why:
        log(f"capture failed: {why}")
    if o["report"]:
        from diagnose.cli.analyze import run_analysis, verdict_line
        from diagnose.reports.render import write_report

        analysis = run_analysis(out)
        write_report(analysis, o["report"])
        log(f"{verdict_line(analysis)}\nreport: {o['report']}")
    if result.interrupted:
        return 130
    if why:
        return 1
    return 0


def _failure(statuses: dict[str, ProbeStatus], observe: bool) -> str | None:
    """Why the capture failed, for its last stderr line: the load probe failed (every request failed, the
    server went away) or, with --observe, the server stopped answering its metrics endpoint."""
    st = statuses.get("load")
    if st is not None and st.state == "failed":
        return f"load: {st.reason}"
    if observe:
        pr = statuses.get("prometheus")
        if pr is not None and pr.detail.get("server_gone"):
            return f"prometheus: {pr.reason}"
    return None


def _note_realtime(bundle: BundleWriter, statuses: dict[str, ProbeStatus], info: dict[str, Any]) -> None:
    """The load probe's status says whether its loop ran at real-time priority (and why not)."""
    st = statuses.get("load")
    if st is None:
        return
    reason = st.reason if info["applied"] else "; ".join(x for x in (st.reason, str(info["reason"])) if x)
    st = ProbeStatus(st.name, st.state, reason, {**st.detail, "realtime": dict(info)})
    statuses["load"] = st
    bundle.set_probe_status(st)


def build_probes(o: Options, setup: ProbeSetup) -> list[Probe]:
    """Every registered probe these options enable, built from them, in registry order (the start order)."""
    return [spec.build(o, setup) for spec in probe_specs() if spec.enabled(o)]
