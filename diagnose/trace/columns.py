"""Folding decoded trace events into compact numpy columns, one piece of the file at a time.

Events are decoded by msgspec straight into the small structs below (``Event``/``Args``): only the fields
the analysis reads are built as Python objects, every other key of an event (most of a kernel's or an
operator's ``args``) is skipped by the decoder without allocating, which is what makes reading a trace
cheaper than a plain ``json.load`` of it. A missing key takes the default below, chosen so that a missing
key and a JSON ``null`` keep the meaning they had when events were dicts (``-1`` where ``dict.get(k, -1)``
was used, ``UNSET`` where the value falls back to another key).

Hot path: events are routed by category in one loop, then each kept bucket is turned into columns with list
comprehensions and numpy (no per-event Python function calls). Names are interned per piece with
``pd.factorize`` into one global name table per event class, so memory grows with the number of kept events
(about 50 bytes each), never with the number of Python objects in the file. A piece with odd values (string
durations, missing names) falls back to a careful per-event path.
"""

from __future__ import annotations

import operator
import re
from collections import Counter
from typing import Any

import msgspec
import numpy as np
import pandas as pd

GPU_CATS = {"kernel": 0, "Kernel": 0, "gpu_memcpy": 1, "Memcpy": 1, "gpu_memset": 2, "Memset": 2}
GPU_KINDS = ["kernel", "memcpy", "memset"]
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "Driver"}
CPU_OP_CATS = {"cpu_op", "Operator"}
# NVTX ranges (nsys exports, vLLM's VLLM_NVTX_SCOPES_FOR_PROFILING scopes) read as CPU annotations
ANNOTATION_CATS = {"user_annotation": 0, "gpu_user_annotation": 1, "nvtx": 0, "NVTX": 0}
PYTHON_CATS = {"python_function", "Python"}
# The Python frames kept without include_python: engine steps of vLLM V1 (no step annotation there) and its
# CUDA-graph capture. Matched on the unique names of each piece only, so the other frames cost no more than
# being dropped.
STEP_FRAME = re.compile(r"(?:^|/)(?:gpu_model_runner|model_runner|gpu_worker)\.py\(\d+\): "
                        r"(?:execute_model|capture_model|_capture_cudagraphs)$|"
                        r"(?:^|/)cuda_graph_runner\.py\(\d+\): (?:capture|capture_one_batch_size)$|"
                        r"(?:^|/)cudagraph_trees\.py\(\d+\): (?:_record|record_function)$")
UNSET: Any = msgspec.UNSET


class Args(msgspec.Struct, gc=False):
    """The keys of an event's ``args`` that the analysis reads (all others are skipped while decoding)."""

    ext: Any = msgspec.field(default=UNSET, name="External id")
    ext_lower: Any = msgspec.field(default=-1, name="external id")
    correlation: Any = -1
    stream: Any = UNSET  # falls back to the event's tid
    device: Any = UNSET  # falls back to the event's pid
    bytes: Any = -1
    name: Any = None  # process_name metadata events
    # record_shapes: an operator's input shapes and types; kept for the GEMM operators only (trace/gemm.py)
    dims: Any = msgspec.field(default=None, name="Input Dims")
    types: Any = msgspec.field(default=None, name="Input type")


class Event(msgspec.Struct, gc=False):
    """One trace event, as far as the analysis reads it."""

    cat: Any = None
    name: Any = "?"
    ph: Any = None
    ts: Any = None
    dur: Any = None
    tid: Any = -1
    pid: Any = -1
    args: Args | None = None


_NO_ARGS = Args()
_getcat = operator.attrgetter("cat")
_getname = operator.attrgetter("name")
_getph = operator.attrgetter("ph")
DECODER = msgspec.json.Decoder(list[Event])


