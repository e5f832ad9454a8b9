"""``diagnose attach --prometheus URL [--selector S] [--since 1h | --observe --duration D]``: a fleet capture.

History (default): the last ``--since`` of every replica the selector finds. ``--observe``: watch the fleet
from now for ``--duration`` (default 30 s), sending nothing, then read that window. Either way the bundle
holds only what the query API gave (docs/fleet.md).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import click

from diagnose.capture.workload import parse_duration
from diagnose.errors import DiagnoseError, InputError
from diagnose.fleet.capture import DETAIL_MAX, FleetWindow, capture_fleet
from diagnose.fleet.queries import selector_matchers
from diagnose.io.writer import BundleWriter, utc_iso
from diagnose.probes.prometheus_api import PrometheusAPI

DEFAULT_SINCE_S = 3600.0
DEFAULT_OBSERVE_S = 30.0


def attach_fleet(o: dict[str, Any]) -> int:
    """Run the fleet capture for the attach options ``o``; returns the exit code."""
    if o.get("url"):
        raise InputError("--prometheus reads the fleet from Prometheus: leave out --url (no load is sent)")
    if o.get("observe") and o.get("since"):
        raise InputError("--since reads history; --observe watches from now for --duration: give one of them")
    if o.get("duration") and not o.get("observe"):
        raise InputError("--duration with --prometheus needs --observe (watch from now); --since reads history")
    since = parse_duration(o["since"]) if o.get("since") else DEFAULT_SINCE_S
    if since <= 0:
        raise InputError(f"--since {o['since']!r}: must be more than 0 s")
    duration = (parse_duration(o["duration"]) if o.get("duration") else DEFAULT_OBSERVE_S) if o.get("observe") else None
    selector_matchers(o.get("selector"))  # a malformed selector fails here, before anything is asked
    api = PrometheusAPI(str(o["prometheus"]))  # checks the URL's shape
    out = o.get("output") or Path(time.strftime("diagnose-fleet-%Y%m%d-%H%M%S"))
    return asyncio.run(_run(api, o, since, duration, Path(out)))


async def _run(api: PrometheusAPI, o: dict[str, Any], since: float, duration: float | None, out: Path) -> int:
    def log(msg: str) -> None:  # redacted like the bundle: no credential of the URL reaches stderr
        click.echo(api.redactor.text(msg), err=True)

    async with api:
        await api.query("1", time.time())  # reachable and answering, before anything is written or waited for
        bundle = BundleWriter(out, overwrite=bool(o.get("force")), redactor=api.redactor,
                              options={"observe": True, "store_text": False, "slo": {}},
                              workload={"mode": "observe", "fleet": True},
                              target={"url": api.url, "kind": "fleet", "selector": o.get("selector") or ""})
        try:
            if duration is not None:
                start = time.time()
                log(f"observing the fleet at {api.url} for {duration:.0f} s (no requests are sent)")
                await asyncio.sleep(duration)
                win = FleetWindow(start, start + max(1, round(time.time() - start)))  # whole seconds: [40s]
            else:
                end = time.time()
                win = FleetWindow(end - since, end)
            st = await capture_fleet(api, o.get("selector"), win, bundle, detail_max=DETAIL_MAX, log=log)
        except DiagnoseError:
            shutil.rmtree(out, ignore_errors=True)  # nothing in it to analyse: the error says why
            raise
        except BaseException:
            bundle.finish(interrupted="interrupted before the fleet was read")
            raise
        bundle.update("target", {"engine": st.detail.get("engine", "unknown")})
        bundle.set_probe_status(st)
        bundle.finish()
        end_ns = int(win.end_s * 1e9)  # the capture's window is the one read from Prometheus
        bundle.update("capture", {"ended_unix_ns": end_ns, "ended_at": utc_iso(end_ns)})
    log(f"bundle: {out}")
    if o.get("report"):
        from diagnose.cli.analyze import run_analysis
        from diagnose.reports.document import verdict_line
        from diagnose.reports.render import write_report

        analysis = run_analysis(out)
        write_report(analysis, o["report"])
        log(f"{verdict_line(analysis)}\nreport: {o['report']}")
    return 0
