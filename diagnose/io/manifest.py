"""The bundle manifest as typed, frozen records, read through a schema check.

:func:`read_manifest` turns the decoded ``manifest.json`` into a :class:`Manifest`; a field of the wrong type is a
:class:`~diagnose.errors.BundleError` naming the file and the field (one line, never a traceback). Every stage
after the reader (normalisers, signals, judgement, reports, compare, exports) reads these records, never the
decoded dict; ``raw`` keeps that dict for the one view that lists every recorded field, typed or not (the
report's Environment section). Writers (diagnose/io/writer.py) build the dict; docs/bundle-format.md lists
the fields. A record absent from the manifest reads as absent (None, empty), never as an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from diagnose.errors import BundleError
from diagnose.model import ProbeState, ProbeStatus

PROBE_STATES: tuple[ProbeState, ...] = ("ok", "unavailable", "failed", "running", "skipped")
Number = float  # an int stays an int (as recorded); mypy's float accepts both


@dataclass(frozen=True)
class ClockAnchor:
    """One instant read on both clocks: maps CLOCK_MONOTONIC (every probe's timestamps) to wall time."""

    unix_ns: int = 0
    monotonic_ns: int = 0


@dataclass(frozen=True)
class Capture:
    complete: bool = False
    interrupted: str | None = None
    started_at: str | None = None  # ISO 8601 UTC
    started_unix_ns: int | None = None
    ended_unix_ns: int | None = None
    anchor: ClockAnchor = field(default_factory=ClockAnchor)
    anchored: bool = False  # the manifest holds a clock anchor (without one, times stay on the probes' clock)


@dataclass(frozen=True)
class Tool:
    name: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class Target:
    url: str = ""
    engine: str | None = None  # as the manifest names it (None: it names none; "unknown": detection found none)
    engine_version: str | None = None
    model: str | None = None
    kind: str | None = None  # "fleet": a fleet read from its Prometheus (attach --prometheus)
    engine_config: Mapping[str, Number] = field(default_factory=dict)  # numeric settings the engine stated
    # every numeric setting the target states, first found first: on the target itself, in ``config`` (an
    # EngineInfo's own spelling), in ``engine_config``
    settings: Mapping[str, Number] = field(default_factory=dict)


@dataclass(frozen=True)
class PlannedPhase:
    """One entry of ``workload.phases``: a level the workload planned."""

    index: int | None = None
    name: str | None = None
    role: str | None = None  # "baseline" | "measure"


@dataclass(frozen=True)
class Replay:
    """``workload.replay``: the replayed file's summary (diagnose/capture/workload.py Replay.summary)."""

    file: str | None = None
    format: str | None = None
    requests: int | None = None
    skipped: int | None = None
    speed: Number | None = None
    loop: int | None = None
    span_s: Number | None = None
    block_tokens: int | None = None
    sessions: int | None = None
    prefix_share: Number | None = None


@dataclass(frozen=True)
class Dataset:
    """``workload.dataset``: the dataset's summary, no text (diagnose/capture/datasets.py Dataset.summary)."""

    file: str | None = None
    format: str | None = None
    conversations: int | None = None
    requests: int | None = None
    multi_turn: int | None = None
    skipped: int | None = None
    truncated: bool | None = None


@dataclass(frozen=True)
class Workload:
    """The WorkloadSpec the capture asked for (``{mode: observe}`` with --observe)."""

    mode: str | None = None
    phases: tuple[PlannedPhase, ...] = ()
    api: str | None = None
    arrival: str | None = None
    burstiness: Number | None = None
    ignore_eos: bool | None = None
    input_tokens: Number | None = None
    output_tokens: Number | None = None
    shared_prefix_fraction: Number | None = None
    warmup_requests: Number | None = None
    seed: int | None = None
    session_wait: bool = True
    turns: Number | None = None
    think_time_s: Number | None = None
    retries: Number | None = None
    input_lengths: Mapping[str, Any] | None = None  # a length distribution (diagnose/capture/lengths.py)
    output_lengths: Mapping[str, Any] | None = None
    replay: Replay | None = None
    dataset: Dataset | None = None
    sampling: Mapping[str, Any] | None = None  # workload.extra.sampling: the sampling the requests asked for
    logprobs: int | None = None  # workload.extra.logprobs: the alternatives a token the requests asked for (--logprobs)

    def shape(self, keys: tuple[str, ...]) -> dict[str, object]:
        """The scalar fields named by ``keys`` (compare's "what must match")."""
        return {k: getattr(self, k, None) for k in keys}


@dataclass(frozen=True)
class Options:
    slo: Mapping[str, Number | None] = field(default_factory=dict)  # 'ttft_p99_ms' -> limit (ms)
    cost_per_hour: Number | None = None
    overhead_budget: Number | None = None  # share of one core; None: no budget
    include_python: bool = False  # a trace input: keep Python frames


@dataclass(frozen=True)
class StreamEntry:
    name: str
    file: str | None = None
    records: int | None = None


@dataclass(frozen=True)
class Artifact:
    name: str
    file: str | None = None
    kind: str | None = None
    bytes: int | None = None
    rank: int | None = None  # a torch_trace's worker rank
    role: str | None = None  # a torch_trace's process: "worker" | "frontend"
    # the engine profiler's window stamped on a torch_trace (CLOCK_MONOTONIC ns)
    window_start_ns: Number | None = None
    window_end_ns: Number | None = None
    stop_done_ns: Number | None = None


@dataclass(frozen=True)
class Manifest:
    schema_version: int | None
    kind: str  # "capture" | "trace" | "spans"
    capture: Capture
    target: Target
    probes: tuple[ProbeStatus, ...]
    options: Options
    raw: Mapping[str, Any]
    workload: Workload | None = None  # None: the manifest records none (a trace, a span file)
    tool: Tool = field(default_factory=Tool)
    streams: Mapping[str, StreamEntry] = field(default_factory=dict)
    artifacts: Mapping[str, Artifact] = field(default_factory=dict)

    def probe(self, name: str) -> ProbeStatus | None:
        """The status the manifest records for probe ``name``, None when it lists none."""
        return next((p for p in self.probes if p.name == name), None)

    def probe_detail(self, name: str) -> Mapping[str, Any]:
        """Probe ``name``'s detail ({} when it lists none): probe-specific counts and costs."""
        p = self.probe(name)
        return p.detail if p is not None else {}


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

    def int_or_none(self, d: Mapping[str, Any], key: str, fld: str, want: str = "an integer (ns)") -> int | None:
        v = d.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not -(2**63) <= v < 2**63:
            raise self.fail(fld, want, v)
        return v

    def num_or_none(self, d: Mapping[str, Any], key: str, fld: str) -> Number | None:
        """A finite number as recorded (an int stays an int)."""
        v = d.get(key)
        if v is None:
            return None
        if not _finite_number(v):
            raise self.fail(fld, "a number", v)
        return v  # type: ignore[no-any-return]

    def str_or_none(self, d: Mapping[str, Any], key: str, fld: str) -> str | None:
        v = d.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            raise self.fail(fld, "a string", v)
        return v

    def bool_or_none(self, d: Mapping[str, Any], key: str, fld: str) -> bool | None:
        v = d.get(key)
        if v is None:
            return None
        if not isinstance(v, bool):
            raise self.fail(fld, "true or false", v)
        return v


def _finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) < 1e18


