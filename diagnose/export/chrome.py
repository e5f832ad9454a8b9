"""A writer of Chrome Trace Event Format events (the JSON object form, ``{"traceEvents": [...]}``), which the
Perfetto UI, ``ui.perfetto.dev``'s trace processor and the old ``chrome://tracing`` all read.

Times go in as integer nanoseconds on one clock (the bundle's: 0 = its clock anchor) and come out as
microseconds, the format's unit, shifted so that no timestamp is negative. Two kinds of slice:

* ``exact=False`` (this exporter's own tracks: requests, spans, phases, py-spy windows): start and end are
  floored to whole microseconds, so a child that lies inside its parent in nanoseconds still does after
  rounding, whatever the reader does with fractions (a reader converting ``ts`` and ``dur`` separately could
  otherwise push a child's end 1 ns past its parent's, which viewers show as broken nesting);
* ``exact=True`` (profiler events: kernels, CPU ops): nanosecond fractions kept, as the profiler wrote them.

Processes and threads are numbered here (pid 1, 2, ... tid 1, 2, ...), never taken from the source, so two
sources that share a real pid (py-spy and the torch profiler sample the same worker) never land on one track.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Required, TypedDict

PH_SLICE = "X"
PH_COUNTER = "C"
PH_INSTANT = "i"
PH_META = "M"


class ChromeEvent(TypedDict, total=False):
    """One Trace Event Format event as written: ``ts``/``dur`` in µs (set by ``TraceBuilder.events``)."""

    ph: Required[str]  # PH_* ("X", "C", "i", "M"), or "s"/"f" for a flow's ends
    name: str
    cat: str
    pid: int
    tid: int
    s: str  # an instant's scope
    id: int  # a flow's id
    bp: str  # a flow end's binding point
    args: dict[str, object]
    ts: float
    dur: float


def clean(v: Any) -> Any:
    """A JSON-safe argument value: numpy scalars to Python, NaN/inf to None, containers recursively."""
    if v is None or isinstance(v, (bool, str, int)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
    item = getattr(v, "item", None)  # numpy scalar
    if callable(item):
        return clean(item())
    return str(v)


def clean_args(args: Mapping[str, object]) -> dict[str, object]:
    """Arguments without the missing ones (None / NaN), so a reader never sees a null where a value goes."""
    out: dict[str, object] = {}
    for k, v in args.items():
        c = clean(v)
        if c is not None:
            out[k] = c
    return out


def lanes(intervals: Sequence[tuple[int, int]]) -> list[int]:
    """A lane (track) index per interval such that on each lane intervals nest or follow one another, never
    partly overlap (what a viewer needs to draw them as one track); greedy, earliest and longest first."""
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], -intervals[i][1]))
    stacks: list[list[int]] = []  # per lane: ends of the open intervals
    out = [0] * len(intervals)
    for i in order:
        s, e = intervals[i]
        for n, st in enumerate(stacks):
            while st and st[-1] <= s:
                st.pop()
            if not st or e <= st[-1]:
                st.append(e)
                out[i] = n
                break
        else:
            stacks.append([e])
            out[i] = len(stacks) - 1
    return out


class TraceBuilder:
    def __init__(self) -> None:
        # [event dict without ts/dur, start ns, end ns or None, exact]
        self._events: list[tuple[ChromeEvent, int, int | None, bool]] = []
        self._meta: list[ChromeEvent] = []
        self._pids: dict[str, int] = {}
        self._tids: dict[tuple[int, str], int] = {}
        self.process_kind: dict[int, str] = {}

    # -- tracks ------------------------------------------------------------------------------------------
    def process(self, key: str, name: str, kind: str) -> int:
        """The pid of the process group ``key`` (made on first use, in the order processes are asked for)."""
        pid = self._pids.get(key)
        if pid is None:
            pid = self._pids[key] = len(self._pids) + 1
            self.process_kind[pid] = kind
            self._meta.append({"ph": PH_META, "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
            self._meta.append({"ph": PH_META, "name": "process_sort_index", "pid": pid, "tid": 0,
                               "args": {"sort_index": pid}})
        return pid

    def thread(self, pid: int, key: str, name: str) -> int:
        """The tid of track ``key`` in process ``pid`` (numbered from 1 in the order asked for)."""
        tid = self._tids.get((pid, key))
        if tid is None:
            tid = self._tids[(pid, key)] = sum(1 for p, _ in self._tids if p == pid) + 1
            self._meta.append({"ph": PH_META, "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            self._meta.append({"ph": PH_META, "name": "thread_sort_index", "pid": pid, "tid": tid,
                               "args": {"sort_index": tid}})
        return tid

    # -- events ------------------------------------------------------------------------------------------
    def slice(self, pid: int, tid: int, name: str, start_ns: int, end_ns: int, cat: str,
              args: Mapping[str, object] | None = None, *, exact: bool = False) -> None:
        ev: ChromeEvent = {"ph": PH_SLICE, "name": name, "cat": cat, "pid": pid, "tid": tid}
        if args:
            ev["args"] = clean_args(args)
        self._events.append((ev, int(start_ns), max(int(end_ns), int(start_ns)), exact))

    def instant(self, pid: int, tid: int, name: str, t_ns: int, cat: str, args: Mapping[str, object] | None = None) -> None:
        ev: ChromeEvent = {"ph": PH_INSTANT, "s": "t", "name": name, "cat": cat, "pid": pid, "tid": tid}
        if args:
            ev["args"] = clean_args(args)
        self._events.append((ev, int(t_ns), None, True))

    def counter(self, pid: int, name: str, t_ns: int, value: float, cat: str) -> None:
        if not math.isfinite(value):
            return
        self._events.append(({"ph": PH_COUNTER, "name": name, "cat": cat, "pid": pid, "tid": 0,
                              "args": {"value": float(value)}}, int(t_ns), None, True))

    def flow(self, start: tuple[int, int, int], end: tuple[int, int, int], flow_id: int, name: str, cat: str) -> None:
        """A flow arrow from the slice enclosing ``start`` to the one enclosing ``end`` ((pid, tid, t_ns) each)."""
        self._events.append(({"ph": "s", "id": flow_id, "name": name, "cat": cat, "pid": start[0], "tid": start[1]},
                             start[2], None, True))
        self._events.append(({"ph": "f", "bp": "e", "id": flow_id, "name": name, "cat": cat, "pid": end[0],
                              "tid": end[1]}, end[2], None, True))

    @property
    def n_events(self) -> int:
        return len(self._events)

    # -- output ------------------------------------------------------------------------------------------
    def origin_ns(self, at_zero: bool) -> int:
        """The nanosecond that becomes ts 0: the clock's 0 (``at_zero``) unless an event comes earlier, else the
        earliest event; always a whole microsecond, so floored slice times stay whole."""
        lo = min((e[1] for e in self._events), default=0)
        if at_zero:
            lo = min(lo, 0)
        return (lo // 1000) * 1000

    def events(self, origin_ns: int) -> list[ChromeEvent]:
        out: list[ChromeEvent] = list(self._meta)
        for ev, start, end, exact in self._events:
            s = start - origin_ns
            if exact:
                ev["ts"] = s / 1000
                if end is not None:
                    ev["dur"] = (end - start) / 1000
            else:
                s_us = s // 1000
                ev["ts"] = s_us
                if end is not None:
                    ev["dur"] = (end - origin_ns) // 1000 - s_us
            out.append(ev)
        return out
