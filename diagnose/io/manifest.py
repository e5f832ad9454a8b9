"""The bundle manifest as typed, frozen records, read through a schema check.

:func:`read_manifest` turns the decoded ``manifest.json`` into a :class:`Manifest`; a field of the wrong type is a
:class:`~diagnose.errors.BundleError` naming the file and the field (one line, never a traceback). Fields the
analysis does not rely on stay in ``raw`` (docs/bundle-format.md lists them all).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from diagnose.errors import BundleError
from diagnose.model import ProbeState, ProbeStatus

PROBE_STATES: tuple[ProbeState, ...] = ("ok", "unavailable", "failed", "running", "skipped")


@dataclass(frozen=True)
class ClockAnchor:
    """One instant read on both clocks: maps CLOCK_MONOTONIC (every probe's timestamps) to wall time."""

    unix_ns: int = 0
    monotonic_ns: int = 0


@dataclass(frozen=True)
class Capture:
    complete: bool = False
    interrupted: str | None = None
    started_unix_ns: int | None = None
    ended_unix_ns: int | None = None
    anchor: ClockAnchor = field(default_factory=ClockAnchor)


@dataclass(frozen=True)
class Target:
    url: str = ""
    engine: str = "unknown"
    engine_version: str | None = None
    model: str | None = None
    engine_config: Mapping[str, float] = field(default_factory=dict)  # numeric settings the engine stated


@dataclass(frozen=True)
class Manifest:
    schema_version: int | None
    kind: str  # "capture" | "trace" | "spans"
    capture: Capture
    target: Target
    probes: tuple[ProbeStatus, ...]
    options: Mapping[str, Any]
    raw: Mapping[str, Any]


class _Reader:
    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, fld: str, want: str, got: Any) -> BundleError:
        shown = type(got).__name__ if not isinstance(got, (int, float, str)) else repr(got)[:40]
        return BundleError(f"{self.where}: field {fld}: expected {want}, got {shown}")

    def obj(self, d: Mapping[str, Any], key: str, fld: str) -> Mapping[str, Any]:
        v = d.get(key)
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise self.fail(fld, "an object", v)
        return v

    def int_or_none(self, d: Mapping[str, Any], key: str, fld: str) -> int | None:
        v = d.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not -(2**63) <= v < 2**63:
            raise self.fail(fld, "an integer (ns)", v)
        return v

    def str_or_none(self, d: Mapping[str, Any], key: str, fld: str) -> str | None:
        v = d.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            raise self.fail(fld, "a string", v)
        return v


def _finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) < 1e18


def read_manifest(d: Any, where: str) -> Manifest:
    """The typed manifest of the decoded ``manifest.json`` ``d``; ``where`` names the file in errors."""
    r = _Reader(where)
    if not isinstance(d, Mapping):
        raise BundleError(f"{where}: expected a JSON object")
    kind = d.get("kind") or "capture"
    if not isinstance(kind, str):
        raise r.fail("kind", "a string", kind)
    cap = r.obj(d, "capture", "capture")
    anc = r.obj(cap, "clock_anchor", "capture.clock_anchor")
    anchor = ClockAnchor(r.int_or_none(anc, "unix_ns", "capture.clock_anchor.unix_ns") or 0,
                         r.int_or_none(anc, "monotonic_ns", "capture.clock_anchor.monotonic_ns") or 0)
    complete = cap.get("complete", False)
    if not isinstance(complete, bool):
        raise r.fail("capture.complete", "true or false", complete)
    interrupted = cap.get("interrupted")
    capture = Capture(complete=complete, interrupted=None if interrupted is None else str(interrupted),
                      started_unix_ns=r.int_or_none(cap, "started_unix_ns", "capture.started_unix_ns"),
                      ended_unix_ns=r.int_or_none(cap, "ended_unix_ns", "capture.ended_unix_ns"), anchor=anchor)
    tgt = r.obj(d, "target", "target")
    cfg = r.obj(tgt, "engine_config", "target.engine_config")
    config = {str(k): float(v) for k, v in cfg.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    target = Target(url=r.str_or_none(tgt, "url", "target.url") or "",
                    engine=r.str_or_none(tgt, "engine", "target.engine") or "unknown",
                    engine_version=r.str_or_none(tgt, "engine_version", "target.engine_version"),
                    model=r.str_or_none(tgt, "model", "target.model"), engine_config=config)
    probes = []
    for name, p in r.obj(d, "probes", "probes").items():
        if not isinstance(p, Mapping):
            raise r.fail(f"probes.{name}", "an object", p)
        state = p.get("state", "failed")
        if state not in PROBE_STATES:
            raise r.fail(f"probes.{name}.state", " | ".join(PROBE_STATES), state)
        detail = p.get("detail") or {}
        if not isinstance(detail, Mapping):
            raise r.fail(f"probes.{name}.detail", "an object", detail)
        probes.append(ProbeStatus(name=str(p.get("name", name)), state=state, reason=str(p.get("reason") or ""),
                                  detail=dict(detail)))
    options = r.obj(d, "options", "options")
    for key in ("slo",):
        if options.get(key) is not None and not isinstance(options.get(key), Mapping):
            raise r.fail(f"options.{key}", "an object", options.get(key))
    for name, limit in (r.obj(options, "slo", "options.slo")).items():
        if limit is not None and not _finite_number(limit):
            raise r.fail(f"options.slo.{name}", "a number (ms)", limit)
    for name, entry in r.obj(d, "streams", "streams").items():
        if not isinstance(entry, Mapping):
            raise r.fail(f"streams.{name}", "an object", entry)
        rec = entry.get("records")
        if rec is not None and (isinstance(rec, bool) or not isinstance(rec, int) or not 0 <= rec < 2**63):
            raise r.fail(f"streams.{name}.records", "a record count", rec)
        r.str_or_none(entry, "file", f"streams.{name}.file")
    for name, entry in r.obj(d, "artifacts", "artifacts").items():
        if not isinstance(entry, Mapping):
            raise r.fail(f"artifacts.{name}", "an object", entry)
        r.str_or_none(entry, "file", f"artifacts.{name}.file")
        r.str_or_none(entry, "kind", f"artifacts.{name}.kind")
    workload = r.obj(d, "workload", "workload")
    wl_phases = workload.get("phases")
    if wl_phases is not None and not isinstance(wl_phases, list):
        raise r.fail("workload.phases", "a list", wl_phases)
    for i, ph in enumerate(wl_phases or []):
        if not isinstance(ph, Mapping):
            raise r.fail(f"workload.phases[{i}]", "an object", ph)
    r.obj(d, "tool", "tool")
    r.obj(d, "host", "host")
    ver = d.get("schema_version")
    return Manifest(schema_version=ver if isinstance(ver, int) and not isinstance(ver, bool) else None,
                    kind=kind, capture=capture, target=target, probes=tuple(probes),
                    options=options, raw=d)
