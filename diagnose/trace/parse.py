"""Streaming reader for Chrome-trace JSON written by torch.profiler / Kineto (.json or .json.gz).

The file is never held whole, as bytes or as Python objects: it is decompressed in blocks, cut into pieces
at event boundaries (``}`` , ``{`` between two array elements, checked by decoding the piece), and each
piece is decoded by msgspec into small structs holding only the fields the analysis reads (columns.Event)
and folded into compact numpy columns plus one table of unique names before the next piece is read. Events nobody asked for (python_function stacks, flow arrows,
memory instants) are decoded with their piece and dropped at once, so memory stays bounded by the piece
size plus the kept columns. benchmarks/results/trace_parse.md records why decoding and dropping beats
pre-filtering the bytes with a regular expression.
"""

from __future__ import annotations

import gc
import queue
import re
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
import pandas as pd

from diagnose.errors import InputError
from diagnose.trace.columns import (
    ANNOTATION_CATS,
    CPU_OP_CATS,
    DECODER,
    GPU_CATS,
    RUNTIME_CATS,
    Accumulator,
    Event,
    events_from_dicts,
)

READ_BLOCK = 64 << 10  # compressed bytes read per call (about 1 MB once inflated)
PIECE = 1 << 20  # decompressed bytes decoded at once (bounds the transient Python objects)
MAX_PIECE = 256 << 20  # one event larger than this is treated as a broken file
HEADER_LIMIT = 64 << 20  # "traceEvents" must appear within this many bytes
_CUT = re.compile(rb"\}\s*,\s*\{")

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
    cpu_ops: pd.DataFrame  # name, tid, ts_us, dur_us, shape (GEMM operators with record_shapes: dims, types)
    annotations: pd.DataFrame  # name, where (cpu|gpu), tid, ts_us, dur_us
    python: pd.DataFrame | None  # name, tid, ts_us, dur_us (only with include_python)
    # vLLM V1 step / graph-capture Python frames (columns.STEP_FRAME), kept always: name, tid, ts_us, dur_us
    step_frames: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["name", "tid", "ts_us", "dur_us"]))
    categories: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    events_total: int = 0
    time_unit: str = "us"