def events_from_dicts(items: list[Any]) -> list[Event]:
    """The same Events from already decoded JSON values (the fallback for a piece msgspec's schema rejects,
    e.g. an ``args`` that is not an object); elements that are not objects are dropped, as before."""
    out = []
    for e in items:
        if e.__class__ is not dict:
            continue
        a = e.get("args")
        args = None
        if isinstance(a, dict):
            args = Args(ext=a.get("External id", UNSET), ext_lower=a.get("external id", -1),
                        correlation=a.get("correlation", -1), stream=a.get("stream", UNSET),
                        device=a.get("device", UNSET), bytes=a.get("bytes", -1), name=a.get("name"),
                        dims=a.get("Input Dims"), types=a.get("Input type"))
        out.append(Event(cat=e.get("cat"), name=e.get("name", "?"), ph=e.get("ph"), ts=e.get("ts"),
                         dur=e.get("dur"), tid=e.get("tid", -1), pid=e.get("pid", -1), args=args))
    return out


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


class _Table:
    """Chunks of columns for one event class plus its global name table."""

    def __init__(self, extra: tuple[str, ...]) -> None:
        self.names: dict[str, int] = {}
        self.extra = extra
        self.chunks: list[dict[str, np.ndarray]] = []

    def add(self, evs: list[Event], tids: dict[Any, int]) -> None:
        if not evs:
            return
        try:
            cols, tid = self._fast(evs)
        except (KeyError, TypeError, ValueError, AttributeError):
            cols, tid = self._slow(evs)
        try:
            arr = np.array(tid, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):  # string thread ids
            arr = np.array([_tid(t, tids) for t in tid], dtype=np.int64)
        cols["tid"] = arr
        self.chunks.append(cols)

    def _intern(self, names: list[Any]) -> np.ndarray:
        codes, uniq = pd.factorize(np.asarray(names, dtype=object))
        table = self.names
        glob = np.array([table.setdefault(str(u), len(table)) for u in uniq], dtype=np.int32)
        return glob[codes] if len(glob) else np.zeros(len(names), np.int32)

    def _fast(self, evs: list[Event]) -> tuple[dict[str, np.ndarray], list[Any]]:
        """The chunk's columns, and its thread ids (or streams) as given (converted in ``add``)."""
        cols: dict[str, np.ndarray] = {
            "name": self._intern([e.name for e in evs]),
            "ts_us": np.array([e.ts for e in evs], dtype=np.float64),
            "dur_us": np.array([e.dur for e in evs], dtype=np.float64),
        }
        tid: list[Any] = [e.tid for e in evs]
        if self.extra:
            args = [_NO_ARGS if e.args is None else e.args for e in evs]
            for k in self.extra:
                if k == "ext_id":
                    cols[k] = np.array([a.ext_lower if a.ext is UNSET else a.ext for a in args], np.float64)
                elif k == "stream":
                    tid = [e.tid if a.stream is UNSET else a.stream for a, e in zip(args, evs, strict=True)]
                elif k == "device":
                    cols[k] = np.array([e.pid if a.device is UNSET else a.device
                                        for a, e in zip(args, evs, strict=True)], np.float64)
                elif k == "corr":
                    cols[k] = np.array([a.correlation for a in args], np.float64)
                elif k == "bytes":
                    cols[k] = np.array([a.bytes for a in args], np.float64)
                elif k in ("kind", "gpu"):
                    table = GPU_CATS if k == "kind" else ANNOTATION_CATS
                    cols[k] = np.array([table[e.cat] for e in evs], np.int8)
                elif k == "shape":
                    cols[k] = _shapes(evs, args)
        return cols, tid

    def _slow(self, evs: list[Event]) -> tuple[dict[str, np.ndarray], list[Any]]:
        cols: dict[str, np.ndarray] = {
            "name": self._intern([str(e.name) for e in evs]),
            "ts_us": np.array([_num(e.ts) for e in evs], dtype=np.float64),
            "dur_us": np.array([_num(e.dur) for e in evs], dtype=np.float64),
        }
        tid: list[Any] = [e.tid for e in evs]
        args = [_NO_ARGS if e.args is None else e.args for e in evs]
        for k in self.extra:
            if k == "ext_id":
                cols[k] = np.array([_num(a.ext_lower if a.ext is UNSET else a.ext) for a in args])
            elif k == "stream":
                tid = [e.tid if a.stream is UNSET else a.stream for a, e in zip(args, evs, strict=True)]
            elif k == "device":
                cols[k] = np.array([_num(e.pid if a.device is UNSET else a.device)
                                    for a, e in zip(args, evs, strict=True)])
            elif k in ("corr", "bytes"):
                cols[k] = np.array([_num(a.correlation if k == "corr" else a.bytes) for a in args])
            elif k in ("kind", "gpu"):
                table = GPU_CATS if k == "kind" else ANNOTATION_CATS
                cols[k] = np.array([table.get(str(e.cat), 0) for e in evs], np.int8)
            elif k == "shape":
                cols[k] = _shapes(evs, args)
        return cols, tid

    def frame(self) -> pd.DataFrame:
        keys = ["name", "tid", "ts_us", "dur_us", *[k for k in self.extra if k != "stream"]]
        if self.chunks:
            cols = {k: np.concatenate([c[k] for c in self.chunks]) for k in keys}
        else:
            cols = {k: np.zeros(0, np.int32 if k == "name" else np.int8 if k in ("kind", "gpu") else
                                object if k == "shape" else np.float64) for k in keys}
            cols["tid"] = np.zeros(0, np.int64)
        self.chunks = []
        cols["name"] = pd.Categorical.from_codes(cols["name"].astype(np.int32),
                                                 categories=pd.Index(list(self.names), dtype=object))
        return pd.DataFrame(cols)


