"""A strict reader of the Chrome Trace Event Format (JSON object form), for the Perfetto export's tests.

No real trace parser runs offline here (the ``perfetto`` package's TraceProcessor downloads its binary at
first use), so the export is checked against the format itself: one msgspec Struct per event phase, with
unknown fields forbidden and the field types and ranges of the format's specification ("Trace Event Format",
the Chrome tracing document), plus the rules a viewer needs to draw the tracks: slices on one thread nest or
follow one another (never partly overlap), every flow start has its end, every process and thread with events
has a name.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Any, Literal

import msgspec

NonNeg = Annotated[float, msgspec.Meta(ge=0)]
Id = Annotated[int, msgspec.Meta(ge=0)]


class Base(msgspec.Struct, forbid_unknown_fields=True, tag_field="ph"):
    name: str
    pid: Id
    tid: Id


class Complete(Base, tag="X"):
    ts: NonNeg
    dur: NonNeg
    cat: str
    args: dict[str, Any] = {}


class Instant(Base, tag="i"):
    ts: NonNeg
    s: Literal["t", "p", "g"]
    cat: str
    args: dict[str, Any] = {}


class CounterArgs(msgspec.Struct, forbid_unknown_fields=True):
    value: float


class Counter(Base, tag="C"):
    ts: NonNeg
    cat: str
    args: CounterArgs


class FlowStart(Base, tag="s"):
    ts: NonNeg
    id: Id
    cat: str


class FlowEnd(Base, tag="f"):
    ts: NonNeg
    id: Id
    cat: str
    bp: Literal["e"]


class MetaArgs(msgspec.Struct, forbid_unknown_fields=True):
    """``process_name``/``thread_name`` carry ``name``; ``process_sort_index``/``thread_sort_index`` carry
    ``sort_index`` (checked in :func:`check`)."""

    name: str | None = None
    sort_index: int | None = None


class Meta(Base, tag="M"):
    name: Literal["process_name", "thread_name", "process_sort_index", "thread_sort_index"]
    args: MetaArgs


Event = Complete | Instant | Counter | FlowStart | FlowEnd | Meta


class OtherData(msgspec.Struct, forbid_unknown_fields=True):
    exporter: str
    source: str
    clock: str
    origin_t_s: float
    counts: dict[str, int]
    warnings: list[str]


class TraceFile(msgspec.Struct, forbid_unknown_fields=True):
    schema_version: int  # diagnose's (docs/json-schemas.md); the format reads other top-level keys as metadata
    traceEvents: list[Event]
    displayTimeUnit: Literal["ms", "ns"]
    otherData: OtherData


def load(data: bytes) -> TraceFile:
    """Decode and check one export; raises msgspec.ValidationError / AssertionError on any violation."""
    tf = msgspec.json.decode(data, type=TraceFile)
    check(tf)
    return tf


def check(tf: TraceFile) -> None:
    procs: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    for e in tf.traceEvents:
        if not isinstance(e, Meta):
            continue
        if e.name.endswith("_name"):
            assert e.args.name is not None and e.args.sort_index is None, f"{e.name}: args {e.args}"
        else:
            assert e.args.sort_index is not None and e.args.name is None, f"{e.name}: args {e.args}"
        if e.name == "process_name":
            assert e.pid not in procs, f"pid {e.pid} named twice"
            procs[e.pid] = str(e.args.name)
        elif e.name == "thread_name":
            assert (e.pid, e.tid) not in threads, f"thread {e.pid}/{e.tid} named twice"
            threads[(e.pid, e.tid)] = str(e.args.name)
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    flows: dict[int, list[str]] = defaultdict(list)
    for e in tf.traceEvents:
        if isinstance(e, Meta):
            continue
        assert e.pid in procs, f"{e.name}: pid {e.pid} has no process_name"
        if isinstance(e, Counter):
            continue
        assert (e.pid, e.tid) in threads, f"{e.name}: thread {e.pid}/{e.tid} has no thread_name"
        if isinstance(e, Complete):
            slices[(e.pid, e.tid)].append((e.ts, e.ts + e.dur))
        elif isinstance(e, (FlowStart, FlowEnd)):
            flows[e.id].append(type(e).__name__)
    for key, iv in slices.items():
        assert_nested(iv, f"{procs[key[0]]} / {threads[key]}")
    for fid, kinds in flows.items():
        assert sorted(kinds) == ["FlowEnd", "FlowStart"], f"flow {fid}: {kinds}"


def assert_nested(iv: list[tuple[float, float]], where: str, tol: float = 0.0) -> None:
    """Slices on one track nest or follow one another: no slice starts inside another and ends after it."""
    stack: list[float] = []
    for s, e in sorted(iv, key=lambda x: (x[0], -x[1])):
        while stack and stack[-1] <= s + tol:
            stack.pop()
        assert not stack or e <= stack[-1] + tol, f"{where}: slice [{s}, {e}] overlaps one ending at {stack[-1]}"
        stack.append(e)


def tracks(tf: TraceFile) -> dict[str, dict[str, list[str]]]:
    """{process name: {thread name: [slice names]}} (counter-only processes map to {})."""
    procs = names(tf)[0]
    out: dict[str, dict[str, list[str]]] = {name: {} for name in procs.values()}
    tnames = names(tf)[1]
    for (pid, _tid), tn in tnames.items():
        out[procs[pid]].setdefault(tn, [])
    for e in tf.traceEvents:
        if isinstance(e, Complete):
            out[procs[e.pid]][tnames[(e.pid, e.tid)]].append(e.name)
    return out


def names(tf: TraceFile) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    """Process names by pid and thread names by (pid, tid)."""
    procs = {e.pid: str(e.args.name) for e in tf.traceEvents if isinstance(e, Meta) and e.name == "process_name"}
    threads = {(e.pid, e.tid): str(e.args.name) for e in tf.traceEvents
               if isinstance(e, Meta) and e.name == "thread_name"}
    return procs, threads


def counter_names(tf: TraceFile) -> dict[str, set[str]]:
    procs = names(tf)[0]
    out: dict[str, set[str]] = defaultdict(set)
    for e in tf.traceEvents:
        if isinstance(e, Counter):
            out[procs[e.pid]].add(e.name)
    return out