def _prefetched(gen: Iterator[bytes], depth: int = 8) -> Iterator[bytes]:
    """Run a block generator in a thread (zlib and file reads release the GIL, so inflating overlaps with
    decoding); at most ``depth`` blocks wait in the queue, so memory stays bounded."""
    q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():  # never block for good: the consumer may have stopped reading
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for blk in gen:
                if not put(("data", blk)):
                    return
            put(("end", None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer and re-raised there
            put(("error", e))

    t = threading.Thread(target=produce, name="trace-inflate", daemon=True)
    t.start()
    try:
        while True:
            kind, val = q.get()
            if kind == "data":
                yield val
            elif kind == "end":
                return
            else:
                raise val
    finally:
        stop.set()
        t.join(timeout=5)


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
        raise InputError(f"{path}: not a trace (expected a JSON object or array at byte {lead})")
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


def _decode(piece: bytes | memoryview) -> list[Event] | None:
    """The events of one piece (``{...}, {...}``), or None when it is not valid JSON (a bad cut point).

    msgspec decodes straight into Events, skipping the keys nobody reads; a piece that is valid JSON but
    not the usual shape (an ``args`` that is not an object, an element that is not an event) is decoded
    by orjson and converted, with the same result."""
    ba = bytearray(b"[")
    ba += piece
    ba += b"]"
    try:
        return DECODER.decode(ba)
    except msgspec.ValidationError:
        pass
    except msgspec.DecodeError:
        return None
    try:
        out = orjson.loads(ba)
    except orjson.JSONDecodeError:
        return None
    return events_from_dicts(out) if isinstance(out, list) else None


def _split(buf: bytes | bytearray, final: bool, new_from: int = 0) -> tuple[list[Event], bytes, bool] | None:
    """Decode the complete events at the front of ``buf``; return (events, rest, closed).

    One pass: the cut points (``}, {``) of the last 64 KiB are tried from the end (the usual case: an event
    boundary close to the end), then, if none decodes, those from ``new_from`` on (the data added since the
    last try that failed: earlier cut points were tried then), at most 8 each, so one call costs one regex
    pass over new data plus a bounded number of decodes, whatever the buffer holds."""
    if final:
        # the array ends at one of the last ']' (tail metadata rarely contains one)
        end = len(buf)
        for _ in range(32):
            k = buf.rfind(b"]", 0, end)
            if k < 0:
                break
            evs = _decode(memoryview(buf)[:k])
            if evs is not None:
                return evs, bytes(buf[k + 1:]), True
            end = k
        return None
    lo = max(0, len(buf) - 65536)
    first = max(0, new_from - 64)
    tries = 8 if new_from == 0 else 2  # a buffer that failed before holds a huge event: few, costly tries
    tried_from = len(buf)
    for start in ((lo, first) if lo > first else (first,)):
        cuts = _last_cuts(buf, start, tried_from, tries)
        for c in cuts:
            evs = _decode(memoryview(buf)[:c + 1])
            if evs is not None:
                rest = bytes(buf[c + 1:]).lstrip()
                return evs, rest[1:] if rest[:1] == b"," else rest, False
        tried_from = cuts[-1] if cuts else start
    return None


def _last_cuts(buf: bytes | bytearray, start: int, end: int, n: int, probes: int = 4096) -> list[int]:
    """Up to ``n`` cut points (the ``}`` of ``}, {``) in ``buf[start:end]``, last first: found by searching
    backwards for ``}`` (at most ``probes`` of them), so the cost does not grow with how many cut points a
    huge event holds."""
    out: list[int] = []
    k = end
    for _ in range(probes):
        k = buf.rfind(b"}", start, k)
        if k < 0:
            break
        if _CUT.match(buf, k):
            out.append(k)
            if len(out) >= n:
                break
    return out


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
    acc = Accumulator(include_python)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # decoded pieces hold no reference cycles; generation scans of them only cost time
    try:
        return _read(p, acc, rank)
    finally:
        if gc_was_enabled:
            gc.enable()


def _read(p: Path, acc: Accumulator, rank: int | None) -> RankTrace:
    """Linear in the file size whatever it holds: the undecoded data grows in one bytearray (appending is
    amortised O(1)), a try looks for cut points only in the data added since the last try, and after a try
    that finds no event boundary the next waits until the undecoded data has doubled. A file without
    boundaries, a single huge event or megabytes of padding thus costs a few passes over the data, and
    reaches the size guards in seconds."""
    buf = bytearray()  # data not yet decoded
    tried = 0  # bytes of buf already searched for cut points by a try that failed
    next_try = 1  # the header is looked for at once, then after each doubling
    meta: dict[str, Any] | None = None
    for blk in _prefetched(_blocks(p)):
        buf += blk
        if len(buf) < next_try:
            continue
        if meta is None:
            found = _find_events_start(bytes(buf), p)
            if found is None:
                if len(buf) > HEADER_LIMIT:
                    raise InputError(f"{p}: not a torch.profiler trace (no \"traceEvents\" array found)")
                next_try = 2 * len(buf)
                continue
            start, meta = found
            del buf[:start]
            next_try = PIECE
            if len(buf) < PIECE:
                continue
        res = _split(buf, final=False, new_from=tried)
        if res is None:
            if len(buf) > MAX_PIECE:
                raise InputError(f"{p}: invalid JSON in traceEvents (no event boundary in {len(buf):,} bytes)")
            tried, next_try = len(buf), min(2 * len(buf), MAX_PIECE + 1)
            continue
        evs, rest, _closed = res  # never closed here: the array's end is found by the final split
        acc.consume(evs)
        del evs
        buf, tried, next_try = bytearray(rest), 0, PIECE
    data = bytes(buf)
    del buf
    if meta is None:
        found = _find_events_start(data, p)
        if found is None:
            what = "empty file" if not data.strip() else 'not a torch.profiler trace (no "traceEvents" array found)'
            raise InputError(f"{p}: {what}")
        start, meta = found
        data = data[start:]
    if len(data) > MAX_PIECE:
        raise InputError(f"{p}: invalid JSON in traceEvents (no event boundary in {len(data):,} bytes)")
    res = _split(data, final=True)
    if res is None:
        raise InputError(f"{p}: invalid or truncated JSON in traceEvents (could not decode the last "
                         f"{len(data):,} bytes)")
    evs, tail, _closed = res
    acc.consume(evs)
    del evs
    meta.update(_tail_meta(tail))
    return _finish(p, rank, meta, acc)


def _finish(p: Path, rank: int | None, meta: dict[str, Any], acc: Accumulator) -> RankTrace:
    warnings: list[str] = []
    if acc.events == 0:
        raise InputError(f"{p}: trace has no events")
    unknown = {str(k): v for k, v in acc.cats.items()
               if k not in KNOWN_SKIPPED and k not in GPU_CATS and k not in RUNTIME_CATS
               and k not in CPU_OP_CATS and k not in ANNOTATION_CATS}
    if unknown:
        top = ", ".join(f"{k} ({v})" for k, v in sorted(unknown.items(), key=lambda kv: -kv[1])[:5])
        warnings.append(f"{p.name}: unknown event categories ignored: {top}")
    frames = acc.frames()
    if acc.ranges_unpaired:
        warnings.append(f"{p.name}: {acc.ranges_unpaired} annotation begin/end events without their pair were ignored")
    bad = {"without a numeric timestamp": 0, "without a numeric duration": 0, "with a negative duration": 0}
    for key, f in frames.items():
        ts = f["ts_us"].to_numpy()
        dur = f["dur_us"].to_numpy()
        m_ts, m_dur, m_neg = ~np.isfinite(ts), ~np.isfinite(dur), dur < 0
        drop = m_ts | m_dur | m_neg
        if drop.any():
            bad["without a numeric timestamp"] += int(m_ts.sum())
            bad["without a numeric duration"] += int((m_dur & ~m_ts).sum())
            bad["with a negative duration"] += int((m_neg & ~m_ts).sum())
            frames[key] = f[~drop].reset_index(drop=True)
    warnings += [f"{p.name}: {n} events {what} were ignored" for what, n in bad.items() if n]
    unit = "us"
    ts_max = max((float(f["ts_us"].max()) for f in frames.values() if len(f)), default=0.0)
    if ts_max > 1e17:  # µs since 1970 are ~1.7e15; larger values are nanoseconds
        unit = "ns"
        warnings.append(f"{p.name}: timestamps look like nanoseconds (max {ts_max:.3g}); converted to µs")
        for f in frames.values():
            f["ts_us"] = f["ts_us"] / 1000.0
            f["dur_us"] = f["dur_us"] / 1000.0
    gpu = frames["gpu"]
    for k in ("corr", "ext_id", "bytes", "device"):
        gpu[k] = np.nan_to_num(gpu[k].to_numpy(), nan=-1).astype(np.int64)
    frames["runtime"]["corr"] = np.nan_to_num(frames["runtime"]["corr"].to_numpy(), nan=-1).astype(np.int64)
    r = rank
    dist = meta.get("distributedInfo")
    if r is None and isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        r = int(dist["rank"])
    return RankTrace(path=p, rank=r if r is not None else 0, meta=_small_meta(meta, acc.meta_events),
                     gpu=gpu, runtime=frames["runtime"], cpu_ops=frames["cpu_ops"],
                     annotations=frames["annotations"], python=frames.get("python"),
                     step_frames=frames["step_frames"],
                     categories={str(k): v for k, v in acc.cats.items()}, warnings=warnings,
                     events_total=acc.events, time_unit=unit)


def _small_meta(meta: dict[str, Any], meta_events: list[Event]) -> dict[str, Any]:
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
    out["process_names"] = sorted({str(e.args.name if e.args is not None else None) for e in meta_events
                                   if e.name == "process_name"})
    return out
