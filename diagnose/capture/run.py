"""Run a capture: check the target, detect the engine, start every probe, stop them cleanly.

The bundle is written as probes go; Ctrl-C / SIGTERM (or the target dying) ends the capture early with a
valid bundle marked partial. No stage prints except through the ``log`` callback the CLI passes in.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from diagnose.capture.redact import Redactor, excerpt
from diagnose.engines.detect import EngineInfo, detect_engine
from diagnose.errors import TargetError
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Probe, Target

STOP_GRACE_S = 45.0  # how long probes get to finish after the stop signal (profiler stop can be slow)


@dataclass
class CaptureResult:
    statuses: dict[str, ProbeStatus] = field(default_factory=dict)
    interrupted: str | None = None
    write_error: str | None = None  # the bundle could not be written (disk full): the capture failed
    target_gone: str | None = None  # the server stopped answering during the capture (when, how)

    @property
    def load_failed(self) -> bool:
        st = self.statuses.get("load")
        return st is not None and st.state == "failed"


async def check_target(target: Target, timeout_s: float = 10.0, *, need_model: bool = False) -> EngineInfo:
    """Fail fast, with one line, when the server cannot be reached or refuses us; detect the engine.

    ``need_model``: the capture sends load and no ``--model`` was given, so ``/v1/models`` must answer: an
    error status is reported as what it is (issue 12, defect 18), not as "lists no model"."""
    shown = target.safe_url
    models_url = target.endpoint("/v1/models")
    try:
        async with aiohttp.ClientSession() as session:
            try:
                async with session.get(models_url, headers=target.headers(),
                                       timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                    status = r.status
                    body = (await r.content.read(2048)).decode("utf-8", "replace") if status != 200 else ""
            except aiohttp.ClientConnectorError as e:
                raise TargetError(f"cannot reach {shown}: {_conn_reason(e)}") from e
            except asyncio.TimeoutError as e:
                raise TargetError(f"cannot reach {shown}: no answer within {timeout_s:.0f} s") from e
            except aiohttp.ClientError as e:
                raise TargetError(f"cannot talk to {shown}: {type(e).__name__}") from e
            if status in (401, 403):
                raise TargetError(f"{shown}/v1/models answered HTTP {status}: pass the API key with --api-key-env VAR")
            if status != 200 and need_model:
                said = excerpt(Redactor(target.secrets()).text(body), 120)
                raise TargetError(f"{shown}/v1/models answered HTTP {status}" + (f" ({said})" if said else "")
                                  + ": the server cannot list its models; fix the server or pass --model")
            info = await detect_engine(target.url, session, headers=target.headers())
    except ValueError as e:  # malformed URL
        raise TargetError(f"bad URL {shown!r}: {Redactor(target.secrets()).text(str(e))}") from e
    return info


def _conn_reason(e: aiohttp.ClientConnectorError) -> str:
    os_err = getattr(e, "os_error", None)
    if isinstance(os_err, ConnectionRefusedError):
        return "connection refused (is the server running and listening on that port?)"
    msg = getattr(os_err, "strerror", None) or str(os_err or e)
    return str(msg)


async def _run_probe(probe: Probe, ctx: CaptureContext) -> ProbeStatus:
    try:
        return await probe.run(ctx)
    except asyncio.CancelledError:
        return ProbeStatus(probe.name, "failed", "cancelled before it finished (capture interrupted)")
    except Exception as e:  # noqa: BLE001 - a probe bug must not lose the other probes' evidence
        return ProbeStatus(probe.name, "failed", f"{type(e).__name__}: {e}")


async def run_capture(bundle: BundleWriter, target: Target, probes: list[Probe], *,
                      duration_s: float | None = None, options: dict[str, Any] | None = None,
                      log: Callable[[str], None] = lambda _m: None) -> CaptureResult:
    """Run ``probes`` against ``target`` until the load probe sets stop, ``duration_s`` passes, or a signal.

    Every probe's final status lands in the manifest; the bundle is finished (complete or partial).
    """
    stop = asyncio.Event()
    ctx = CaptureContext(bundle=bundle, target=target, stop=stop, options=dict(options or {}))
    result = CaptureResult()
    loop = asyncio.get_running_loop()
    tasks: dict[str, asyncio.Task[ProbeStatus]] = {}
    hard_stop = asyncio.Event()

    def on_signal(signame: str) -> None:
        if result.interrupted is None:
            result.interrupted = f"interrupted by {signame}"
            log(f"{signame}: stopping probes and finishing the bundle (again to abort at once)")
            stop.set()
            lt = tasks.get("load")
            if lt is not None:
                lt.cancel()
        else:
            hard_stop.set()

    def on_write_error(msg: str) -> None:  # the first write error (disk full): stop, keep what fit
        if result.write_error is None:
            result.write_error = msg
            log("stopping the capture: the bundle cannot be written (every record that fit is kept)")
            stop.set()

    # a stream write fails on the load probe's I/O thread: hop to the loop
    def write_error_threadsafe(msg: str) -> None:
        loop.call_soon_threadsafe(on_write_error, msg)

    bundle.on_write_error = write_error_threadsafe
    if bundle.write_error is not None:
        on_write_error(bundle.write_error)
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, on_signal, sig.name)
            installed.append(sig)
    try:
        for probe in probes:
            applies = getattr(probe, "applies", None)
            if applies is not None and not applies(ctx):
                continue  # a probe for another engine (llama.cpp's /slots on vLLM): not run, not listed
            ok, why = probe.available(ctx)
            if not ok:
                st = ProbeStatus(probe.name, "unavailable", why)
                result.statuses[probe.name] = st
                bundle.set_probe_status(st)
                log(f"probe {probe.name}: unavailable: {why}")
                continue
            bundle.set_probe_status(ProbeStatus(probe.name, "running"))
            tasks[probe.name] = asyncio.create_task(_run_probe(probe, ctx), name=f"probe:{probe.name}")
        if "load" not in tasks:
            timer = duration_s if duration_s is not None else 30.0
            loop.call_later(timer, stop.set)
        elif duration_s is not None:
            # safety net: the load probe normally stops by itself
            loop.call_later(duration_s, stop.set)
        for name, t in list(tasks.items()):
            t.add_done_callback(functools.partial(_on_done, name, bundle=bundle, result=result, stop=stop))
        waiter = asyncio.create_task(stop.wait())
        hard = asyncio.create_task(hard_stop.wait())
        while not stop.is_set() and not hard_stop.is_set():
            running = [t for t in tasks.values() if not t.done()]
            if not running and "load" in tasks:
                break
            await asyncio.wait([waiter, hard, *running], return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        deadline = loop.time() + STOP_GRACE_S
        while not hard_stop.is_set():
            running = [t for t in tasks.values() if not t.done()]
            remaining = deadline - loop.time()
            if not running or remaining <= 0:
                break
            await asyncio.wait([hard, *running], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        leftovers = [t for t in tasks.values() if not t.done()]
        for t in leftovers:
            t.cancel()
        if leftovers:
            await asyncio.wait(leftovers, timeout=5)
        waiter.cancel()
        hard.cancel()
        for name, t in tasks.items():
            if name not in result.statuses:
                st = t.result() if t.done() and not t.cancelled() else ProbeStatus(
                    name, "failed", "did not stop within the grace period; cancelled")
                result.statuses[name] = st
                bundle.set_probe_status(st)
    finally:
        for sig in installed:
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        bundle.on_write_error = None
        gone = ctx.shared.get("target_gone")
        if gone and result.interrupted is None:
            result.target_gone = str(gone)
        bundle.finish(interrupted=result.interrupted or result.target_gone)
        result.write_error = result.write_error or bundle.write_error
    return result


def _on_done(name: str, task: asyncio.Task[ProbeStatus], *, bundle: BundleWriter, result: CaptureResult,
             stop: asyncio.Event) -> None:
    if task.cancelled():
        st = ProbeStatus(name, "failed", "cancelled (capture interrupted)")
    else:
        st = task.result()
    result.statuses[name] = st
    bundle.set_probe_status(st)
    if name == "load":
        stop.set()
