"""`diagnose attach --url URL`: the capture mode (one server under load, or observed with --observe): the
target checked, the probes the options enable built, the capture run into a bundle, optionally analysed.
The one probe named here is the load probe: attach builds its workload first (the manifest records it, and
the target must then have a model) and notes --realtime in its status."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click

from diagnose.capture.overhead import parse_budget
from diagnose.capture.realtime import RealtimePriority
from diagnose.capture.redact import Redactor, safe_url, url_secrets
from diagnose.capture.workload import WorkloadSpec, parse_duration, parse_slo
from diagnose.cli.attach_config import config_api_key, resolved_options
from diagnose.errors import InputError
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus
from diagnose.probes import probe_specs
from diagnose.probes.base import Options, Probe, ProbeSetup, Target
from diagnose.signals.cost import parse_price

T = TypeVar("T")
FD_MARGIN = 128  # files besides the load's connections: streams, probes' pipes and sockets, the interpreter's


def _run_loop(main: Coroutine[Any, Any, T]) -> T:
    """``main`` on a uvloop event loop of its own (asyncio's where uvloop is missing), leaving the process's event
    loop policy as it was. attach also runs inside other programs (diagnose.api.capture): installing uvloop's
    policy, as it did, made every later loop of that process a uvloop one (whose timers wake up to 1 ms early: a
    readiness ramp run after a capture in the same process sent requests before their time)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        return asyncio.run(main)
    return uvloop.run(main)


def _api_key(api_key_env: str | None, from_config: str | None = None) -> str | None:
    """The API key: from --api-key-env's variable, else the config file's api_key, else OPENAI_API_KEY."""
    if from_config is not None and not api_key_env:
        return from_config
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


def capture(o: Options) -> None:
    """The capture mode, once attach has checked the options and that --url is given."""
    parse_budget(o["overhead_budget"])  # a bad value fails here, before anything is set up or connects
    if o["cost_per_hour"] is not None:
        parse_price(o["cost_per_hour"])
    url, basic_auth = _split_url(str(o["url"]))
    ctx = click.get_current_context(silent=True)
    target = Target(url=url, api_key=_api_key(o["api_key_env"], config_api_key(ctx)), basic_auth=basic_auth)
    slo = parse_slo(o["slo"])
    workload: WorkloadSpec | None = None
    if not o["observe"]:
        from diagnose.probes.load import workload_from_options

        workload = workload_from_options(o)
    probes = build_probes(o, ProbeSetup(target=target, workload=workload))  # bad values fail here, unconnected
    out = o["output"] or Path(time.strftime("diagnose-%Y%m%d-%H%M%S"))
    # set on this thread before the loop starts, so every thread and process the capture starts inherits it
    rt = RealtimePriority() if o["realtime"] else None
    if rt is not None:
        rt.apply()
    try:
        code = _run_loop(_attach(target, workload, probes, out, o, slo, rt))
    finally:
        if rt is not None:
            rt.restore()
    if code:
        raise click.exceptions.Exit(code)


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
    # every attach option's value (the config file's and the command line's; never the API key)
    options.update(resolved_options(click.get_current_context(silent=True)))
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
        from diagnose.cli.analyze import run_analysis
        from diagnose.reports.document import verdict_line
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