def _numeric(*sources: Mapping[str, Any]) -> dict[str, Number]:
    """The finite numbers of ``sources`` by key, the first source's first (other values are not settings)."""
    out: dict[str, Number] = {}
    for src in sources:
        for k, v in src.items():
            if _finite_number(v):
                out.setdefault(str(k), v)
    return out


def _capture(r: _Reader, d: Mapping[str, Any]) -> Capture:
    cap = r.obj(d, "capture", "capture")
    anc = r.obj(cap, "clock_anchor", "capture.clock_anchor")
    anchor = ClockAnchor(r.int_or_none(anc, "unix_ns", "capture.clock_anchor.unix_ns") or 0,
                         r.int_or_none(anc, "monotonic_ns", "capture.clock_anchor.monotonic_ns") or 0)
    complete = cap.get("complete", False)
    if not isinstance(complete, bool):
        raise r.fail("capture.complete", "true or false", complete)
    interrupted = cap.get("interrupted")
    return Capture(complete=complete, interrupted=None if interrupted is None else str(interrupted),
                   started_at=r.str_or_none(cap, "started_at", "capture.started_at"),
                   started_unix_ns=r.int_or_none(cap, "started_unix_ns", "capture.started_unix_ns"),
                   ended_unix_ns=r.int_or_none(cap, "ended_unix_ns", "capture.ended_unix_ns"), anchor=anchor,
                   anchored=isinstance(cap.get("clock_anchor"), Mapping))


