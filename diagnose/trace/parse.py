"""Streaming reader for Chrome-trace JSON written by torch.profiler / Kineto (.json or .json.gz).

The file is never held whole, as bytes or as Python objects: it is decompressed in blocks, cut into pieces
at event boundaries (``}`` , ``{`` between two array elements, checked by decoding the piece with orjson), and
each piece's events are folded into compact columns (``array('d')``/``array('q')`` plus one table of
unique names) before the next piece is read. Events nobody asked for (python_function stacks, flow arrows,
memory instants) are decoded with their piece and dropped at once, so memory stays bounded by the piece
size plus the kept columns. benchmarks/results/trace_parse.md records why decoding and dropping beats
pre-filtering the bytes with a regular expression.
"""

from __future__ import annotations

import re
import zlib
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from diagnose.errors import InputError

READ_BLOCK = 256 << 10  # compressed bytes read per call (about 4 MB once inflated)
PIECE = 4 << 20  # decompressed bytes decoded at once
MAX_PIECE = 256 << 20  # one event larger than this is treated as a broken file
HEADER_LIMIT = 64 << 20  # "traceEvents" must appear within this many bytes
_CUT = re.compile(rb"\}\s*,\s*\{")

GPU_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
            "gpu_memset": "memset", "Memset": "memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "Driver"}
CPU_OP_CATS = {"cpu_op", "Operator"}
ANNOTATION_CATS = {"user_annotation": "cpu", "gpu_user_annotation": "gpu"}
# Categories read and dropped on purpose (no warning): flows, instants, profiler spans, counters.
KNOWN_SKIPPED = {"ac2g", "fwdbwd", "async", "cpu_instant_event", "Trace", "overhead", "cuda_profiler_range",
                 "python_function", "Python", "gpu_mem", "Memory", "kernel_launch", "async_cpu_to_gpu", "async_gpu",
                 "cuda_sync", None}


@dataclass
class RankTrace:
    """The kept events of one trace file as columns (times in µs on the trace's own clock)."""

    path: Path
    rank: int
    meta: dict[str, Any]
    gpu: pd.DataFrame  # name, kind (kernel|memcpy|memset), device, stream, ts_us, dur_us, corr, ext_id, bytes
    runtime: pd.DataFrame  # name, tid, ts_us, dur_us, corr
    cpu_ops: pd.DataFrame  # name, tid, ts_us, dur_us
    annotations: pd.DataFrame  # name, where (cpu|gpu), tid, ts_us, dur_us
    python: pd.DataFrame | None  # name, tid, ts_us, dur_us (only with include_python)
    categories: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    events_total: int = 0
    time_unit: str = "us"


class _Cols:
    """Growing columns for one event class, names interned to integer codes."""

    def __init__(self, extra: tuple[str, ...] = ()) -> None:
        self.names: dict[str, int] = {}
        self.name = array("q")
        self.tid = array("q")
        self.ts = array("d")
        self.dur = array("d")
        self.extra = {k: array("d") for k in extra}

    def frame(self, tid_col: str = "tid") -> pd.DataFrame:
        cats = list(self.names)
        codes = np.frombuffer(self.name, dtype=np.int64) if len(self.name) else np.zeros(0, np.int64)
        cols: dict[str, Any] = {
            "name": pd.Categorical.from_codes(codes.astype(np.int32), categories=pd.Index(cats, dtype=object)),
            tid_col: np.frombuffer(self.tid, dtype=np.int64) if len(self.tid) else np.zeros(0, np.int64),
            "ts_us": np.frombuffer(self.ts, dtype=np.float64) if len(self.ts) else np.zeros(0),
            "dur_us": np.frombuffer(self.dur, dtype=np.float64) if len(self.dur) else np.zeros(0),
        }
        for k, a in self.extra.items():
            cols[k] = np.frombuffer(a, dtype=np.float64) if len(a) else np.zeros(0)
        return pd.DataFrame(cols)