# the operators that launch a GEMM kernel themselves (aten::linear and aten::matmul call these): their input
# shapes say what the kernel read and wrote (trace/gemm.py)
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm"})


def _shapes(evs: list[Event], args: list[Args]) -> np.ndarray:
    """Per operator event: (input dims, input types) for a GEMM operator recorded with shapes, else None."""
    out = np.empty(len(evs), dtype=object)
    out[:] = [(a.dims, a.types) if a.dims is not None and e.name in GEMM_OPS else None
              for e, a in zip(evs, args, strict=True)]
    return out


def _tid(v: Any, tids: dict[Any, int]) -> int:
    if v.__class__ is int:
        return int(v) if -(2**63) <= v < 2**63 else _tid(str(v), tids)
    if not isinstance(v, (str, float, bool, type(None))):  # an object or array as a thread id: by its text
        v = repr(v)
    code = tids.get(v)
    if code is None:  # string thread ids ("stream 7", "PyTorch Profiler"): stable negative codes
        code = tids[v] = -(len(tids) + 1)
    return code


class Accumulator:
    def __init__(self, include_python: bool) -> None:
        self.include_python = include_python
        self.gpu = _Table(("stream", "kind", "device", "corr", "ext_id", "bytes"))
        self.runtime = _Table(("corr",))
        self.cpu = _Table(("shape",))
        self.ann = _Table(("gpu",))
        self.py = _Table(())
        self.frames_table = _Table(())
        self.cats: Counter[Any] = Counter()
        self.tids: dict[Any, int] = {}
        self.meta_events: list[Event] = []
        self.events = 0
        # begin / end events of annotation ranges (NVTX push / pop exported as Chrome "B" / "E"), with their
        # position in the file; paired per thread into complete ranges once the whole file is read
        self.range_marks: list[tuple[int, Event]] = []
        self.ranges_unpaired = 0

    def consume(self, evs: list[Event]) -> None:
        cl = list(map(_getcat, evs))  # C-level pass
        if not evs:
            return
        base = self.events
        self.events += len(evs)
        codes, uniq = pd.factorize(np.asarray(cl, dtype=object), use_na_sentinel=True)
        counts = np.bincount(codes[codes >= 0], minlength=len(uniq))
        for u, n in zip(uniq, counts, strict=True):
            self.cats[u] += int(n)
        n_none = int((codes < 0).sum())
        if n_none:
            self.cats[None] += n_none
            for i, (e, c) in enumerate(zip(evs, cl, strict=True)):
                if c is None and e.ph in ("M", "E"):  # an "E" often carries no category: it may close a range
                    if e.ph == "M":
                        self.meta_events.append(e)
                    else:
                        self.range_marks.append((base + i, e))
        pos = {u: i for i, u in enumerate(uniq)}
        buckets = ((self.gpu, GPU_CATS), (self.runtime, RUNTIME_CATS), (self.cpu, CPU_OP_CATS),
                   (self.ann, ANNOTATION_CATS), (self.py, PYTHON_CATS))
        for table, cats in buckets:
            want = [pos[c] for c in cats if c in pos]
            if not want:
                continue
            idx = np.flatnonzero(codes == want[0]) if len(want) == 1 else np.flatnonzero(np.isin(codes, want))
            picked = [evs[int(idx[0])]] if len(idx) == 1 else list(operator.itemgetter(*idx.tolist())(evs))
            if table is self.ann:
                picked = self._split_ranges(picked, idx, base)
                if not picked:
                    continue
            if table is self.py:
                self._step_frames(picked)
                if not self.include_python:
                    continue
            table.add(picked, self.tids)

    def _split_ranges(self, evs: list[Event], idx: np.ndarray, base: int) -> list[Event]:
        """The annotation events that are complete ranges; begin / end events are kept aside for pairing (the
        check is one C-level pass over the phases, so a trace without them pays nothing more)."""
        phs = list(map(_getph, evs))
        if "B" not in phs and "E" not in phs:
            return evs
        keep = []
        for i, e, ph in zip(idx.tolist(), evs, phs, strict=True):
            if ph == "B" or ph == "E":
                self.range_marks.append((base + int(i), e))
            else:
                keep.append(e)
        return keep

    def _pair_ranges(self) -> None:
        """Pair the begin / end events of each thread into complete ranges (in time order, file order between
        equal times; an end closes the innermost open range), as the Chrome trace format defines them. An end
        without a category is matched only while a range is open on its thread (it may close something else
        otherwise); a begin never closed, or an annotation's end with nothing open, is counted as unpaired."""
        if not any(e.ph == "B" for _, e in self.range_marks):
            self.ranges_unpaired += sum(1 for _, e in self.range_marks if e.cat is not None)
            self.range_marks = []
            return
        marks = sorted(self.range_marks, key=lambda m: (_num(m[1].ts), m[0]))
        self.range_marks = []
        open_: dict[tuple[str, str], list[Event]] = {}
        done: list[Event] = []
        for _, e in marks:
            key = (repr(e.pid), repr(e.tid))
            if e.ph == "B":
                open_.setdefault(key, []).append(e)
                continue
            stack = open_.get(key)
            if stack:
                b = stack.pop()
                done.append(Event(cat=b.cat, name=b.name, ph="X", ts=b.ts, dur=_num(e.ts) - _num(b.ts),
                                  tid=b.tid, pid=b.pid, args=b.args))
            elif e.cat is not None:
                self.ranges_unpaired += 1
        self.ranges_unpaired += sum(len(v) for v in open_.values())
        done.sort(key=lambda e: _num(e.ts))
        self.ann.add(done, self.tids)

    def _step_frames(self, evs: list[Event]) -> None:
        names = list(map(_getname, evs))
        codes, uniq = pd.factorize(np.asarray(names, dtype=object))
        hit = [i for i, u in enumerate(uniq) if isinstance(u, str) and STEP_FRAME.search(u)]
        if hit:
            sel = np.flatnonzero(np.isin(codes, hit))
            self.frames_table.add([evs[int(i)] for i in sel], self.tids)

    def frames(self) -> dict[str, pd.DataFrame]:
        gpu = self.gpu.frame().rename(columns={"tid": "stream"})
        gpu["kind"] = pd.Categorical.from_codes(gpu["kind"].to_numpy().astype(np.int8), categories=GPU_KINDS)
        if self.range_marks:
            self._pair_ranges()
        ann = self.ann.frame()
        ann["where"] = np.where(ann.pop("gpu").to_numpy() > 0, "gpu", "cpu")
        out = {"gpu": gpu, "runtime": self.runtime.frame(), "cpu_ops": self.cpu.frame(), "annotations": ann,
               "step_frames": self.frames_table.frame()}
        if self.include_python:
            out["python"] = self.py.frame()
        return out