def _target(r: _Reader, d: Mapping[str, Any]) -> Target:
    tgt = r.obj(d, "target", "target")
    cfg = r.obj(tgt, "engine_config", "target.engine_config")
    own = r.obj(tgt, "config", "target.config")
    return Target(url=r.str_or_none(tgt, "url", "target.url") or "",
                  engine=r.str_or_none(tgt, "engine", "target.engine"),
                  engine_version=r.str_or_none(tgt, "engine_version", "target.engine_version"),
                  model=r.str_or_none(tgt, "model", "target.model"),
                  kind=r.str_or_none(tgt, "kind", "target.kind"),
                  engine_config=_numeric(cfg), settings=_numeric(tgt, own, cfg))


def _probes(r: _Reader, d: Mapping[str, Any]) -> tuple[ProbeStatus, ...]:
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
    return tuple(probes)


def _options(r: _Reader, d: Mapping[str, Any]) -> Options:
    options = r.obj(d, "options", "options")
    slo: dict[str, Number | None] = {}
    for name, limit in r.obj(options, "slo", "options.slo").items():
        if limit is not None and not _finite_number(limit):
            raise r.fail(f"options.slo.{name}", "a number (ms)", limit)
        slo[str(name)] = limit
    return Options(slo=slo, cost_per_hour=r.num_or_none(options, "cost_per_hour", "options.cost_per_hour"),
                   overhead_budget=r.num_or_none(options, "overhead_budget", "options.overhead_budget"),
                   include_python=bool(r.bool_or_none(options, "include_python", "options.include_python")))


def _workload(r: _Reader, d: Mapping[str, Any]) -> Workload | None:
    wl = r.obj(d, "workload", "workload")
    phases = wl.get("phases")
    if phases is not None and not isinstance(phases, list):
        raise r.fail("workload.phases", "a list", phases)
    planned = []
    for i, ph in enumerate(phases or []):
        f = f"workload.phases[{i}]"
        if not isinstance(ph, Mapping):
            raise r.fail(f, "an object", ph)
        name = ph.get("name")
        planned.append(PlannedPhase(index=r.int_or_none(ph, "index", f + ".index", "an integer"),
                                    name=None if name is None else str(name), role=r.str_or_none(ph, "role", f + ".role")))
    dists: dict[str, Mapping[str, Any] | None] = {}
    for key in ("input_lengths", "output_lengths"):  # length distributions (diagnose/capture/lengths.py)
        dist = r.obj(wl, key, f"workload.{key}")
        if dist and not isinstance(dist.get("kind"), str):
            raise r.fail(f"workload.{key}.kind", "a string", dist.get("kind"))
        dists[key] = dist or None
    if not wl:
        return None
    rp, ds = r.obj(wl, "replay", "workload.replay"), r.obj(wl, "dataset", "workload.dataset")
    extra = r.obj(wl, "extra", "workload.extra")
    sampling = r.obj(extra, "sampling", "workload.extra.sampling") if extra.get("sampling") is not None else None
    logprobs = r.int_or_none(extra, "logprobs", "workload.extra.logprobs", "an integer")

    def whole(src: Mapping[str, Any], key: str, f: str) -> int | None:
        return r.int_or_none(src, key, f"workload.{f}.{key}", "an integer")

    replay = Replay(file=r.str_or_none(rp, "file", "workload.replay.file"),
                    format=r.str_or_none(rp, "format", "workload.replay.format"), requests=whole(rp, "requests", "replay"),
                    skipped=whole(rp, "skipped", "replay"), speed=r.num_or_none(rp, "speed", "workload.replay.speed"),
                    loop=whole(rp, "loop", "replay"), span_s=r.num_or_none(rp, "span_s", "workload.replay.span_s"),
                    block_tokens=whole(rp, "block_tokens", "replay"), sessions=whole(rp, "sessions", "replay"),
                    prefix_share=r.num_or_none(rp, "prefix_share", "workload.replay.prefix_share")) if rp else None
    dataset = Dataset(file=r.str_or_none(ds, "file", "workload.dataset.file"),
                      format=r.str_or_none(ds, "format", "workload.dataset.format"),
                      conversations=whole(ds, "conversations", "dataset"), requests=whole(ds, "requests", "dataset"),
                      multi_turn=whole(ds, "multi_turn", "dataset"), skipped=whole(ds, "skipped", "dataset"),
                      truncated=r.bool_or_none(ds, "truncated", "workload.dataset.truncated")) if ds else None

    def n(key: str) -> Number | None:
        return r.num_or_none(wl, key, f"workload.{key}")

    session_wait = r.bool_or_none(wl, "session_wait", "workload.session_wait")
    return Workload(mode=r.str_or_none(wl, "mode", "workload.mode"), phases=tuple(planned),
                    api=r.str_or_none(wl, "api", "workload.api"), arrival=r.str_or_none(wl, "arrival", "workload.arrival"),
                    burstiness=n("burstiness"), ignore_eos=r.bool_or_none(wl, "ignore_eos", "workload.ignore_eos"),
                    input_tokens=n("input_tokens"), output_tokens=n("output_tokens"),
                    shared_prefix_fraction=n("shared_prefix_fraction"), warmup_requests=n("warmup_requests"),
                    seed=r.int_or_none(wl, "seed", "workload.seed", "an integer"),
                    session_wait=True if session_wait is None else session_wait, turns=n("turns"),
                    think_time_s=n("think_time_s"), retries=n("retries"), input_lengths=dists["input_lengths"],
                    output_lengths=dists["output_lengths"], replay=replay, dataset=dataset, sampling=sampling,
                    logprobs=logprobs)