def _num(v: Any) -> float:
    if v.__class__ is float or v.__class__ is int:
        return float(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _tid(v: Any, tids: dict[Any, int]) -> int:
    if v.__class__ is int:
        return int(v)
    code = tids.get(v)
    if code is None:  # string thread ids ("stream 7", "PyTorch Profiler"): stable negative codes
        code = tids[v] = -(len(tids) + 1)
    return code


class _Accumulator:
    def __init__(self, include_python: bool) -> None:
        self.include_python = include_python
        self.gpu = _Cols(("kind", "device", "corr", "ext_id", "bytes"))
        self.runtime = _Cols(("corr",))
        self.cpu = _Cols()
        self.ann = _Cols(("gpu",))
        self.py = _Cols()
        self.cats: Counter[Any] = Counter()
        self.tids: dict[Any, int] = {}
        self.meta_events: list[dict[str, Any]] = []
        self.bad_dur = 0
        self.neg_dur = 0
        self.events = 0

    def consume(self, events: list[Any]) -> None:  # noqa: C901 - one flat dispatch loop on purpose (hot path)
        cats = self.cats
        tids = self.tids
        gpu, rt, cpu, ann, py = self.gpu, self.runtime, self.cpu, self.ann, self.py
        include_python = self.include_python
        kinds = {"kernel": 0.0, "memcpy": 1.0, "memset": 2.0}
        for e in events:
            if e.__class__ is not dict:
                continue
            self.events += 1
            cat = e.get("cat")
            cats[cat] += 1
            if cat == "python_function" and not include_python:
                continue
            if e.get("ph") != "X":
                if e.get("ph") == "M":
                    self.meta_events.append(e)
                continue
            dur = e.get("dur")
            if dur is None or dur.__class__ is str:
                self.bad_dur += 1
                continue
            if dur < 0:
                self.neg_dur += 1
                continue
            if cat in RUNTIME_CATS:
                cols = rt
                args = e.get("args") or {}
                rt.extra["corr"].append(_num(args.get("correlation", -1)))
            elif cat in CPU_OP_CATS:
                cols = cpu
            elif cat in GPU_CATS:
                cols = gpu
                args = e.get("args") or {}
                x = gpu.extra
                x["kind"].append(kinds[GPU_CATS[cat]])
                x["device"].append(_num(args.get("device", e.get("pid", -1))))
                x["corr"].append(_num(args.get("correlation", -1)))
                x["ext_id"].append(_num(args.get("External id", args.get("external id", -1))))
                x["bytes"].append(_num(args.get("bytes", -1)))
                stream = args.get("stream")
                if stream is not None:
                    cols.names.setdefault(e.get("name", "?"), len(cols.names))
                    cols.name.append(cols.names[e.get("name", "?")])
                    cols.tid.append(_tid(stream, tids))
                    cols.ts.append(_num(e.get("ts")))
                    cols.dur.append(_num(dur))
                    continue
            elif cat in ANNOTATION_CATS:
                cols = ann
                ann.extra["gpu"].append(1.0 if cat == "gpu_user_annotation" else 0.0)
            elif cat == "python_function":
                cols = py
            else:
                continue
            name = e.get("name", "?")
            code = cols.names.get(name)
            if code is None:
                code = cols.names[name] = len(cols.names)
            cols.name.append(code)
            cols.tid.append(_tid(e.get("tid", -1), tids))
            cols.ts.append(_num(e.get("ts")))
            cols.dur.append(_num(dur))


def _blocks(path: Path) -> Iterator[bytes]:
    """Decompressed blocks of the file (gzip detected by its magic number, not its name)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed in finally
    except OSError as e:
        raise InputError(f"{path}: cannot open trace: {e.strerror or e}") from e
    try:
        first = fh.read(READ_BLOCK)
        if first[:2] != b"\x1f\x8b":
            data = first
            while data:
                yield data
                data = fh.read(PIECE)
            return
        d = zlib.decompressobj(47)
        data = first
        while True:
            try:
                out = d.decompress(data)
                while d.eof and d.unused_data:  # concatenated gzip members
                    rest = d.unused_data
                    d = zlib.decompressobj(47)
                    out += d.decompress(rest)
            except zlib.error as e:
                raise InputError(f"{path}: corrupt gzip data ({e})") from e
            if out:
                yield out
            data = fh.read(READ_BLOCK)
            if not data:
                break
        if not d.eof:
            raise InputError(f"{path}: truncated gzip file (the compressed stream ends early)")
    finally:
        fh.close()


def _find_events_start(buf: bytes, path: Path) -> tuple[int, dict[str, Any]] | None:
    """Offset just after the '[' of traceEvents and the header metadata, or None if not seen yet."""
    stripped = buf.lstrip()
    if not stripped:
        return None
    lead = len(buf) - len(stripped)
    if stripped[:1] == b"[":  # bare array form of the Chrome trace format
        return lead + 1, {}
    if stripped[:1] != b"{":
        raise InputError(f"{path}: not a trace (expected a JSON object or array, got {stripped[:20]!r})")
    pos = 0
    while True:
        i = buf.find(b'"traceEvents"', pos)
        if i < 0:
            return None
        j = i + len(b'"traceEvents"')
        m = re.match(rb"\s*:\s*\[", buf[j:j + 64])
        if m is None:
            if len(buf) - j < 64:
                return None
            pos = j
            continue
        header = buf[lead:i].rstrip()
        meta: dict[str, Any] = {}
        if header != b"{":
            try:
                meta = orjson.loads(header.rstrip(b",") + b"}")
            except orjson.JSONDecodeError:
                pos = j  # "traceEvents" inside a string of the header: keep looking
                continue
        return j + m.end(), meta


def _decode(piece: bytes) -> list[Any] | None:
    try:
        out = orjson.loads(b"[" + piece + b"]")
    except orjson.JSONDecodeError:
        return None
    return out if isinstance(out, list) else None


def _split(buf: bytes, final: bool) -> tuple[list[Any], bytes, bool] | None:
    """Decode the complete events at the front of ``buf``; return (events, rest, closed)."""
    if final:
        # the array ends at one of the last ']' (tail metadata rarely contains one)
        end = len(buf)
        for _ in range(32):
            k = buf.rfind(b"]", 0, end)
            if k < 0:
                break
            evs = _decode(buf[:k])
            if evs is not None:
                return evs, buf[k + 1:], True
            end = k
        return None
    lo = max(0, len(buf) - 65536)
    while True:
        cuts = [m.start() for m in _CUT.finditer(buf, lo)]
        for c in reversed(cuts[-8:]):
            evs = _decode(buf[:c + 1])
            if evs is not None:
                rest = buf[c + 1:].lstrip()
                return evs, rest[1:] if rest[:1] == b"," else rest, False
        if lo == 0:
            return None
        lo = max(0, lo - 4 * 65536)


def _tail_meta(tail: bytes) -> dict[str, Any]:
    t = tail.strip().lstrip(b",").strip()
    if not t or t == b"}":
        return {}
    try:
        out = orjson.loads(b"{" + t)
    except orjson.JSONDecodeError:
        try:
            out = orjson.loads(b"{" + t + b"}")
        except orjson.JSONDecodeError:
            return {}
    return out if isinstance(out, dict) else {}


def read_trace(path: str | Path, *, rank: int | None = None, include_python: bool = False) -> RankTrace:
    """Stream one trace file into a :class:`RankTrace`. Raises InputError naming the file on bad input."""
    p = Path(path)
    acc = _Accumulator(include_python)
    buf = b""
    meta: dict[str, Any] | None = None
    closed = False
    tail = b""
    for blk in _blocks(p):
        buf = buf + blk if buf else blk
        if meta is None:
            found = _find_events_start(buf, p)
            if found is None:
                if len(buf) > HEADER_LIMIT:
                    raise InputError(f"{p}: not a torch.profiler trace (no \"traceEvents\" array found)")
                continue
            start, meta = found
            buf = buf[start:]
        if closed:
            tail += buf
            buf = b""
            continue
        if len(buf) >= PIECE:
            res = _split(buf, final=False)
            if res is None:
                if len(buf) > MAX_PIECE:
                    raise InputError(f"{p}: invalid JSON in traceEvents (no event boundary in {len(buf):,} bytes)")
                continue
            evs, buf, closed = res
            acc.consume(evs)
            del evs
            if closed:
                tail, buf = buf, b""
    if meta is None:
        found = _find_events_start(buf, p)
        if found is None:
            what = "empty file" if not buf.strip() else 'not a torch.profiler trace (no "traceEvents" array found)'
            raise InputError(f"{p}: {what}")
        start, meta = found
        buf = buf[start:]
    if not closed:
        res = _split(buf, final=True)
        if res is None:
            raise InputError(f"{p}: invalid or truncated JSON in traceEvents (could not decode the last "
                             f"{len(buf):,} bytes)")
        evs, buf, closed = res
        acc.consume(evs)
        del evs
    tail += buf
    meta.update(_tail_meta(tail))
    return _finish(p, rank, meta, acc)


def _finish(p: Path, rank: int | None, meta: dict[str, Any], acc: _Accumulator) -> RankTrace:
    warnings: list[str] = []
    if acc.events == 0:
        raise InputError(f"{p}: trace has no events")
    if acc.bad_dur:
        warnings.append(f"{p.name}: {acc.bad_dur} complete events without a numeric duration were ignored")
    if acc.neg_dur:
        warnings.append(f"{p.name}: {acc.neg_dur} events with a negative duration were ignored")
    unknown = {str(k): v for k, v in acc.cats.items()
               if k not in KNOWN_SKIPPED and k not in GPU_CATS and k not in RUNTIME_CATS
               and k not in CPU_OP_CATS and k not in ANNOTATION_CATS}
    if unknown:
        top = ", ".join(f"{k} ({v})" for k, v in sorted(unknown.items(), key=lambda kv: -kv[1])[:5])
        warnings.append(f"{p.name}: unknown event categories ignored: {top}")
    gpu = acc.gpu.frame("stream")
    gpu["kind"] = pd.Categorical.from_codes(gpu["kind"].to_numpy().astype(np.int8),
                                            categories=["kernel", "memcpy", "memset"])
    frames = {"gpu": gpu, "runtime": acc.runtime.frame(), "cpu_ops": acc.cpu.frame(),
              "annotations": acc.ann.frame()}
    py = acc.py.frame() if acc.include_python else None
    unit = "us"
    ts_max = max((float(f["ts_us"].max()) for f in frames.values() if len(f)), default=0.0)
    if ts_max > 1e17:  # µs since 1970 are ~1.7e15; larger values are nanoseconds
        unit = "ns"
        warnings.append(f"{p.name}: timestamps look like nanoseconds (max {ts_max:.3g}); converted to µs")
        for f in [*frames.values(), *([py] if py is not None else [])]:
            f["ts_us"] = f["ts_us"] / 1000.0
            f["dur_us"] = f["dur_us"] / 1000.0
    for f in [*frames.values(), *([py] if py is not None else [])]:
        bad = ~np.isfinite(f["ts_us"].to_numpy())
        if bad.any():
            warnings.append(f"{p.name}: {int(bad.sum())} events without a numeric timestamp were ignored")
            f.drop(index=f.index[bad], inplace=True)
    for k in ("corr", "ext_id", "bytes", "device"):
        gpu[k] = gpu[k].astype(np.int64)
    frames["runtime"]["corr"] = frames["runtime"]["corr"].astype(np.int64)
    ann = frames["annotations"]
    ann["where"] = np.where(ann.pop("gpu").to_numpy() > 0, "gpu", "cpu")
    r = rank
    dist = meta.get("distributedInfo")
    if r is None and isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        r = int(dist["rank"])
    return RankTrace(path=p, rank=r if r is not None else 0, meta=_small_meta(meta, acc.meta_events),
                     gpu=gpu, runtime=frames["runtime"], cpu_ops=frames["cpu_ops"], annotations=ann,
                     python=py, categories={str(k): v for k, v in acc.cats.items()}, warnings=warnings,
                     events_total=acc.events, time_unit=unit)


def _small_meta(meta: dict[str, Any], meta_events: list[dict[str, Any]]) -> dict[str, Any]:
    keep = ("schemaVersion", "displayTimeUnit", "baseTimeNanoseconds", "distributedInfo", "cuda_runtime_version",
            "cuda_driver_version", "hip_runtime_version", "roctracer_version", "cupti_version",
            "vllm_version", "with_stack", "record_shapes", "profile_memory")
    out: dict[str, Any] = {k: meta[k] for k in keep if k in meta}
    dist = out.get("distributedInfo")
    if isinstance(dist, dict):
        out["distributedInfo"] = {k: v for k, v in dist.items() if k != "pg_config"}
    devs = meta.get("deviceProperties")
    if isinstance(devs, list):
        out["devices"] = [str(d.get("name", "")) for d in devs if isinstance(d, dict)]
    out["process_names"] = sorted({str((e.get("args") or {}).get("name")) for e in meta_events
                                   if e.get("name") == "process_name"})
    return out
