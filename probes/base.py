"""The small protocol every probe implements, the context a capture hands to it, and the spec by which a probe
brings its own options to ``diagnose attach``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from diagnose.capture.redact import join_url, safe_url, url_secrets
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus

if TYPE_CHECKING:
    from diagnose.capture.workload import WorkloadSpec


@dataclass
class Target:
    """The server under test, as far as the capture knows it."""

    url: str  # base URL, e.g. http://127.0.0.1:8000 (no trailing slash, no /v1)
    api_key: str | None = None  # never written to disk
    engine: str = "unknown"  # vllm | sglang | tgi | llamacpp | unknown
    engine_version: str | None = None
    model: str | None = None
    pid: int | None = None  # server PID when known (host-stack probe)
    extra: dict[str, Any] = field(default_factory=dict)

    basic_auth: str | None = None  # "user:password" from the URL's userinfo (never written to disk)

    def headers(self) -> dict[str, str]:
        if self.api_key:
            return {"Authorization": f"Bearer {self.api_key}"}
        if self.basic_auth:
            return {"Authorization": "Basic " + base64.b64encode(self.basic_auth.encode()).decode("ascii")}
        return {}

    def endpoint(self, path: str) -> str:
        """The URL of ``path`` on this server (the base URL's own query string kept, not mangled)."""
        return join_url(self.url, path)

    @property
    def safe_url(self) -> str:
        """The base URL as it may be shown or stored: no credentials, no secret query values."""
        return safe_url(self.url)

    def secrets(self) -> list[str]:
        """Every secret this target carries (the redactor's list)."""
        return [x for x in (self.api_key, self.basic_auth, *url_secrets(self.url), *self.headers().values()) if x]


@dataclass
class CaptureContext:
    """Shared by all probes of one capture.

    ``stop`` is set when the capture should end (workload done, duration reached, Ctrl-C). Probes stamp
    their samples with ``now_ns()`` (CLOCK_MONOTONIC, system-wide on Linux) so every stream shares one
    time base; the manifest holds the anchor that maps it to wall-clock time.
    """

    bundle: BundleWriter
    target: Target
    stop: asyncio.Event
    options: dict[str, Any] = field(default_factory=dict)
    # phases: the load probe appends {"phase": i, "name": ..., "start_ns": ..., "end_ns": ...}
    shared: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def now_ns() -> int:
        return time.monotonic_ns()

    def rel_s(self, mono_ns: int) -> float:
        return self.bundle.mono_to_rel_s(mono_ns)


async def wait_tick(stop: asyncio.Event, next_t: float, interval: float) -> float:
    """Wait for the next sampling tick, ``interval`` s after ``next_t`` (``time.monotonic()`` seconds), or until
    ``stop`` is set; returns that tick. A sample that overran its ticks skips them instead of bursting."""
    next_t += interval
    now = time.monotonic()
    if next_t < now:
        next_t += math.ceil((now - next_t) / interval) * interval
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=max(0.0, next_t - time.monotonic()))
    return next_t


@runtime_checkable
class Probe(Protocol):
    """One source of evidence.

    ``available`` answers cheaply whether the probe can run here (missing driver, binary, permission);
    a probe may also define ``applies(ctx) -> bool``: False (a probe of another engine's endpoint) leaves it
    out of the capture without a status;
    ``run`` collects until ``ctx.stop`` is set, writing records through ``ctx.bundle`` as it goes, and
    returns its final status. It must never raise for an expected failure: it returns a failed status
    with the reason. The capture records a raised exception as a failed status too.
    """

    name: str

    def available(self, ctx: CaptureContext) -> tuple[bool, str]: ...

    async def run(self, ctx: CaptureContext) -> ProbeStatus: ...


# -- how a probe joins `diagnose attach` ------------------------------------------------------------------
Options = Mapping[str, Any]
"""Every option of one ``diagnose attach`` run, by parameter name (``--pyspy-rate`` is ``pyspy_rate``)."""


@dataclass(frozen=True)
class ProbeOption:
    """One command-line option a probe declares; ``attach`` turns it into a click option.

    ``flag`` is an on/off switch: ``--pyspy`` (off unless given) or a ``--nvml/--no-nvml`` pair with its
    ``default`` (None for a pair: neither given). Otherwise the option takes a value of ``type`` (str, int,
    float or Path), one of ``choices`` when given. ``short`` is a one-letter alias such as ``-c``.
    """

    name: str
    help: str | None = None
    type: type[Any] = str
    default: Any = None
    flag: bool = False
    choices: tuple[str, ...] = ()
    short: str | None = None
    metavar: str | None = None
    show_default: bool = False

    @property
    def key(self) -> str:
        """The name its value has in :data:`Options`."""
        return self.name.split("/")[0].lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class ProbeSetup:
    """What ``attach`` knows when it builds the probes, before it connects: the target as given and the
    workload (None with ``--observe``: no load is sent)."""

    target: Target
    workload: WorkloadSpec | None = None


@dataclass(frozen=True, kw_only=True)
class ProbeSpec:
    """A probe's entry in ``diagnose attach``: its options, when it runs, and how it is made from them.

    ``enabled(opts)`` says whether this run wants the probe; ``build(opts, setup)`` makes it, raising
    ``InputError`` (one line naming the option) for a value it cannot use. ``record(opts)`` adds entries
    to the manifest's ``options`` (every run, enabled or not). ``title`` heads the probe's options in
    ``attach --help``. Register it in ``diagnose.probes.PROBE_MODULES`` (or ``register`` it).
    """

    name: str
    title: str
    options: tuple[ProbeOption, ...] = ()
    enabled: Callable[[Options], bool]
    build: Callable[[Options, ProbeSetup], Probe]
    record: Callable[[Options], dict[str, Any]] | None = None