def _streams(r: _Reader, d: Mapping[str, Any]) -> dict[str, StreamEntry]:
    out = {}
    for name, entry in r.obj(d, "streams", "streams").items():
        if not isinstance(entry, Mapping):
            raise r.fail(f"streams.{name}", "an object", entry)
        rec = entry.get("records")
        if rec is not None and (isinstance(rec, bool) or not isinstance(rec, int) or not 0 <= rec < 2**63):
            raise r.fail(f"streams.{name}.records", "a record count", rec)
        out[str(name)] = StreamEntry(str(name), r.str_or_none(entry, "file", f"streams.{name}.file"), rec)
    return out


def _artifacts(r: _Reader, d: Mapping[str, Any]) -> dict[str, Artifact]:
    out = {}
    for name, entry in r.obj(d, "artifacts", "artifacts").items():
        if not isinstance(entry, Mapping):
            raise r.fail(f"artifacts.{name}", "an object", entry)
        f = f"artifacts.{name}"
        out[str(name)] = Artifact(str(name), file=r.str_or_none(entry, "file", f + ".file"),
                                  kind=r.str_or_none(entry, "kind", f + ".kind"),
                                  bytes=r.int_or_none(entry, "bytes", f + ".bytes", "a byte count"),
                                  rank=r.int_or_none(entry, "rank", f + ".rank", "an integer"),
                                  role=r.str_or_none(entry, "role", f + ".role"),
                                  **{k: r.num_or_none(entry, k, f"{f}.{k}")
                                     for k in ("window_start_ns", "window_end_ns", "stop_done_ns")})
    return out


def read_manifest(d: Any, where: str) -> Manifest:
    """The typed manifest of the decoded ``manifest.json`` ``d``; ``where`` names the file in errors."""
    r = _Reader(where)
    if not isinstance(d, Mapping):
        raise BundleError(f"{where}: expected a JSON object")
    kind = d.get("kind") or "capture"
    if not isinstance(kind, str):
        raise r.fail("kind", "a string", kind)
    tool = r.obj(d, "tool", "tool")
    r.obj(d, "host", "host")
    ver = d.get("schema_version")
    return Manifest(schema_version=ver if isinstance(ver, int) and not isinstance(ver, bool) else None,
                    kind=kind, capture=_capture(r, d), target=_target(r, d), probes=_probes(r, d),
                    options=_options(r, d), raw=d, workload=_workload(r, d),
                    tool=Tool(r.str_or_none(tool, "name", "tool.name"), r.str_or_none(tool, "version", "tool.version")),
                    streams=_streams(r, d), artifacts=_artifacts(r, d))
