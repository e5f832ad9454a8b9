"""Run the readiness checks against one server and write the output folder (readiness.json, readiness.html and,
with ``--launch``, the server's log). The folder is also a capture bundle (docs/bundle-format.md) that ``diagnose
analyze`` opens: every request the checks send, recorded as it ends, one phase per check, per part of the
overload check and per step of its ramp (diagnose/readiness/record.py); readiness.json, readiness.html and the
server logs are its artifacts.

Order: with ``--launch`` the server is started by diagnose and the cold-start check runs first (it needs the
server fresh), then the cancellation check and the overload check (last: on a server that queues everything it
leaves a backlog) on the same server, which is then stopped (always). Without it the checks run against the
server at ``--url`` and neither the cold-start check nor the failure check (which kills the launched server and
starts it again, last) is run. ``--checks`` names the ones to run.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose.errors import InputError
from diagnose.io.writer import BundleWriter
from diagnose.readiness import card, record
from diagnose.readiness.cancel import CancelPlan
from diagnose.readiness.coldstart import ColdPlan
from diagnose.readiness.failure import FailurePlan
from diagnose.readiness.overload import OverloadPlan
from diagnose.readiness.target import Target

if TYPE_CHECKING:
    from diagnose.runs.experiment import Launched

JSON_NAME = "readiness.json"
HTML_NAME = "readiness.html"
LOG_NAME = "server.log"
CHECKS = ("cancellation", "cold-start", "overload", "failure")
RUN_ORDER = ("cold-start", "cancellation", "overload", "failure")  # the order they run in
RESTART_LOG_NAME = "server-restart.log"


@dataclass(frozen=True)
class Request:
    url: str
    output: Path
    launch: str | None = None
    slo: Mapping[str, float] = field(default_factory=dict)
    thresholds: Mapping[str, float] = field(default_factory=dict)
    cancel: CancelPlan = CancelPlan()
    cold: ColdPlan = ColdPlan()
    overload: OverloadPlan = OverloadPlan()
    failure: FailurePlan = FailurePlan()
    checks: frozenset[str] = frozenset(CHECKS)
    force: bool = False


def check_output(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(f"-o {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise InputError(f"-o {out}: the folder is not empty (use --force to write into it)")


@dataclass
class _Server:
    """The launched server: started, killed and started again by the failure check, stopped at the end
    (``current``: the one running)."""

    argv: Sequence[str]
    url: str
    out: Path
    startup_timeout_s: float
    log: Callable[[str], None]
    current: Launched | None = None

    def start(self, log_name: str = LOG_NAME) -> float:
        """Start the command; the seconds from its start to healthy."""
        from diagnose.readiness import coldstart

        self.current, since = coldstart.start(self.argv, self.url, self.out / log_name, self.startup_timeout_s,
                                              self.log)
        return since

    def restart(self) -> float:
        return self.start(RESTART_LOG_NAME)

    def crash(self) -> None:
        if self.current is not None:
            self._left(self.current.crash())

    def stop(self) -> None:
        if self.current is not None:
            self._left(self.current.stop())

    def _left(self, pids: list[int]) -> None:
        if pids:
            self.log(f"warning: server processes still running after SIGKILL: {', '.join(map(str, pids))}")


async def _checks(req: Request, target: Target, log: Callable[[str], None],
                  healthy: tuple[float, float] | None, server: _Server | None,
                  bundle: list[BundleWriter]) -> dict[str, Mapping[str, Any] | None]:
    """Run the checks; the bundle, once the server answered, is put into ``bundle`` (for :func:`run` to finish,
    whatever happens)."""
    from diagnose.readiness import cancel, coldstart, failure, overload

    try:
        await target.connect()
        neg = await target.negotiate()
        if not neg.ok:
            from diagnose.errors import TargetError
            from diagnose.readiness import target as tg

            raise TargetError(f"{req.url}/v1/completions: a streamed request failed ({tg.failure(neg)})")
        bundle.append(_open_bundle(req, target))
        target.recorder = record.Recorder(bundle[0])
        target.recorder.start_monitor()
        got: dict[str, Mapping[str, Any] | None] = {name: None for name in CHECKS}
        if healthy is not None and "cold-start" in req.checks:  # first: it needs the server fresh
            log("cold start: timing the first requests")
            got["cold-start"] = await coldstart.measure(target, req.cold, *healthy)
        if "cancellation" in req.checks:
            log(f"cancellation: {req.cancel.streams} streams, in-flight state from {target.source or 'nowhere'}")
            got["cancellation"] = await cancel.run(target, req.cancel, req.thresholds[card.RELEASE], log)
        if "overload" in req.checks:  # it leaves a backlog behind on a server that queues everything
            got["overload"] = await overload.run(target, req.overload, req.thresholds[card.RECOVERED_RATIO], log)
        if "failure" in req.checks and server is not None:  # last: it kills the server and starts another
            log(f"failure: {req.failure.workers} clients for {req.failure.before_s:g} s, then a crash and a restart")
            got["failure"] = await failure.run(target, req.failure, server.crash, server.restart, log)
        return got
    finally:
        await target.recorder.stop_monitor()
        target.recorder.close_phases()
        if bundle:
            bundle[0].set_probe_status(target.recorder.status(target.model, target.options))
        await target.close()


def _open_bundle(req: Request, target: Target) -> BundleWriter:
    """The capture bundle in the output folder, its manifest saying what the run asked for."""
    from dataclasses import asdict

    plans: dict[str, Any] = {"cancellation": asdict(req.cancel), "cold-start": asdict(req.cold),
                             "overload": asdict(req.overload), "failure": asdict(req.failure)}
    workload = {"mode": "readiness", "api": "completions", "checks": [c for c in RUN_ORDER if c in req.checks],
                "ignore_eos": bool(target.options.get("ignore_eos")), "launch": req.launch,
                "plans": {k: v for k, v in plans.items() if k in req.checks}}
    options = {"slo": dict(req.slo), "store_text": False, "observe": False, "thresholds": dict(req.thresholds)}
    return record.open_bundle(req.output, url=req.url, engine=target.engine, model=target.model,
                              source=target.source, workload=workload, options=options, force=req.force)


def run(req: Request, log: Callable[[str], None] = lambda _m: None) -> dict[str, object]:
    """Run every check that applies and write the folder; returns the readiness document."""
    from diagnose.runs import experiment as er

    check_output(req.output, req.force)
    req.cancel.check()
    req.overload.check()
    req.failure.check()
    url = er.check_url(req.url)
    server: _Server | None = None
    healthy: tuple[float, float] | None = None
    if req.launch:
        argv = er.split_launch(req.launch)
        er.refuse_running(url)
        req.output.mkdir(parents=True, exist_ok=True)
        server = _Server(argv, url, req.output, req.cold.startup_timeout_s, log)
        since = server.start()
        healthy = (since, time.monotonic())
        log(f"healthy {since:.2f} s after the start")
    bundle: list[BundleWriter] = []
    try:
        try:
            target = Target(url)
            got = asyncio.run(_checks(req, target, log, healthy, server, bundle))
            info = {"model": target.model, "engine": target.engine, "in_flight_source": target.source}
        finally:
            if server is not None:
                server.stop()
        doc = card.document(url, req.launch, req.slo, req.thresholds, got["cancellation"], got["cold-start"], info,
                            got["overload"], asked=req.checks, fail=got["failure"])
        write(req.output, doc)
    except BaseException as e:
        if bundle:  # what was recorded stays, marked partial with why
            bundle[0].finish(interrupted=_why(e))
        raise
    if bundle:
        _artifacts(bundle[0], doc)
        bundle[0].finish()
    return doc


def _why(e: BaseException) -> str:
    if isinstance(e, KeyboardInterrupt):
        return "interrupted by SIGINT"
    return f"readiness stopped: {str(e).splitlines()[0][:300] if str(e) else type(e).__name__}"


def _artifacts(bundle: BundleWriter, doc: Mapping[str, Any]) -> None:
    """The card, its page and the server logs as the bundle's artifacts (in the folder itself, not artifacts/:
    where they always were); the readiness checks' verdict as a probe status beside the load's."""
    from diagnose.model import ProbeStatus

    what = {JSON_NAME: ("readiness_card", "the readiness card and every measurement behind it (docs/readiness.md)"),
            HTML_NAME: ("readiness_page", "the readiness card as one self-contained page"),
            LOG_NAME: ("server_log", "the launched server's output"),
            RESTART_LOG_NAME: ("server_log", "the output of the server started again by the failure check")}
    entries = {name: {"file": name, "kind": kind, "description": desc, "bytes": (bundle.path / name).stat().st_size}
               for name, (kind, desc) in what.items() if (bundle.path / name).is_file()}
    bundle.update("artifacts", entries)
    checks = {str(c.get("id")): str(c.get("status")) for c in doc.get("checks", []) if isinstance(c, Mapping)}
    bundle.set_probe_status(ProbeStatus("readiness", "ok", str(doc.get("verdict", "")),
                                        {"checks": checks, "failed": list(doc.get("failed") or [])}))


def write(out: Path, doc: Mapping[str, object]) -> None:
    from diagnose.io import schemas
    from diagnose.io.outputs import write_bytes
    from diagnose.reports.render import Page, render_page

    write_bytes(out / JSON_NAME, schemas.dumps(doc, _opt()), parents=True)
    html = render_page(Page("readiness.html", {"d": doc}))  # numbers through the environment's fmt
    write_bytes(out / HTML_NAME, html.encode("utf-8"), parents=True)


def _opt() -> int:
    import orjson

    return orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS


MAX_DOC_BYTES = 64 * 1024 * 1024  # a readiness.json is ~0.1-1 MB (2,000 in-flight samples at most per check)


def read_doc(path: Path) -> dict[str, Any]:
    """The readiness.json in ``path`` (a folder or the file), as ``run`` wrote it; one-line InputError for
    anything else (missing, not a regular file, too big, not JSON, not a readiness document)."""
    import orjson

    from diagnose.io.bundle import read_input

    p = path / JSON_NAME if path.is_dir() else path
    try:
        raw = read_input(p, MAX_DOC_BYTES, f"larger than {MAX_DOC_BYTES >> 20} MiB: not a readiness document")
    except FileNotFoundError:
        raise InputError(f"{p}: no such file (give a folder written by diagnose readiness, or its "
                         f"{JSON_NAME})") from None
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InputError(f"{p}: not valid JSON ({e})") from None
    from diagnose.io import schemas

    if not isinstance(doc, dict) or not isinstance(doc.get("measurements"), dict) or not isinstance(
            doc.get("checks"), list):
        raise InputError(f"{p}: not a readiness document (no measurements and checks)")
    if doc.get("schema_version") != schemas.READINESS:
        raise InputError(f"{p}: readiness schema_version {doc.get('schema_version')!r}; this diagnose reads "
                         f"{schemas.READINESS}")
    return doc


def rejudge(src: Path, out: Path, overrides: Mapping[str, float], slo: Mapping[str, float] | None,
            force: bool) -> dict[str, object]:
    """The card of a readiness run judged again from its own measurements: the thresholds it recorded with
    ``overrides`` applied, its SLO unless ``slo`` is given; written to ``out`` (never into ``src``)."""
    doc = read_doc(src)
    folder = (src if src.is_dir() else src.parent).resolve()
    o = out.resolve()
    if o == folder or folder in o.parents:
        raise InputError(f"-o {out}: inside the readiness folder being judged ({src}); write elsewhere")
    check_output(out, force)
    m = doc["measurements"]
    recorded = doc.get("thresholds")
    thr = card_thresholds(recorded if isinstance(recorded, dict) else {}, overrides)
    # the checks asked for: recorded since readiness.json has 'asked'; in an earlier file, those it measured,
    # and the cold-start and failure checks unless their "not run" summary says they were not asked for
    rec = doc.get("asked")
    asked = ({str(x) for x in rec} if isinstance(rec, list) else
             {name for key, name in (("cancellation", "cancellation"), ("overload", "overload"))
              if isinstance(m.get(key), dict)}
             | {name for rid, name in (("RDY002", "cold-start"), ("RDY004", "failure"))
                if not any(isinstance(c, dict) and c.get("id") == rid and c.get("summary") == card.NOT_ASKED
                           for c in doc["checks"])})

    def part(key: str) -> Mapping[str, Any] | None:
        v = m.get(key)
        return v if isinstance(v, dict) else None

    t = doc.get("target")
    target: Mapping[str, Any] = t if isinstance(t, dict) else {}
    launch = doc.get("launch") if isinstance(doc.get("launch"), str) else None
    again = card.document(str(doc.get("url", "")), launch, slo if slo is not None else dict(doc.get("slo") or {}),
                          thr, part("cancellation"), part("cold_start"), target, part("overload"), asked=asked,
                          fail=part("failure"))
    write(out, again)
    return again


def card_thresholds(recorded: Mapping[str, Any], overrides: Mapping[str, float]) -> dict[str, float]:
    """The card's thresholds: the numbers a run recorded (today's rules/thresholds.yaml for any it lacks), with
    ``overrides`` (checked by name, as ``--threshold`` everywhere) on top."""
    from diagnose.rules.spec import load_thresholds

    today = load_thresholds(overrides=dict(overrides))
    thr = {k: float(today[k]) for k in card.THRESHOLDS}
    for k in card.THRESHOLDS:
        v = recorded.get(k)
        if k not in overrides and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            thr[k] = float(v)
    return thr
