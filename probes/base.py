"""The small protocol every probe implements, and the context a capture hands to it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from diagnose.bundle import BundleWriter
from diagnose.model import ProbeStatus


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

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


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


@runtime_checkable
class Probe(Protocol):
    """One source of evidence.

    ``available`` answers cheaply whether the probe can run here (missing driver, binary, permission);
    ``run`` collects until ``ctx.stop`` is set, writing records through ``ctx.bundle`` as it goes, and
    returns its final status. It must never raise for an expected failure: it returns a failed status
    with the reason. The capture records a raised exception as a failed status too.
    """

    name: str

    def available(self, ctx: CaptureContext) -> tuple[bool, str]: ...

    async def run(self, ctx: CaptureContext) -> ProbeStatus: ...
