"""`diagnose export BUNDLE --format perfetto`: the whole bundle on one timeline, as Chrome-trace JSON.

One file (the Chrome Trace Event Format's JSON object form, read by the Perfetto UI and ``chrome://tracing``),
on the bundle's one clock (ts 0 = the clock anchor, docs/exports.md), with these process groups:

* ``capture``: the load phases, the engine profiler's window, client stalls; counters for the client's
  requests in flight and event-loop lag;
* ``client requests``: one track per request (``request`` slice from its scheduled or send time to its end,
  children ``queued`` (open-loop schedule lag), ``TTFT`` (send -> first content chunk), ``decode`` (first
  chunk -> end); trace id, tokens and status in its args) followed by the engine's OpenTelemetry spans of the
  same trace, nested by time on their own track(s) right under it;
* ``engine spans (no client request)``: spans whose trace matched no request (start-up spans, observe mode);
* ``engine metrics``: the normalised Prometheus signals as counter tracks (gauges as values, counters as
  rates per second);
* ``GPU counters (NVML)``: one counter track per GPU and counter;
* ``py-spy · <role> (pid N)``: per process, a track per thread with each py-spy window as a slice and its
  stacks as a flame graph inside it (py-spy's raw output aggregates a window's samples, so the stacks'
  widths are their shares of the window's samples, not their times), ``py-spy dump`` snapshots as instants
  (GIL holder, active), and the process's CPU (cores) as a counter;
* ``profiler rank R · host`` / ``· GPU d``: the torch profiler's CPU ops, runtime calls, kernels
  (diagnose/export/profiler.py).

Request and output text is left out unless the bundle stored it (``attach --store-text``) and
``include_text`` is set; span attributes that carry text are dropped likewise.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import orjson
import pandas as pd

from diagnose import __version__
from diagnose.capture.profiler_window import overlaps, profiler_windows
from diagnose.export import Written
from diagnose.export.chrome import ChromeEvent, TraceBuilder, lanes
from diagnose.export.files import NothingExported, write_bytes
from diagnose.export.profiler import add_traces
from diagnose.io import schemas
from diagnose.io.bundle import Bundle

CAT_REQUEST = "request"
CAT_SPAN = "otel_span"
CAT_PYSPY = "pyspy"
_TEXT_PREFIXES = ("gen_ai.prompt", "gen_ai.completion", "gen_ai.input.messages", "gen_ai.output.messages",
                  "gen_ai.system_instructions", "gen_ai.content", "llm.prompts", "llm.input_messages",
                  "llm.output_messages", "input.value", "output.value")
GPU_COUNTERS = ("util_gpu_ratio", "util_mem_ratio", "sm_util_ratio", "sm_occupancy_ratio", "tensor_util_ratio",
                "dram_bw_util_ratio", "mem_used_ratio", "sm_clock_mhz", "mem_clock_mhz", "power_w", "temp_c",
                "pcie_tx_mb_s", "pcie_rx_mb_s", "nvlink_tx_mb_s", "nvlink_rx_mb_s")


class OtherData(TypedDict):
    """The trace's metadata (the format's ``otherData``)."""

    exporter: str
    source: str
    clock: str
    origin_t_s: float
    counts: dict[str, int]
    warnings: list[str]


class PerfettoDoc(TypedDict):
    schema_version: int
    traceEvents: list[ChromeEvent]
    displayTimeUnit: str
    otherData: OtherData


@dataclass
class PerfettoExport:
    """What was written: the trace document and counts per kind of track (the CLI prints them)."""

    doc: PerfettoDoc
    counts: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _text_key(key: str) -> bool:
    return any(key == p or key.startswith((p + ".", p + "_", p + "[")) for p in _TEXT_PREFIXES)


# -- the whole document --------------------------------------------------------------------------------------
def build(bundle: Bundle, *, include_text: bool = False) -> PerfettoExport:
    from diagnose.normalize import TableContext, client, gpu, host, prometheus
    from diagnose.normalize.trace import trace_artifacts
    from diagnose.pipeline import normalize

    tb = TraceBuilder()
    ctx = TableContext.defaults()
    tables = normalize(bundle, [client, prometheus, host, gpu], ctx) if bundle.kind == "bundle" else {}
    warnings: list[str] = list(ctx.notes)  # what the normalisers skipped (duplicate requests, malformed samples)
    amono = bundle.anchor_mono_ns if bundle.kind == "bundle" else 0
    aunix = bundle.anchor_unix_ns if bundle.kind != "trace" else 0
    counts: dict[str, int] = {}
    counts["capture_events"] = _capture(tb, bundle, tables, amono, warnings)
    stored_text = False
    if bundle.has_stream("requests") or bundle.has_stream("spans"):
        counts["requests"], counts["span_tracks"], stored_text = _requests_and_spans(tb, bundle, amono, aunix,
                                                                                     include_text, warnings)
    if include_text and not stored_text:
        warnings.append("--include-text: the bundle stored no request text (capture with attach --store-text)")
    counts["metric_counters"] = _metrics(tb, tables.get("metrics"))
    counts["gpu_counters"] = _gpu(tb, tables.get("gpu_samples"))
    counts["pyspy_threads"] = _host(tb, tables, bundle)
    arts = bundle.meta.artifacts
    files = []
    for p in trace_artifacts(bundle):
        entry = next((e for e in arts.values() if Path(e.file or "").name == p.name), None)
        files.append((p, entry))
    prof = add_traces(tb, files, anchor_unix_ns=aunix, anchor_mono_ns=amono)
    warnings += prof.warnings
    counts.update(profiler_files=prof.files, profiler_gpu_events=prof.gpu_events,
                  profiler_cpu_events=prof.cpu_events, profiler_flows=prof.flows,
                  profiler_overlap_tracks=prof.overlap_tracks)
    if bundle.kind == "bundle":
        bundle.check_streams()  # a stream that gave fewer records than the manifest counts: a warning
    origin = tb.origin_ns(at_zero=bundle.kind == "bundle")
    other: OtherData = {
        "exporter": f"diagnose {__version__}",
        "source": str(bundle.source),
        "clock": ("ts 0 = origin_t_s seconds after the bundle's clock anchor (CLOCK_MONOTONIC "
                  f"{amono} ns = Unix {aunix} ns)") if bundle.kind == "bundle" else "ts 0 = the earliest event",
        "origin_t_s": origin / 1e9,
        "counts": counts,
        "warnings": warnings,
    }
    # schema_version: a top-level key the Chrome JSON trace format reads as the trace's metadata
    doc: PerfettoDoc = {"schema_version": schemas.PERFETTO, "traceEvents": tb.events(origin), "displayTimeUnit": "ms",
           "otherData": other}
    return PerfettoExport(doc=doc, counts=counts, warnings=warnings)


def export(bundle: Bundle, out: Path, *, include_text: bool = False) -> PerfettoExport:
    """Builds and writes the trace; nothing at all to put on the timeline (every stream empty or unreadable) is
    NothingExported, and no file is written."""
    res = build(bundle, include_text=include_text)
    if not any(res.counts.values()):
        raise NothingExported(f"{bundle.source}: nothing usable to export: no phase, request, span, metric, GPU "
                              "sample, py-spy stack or profiler event could be read (see the warnings)", res.warnings)
    write_bytes(out, orjson.dumps(res.doc, option=orjson.OPT_SERIALIZE_NUMPY))
    return res


# -- capture: phases, profiler window, client self-checks ----------------------------------------------------
def _skipped(warnings: list[str], bundle: Bundle, n: int, what: str) -> None:
    if n:
        warnings.append(f"{bundle.source}: perfetto: left out {n} {what}")


def _capture(tb: TraceBuilder, bundle: Bundle, tables: dict[str, pd.DataFrame], amono: int,
             warnings: list[str]) -> int:
    """Phases, profiler windows, client stalls and self-checks; returns how many slices and points it drew."""
    if bundle.kind != "bundle":
        return 0
    pid = tb.process("capture", "capture", "capture")
    every = bundle.records("phases")
    phases = [r for r in every if _int(r.get("start_ns")) is not None]
    _skipped(warnings, bundle, len(every) - len(phases), "phases record(s) without a start time")
    drawn = len(phases)
    if phases:
        tid = tb.thread(pid, "phases", "load phases")
        for r in sorted(phases, key=lambda r: int(r["start_ns"])):
            start = int(r["start_ns"]) - amono
            end = (_int(r.get("end_ns")) or int(r["start_ns"])) - amono
            tb.slice(pid, tid, str(r.get("name") or f"phase {r.get('phase')}"), start, end, "phase",
                     {k: r.get(k) for k in ("phase", "role", "mode", "concurrency", "rate", "arrival", "requests",
                                            "interrupted")})
    windows = profiler_windows(bundle.meta)
    if windows:
        tid = tb.thread(pid, "profiler", "engine profiler window")
        ended = bundle.capture_end_unix_ns
        for a, b in windows:
            start = int(a) - amono
            if math.isfinite(b):
                end = int(b) - amono
            else:  # the capture stopped with the profiler on: the window lasts to the capture's end
                end = ended - bundle.anchor_unix_ns if ended else start
            tb.slice(pid, tid, "profiler on (requests excluded from statistics)", start, end, "profiler_window")
            drawn += 1
    stalls = tables.get("client_stalls")
    if stalls is not None and len(stalls):
        tid = tb.thread(pid, "stalls", "client stalls")
        for r in stalls.to_dict("records"):
            tb.slice(pid, tid, f"client stall: {r.get('cause')}", round(float(r["start_s"]) * 1e9),
                     round(float(r["end_s"]) * 1e9), "client_stall",
                     {k: r.get(k) for k in ("lag_ms", "gc_pause_ms", "gc_generation", "requests")})
            drawn += 1
    health = tables.get("client_health")
    if health is not None and len(health):
        for col, name in (("in_flight", "client requests in flight"), ("loop_lag_ms", "client event-loop lag (ms)"),
                          ("cpu_percent", "client CPU (%)")):
            if col in health:
                for t, v in zip(health["t_s"].to_numpy(dtype=float), health[col].to_numpy(dtype=float), strict=True):
                    tb.counter(pid, name, round(t * 1e9), v, "client_health")
                    drawn += 1
    return drawn


# -- requests and their spans -------------------------------------------------------------------------------
def _requests_and_spans(tb: TraceBuilder, bundle: Bundle, amono: int, aunix: int,
                        include_text: bool, warnings: list[str]) -> tuple[int, int, bool]:
    spans_by_trace: dict[str, list[dict[str, Any]]] = defaultdict(list)
    no_start = 0
    for s in bundle.iter_records("spans"):
        if _int(s.get("start_unix_ns")) is not None and isinstance(s.get("trace_id"), str):
            spans_by_trace[s["trace_id"]].append(s)
        else:
            no_start += 1
    _skipped(warnings, bundle, no_start, "span(s) without a start time or trace id")
    names = {r.get("phase"): r.get("name") for r in bundle.iter_records("phases")}
    every = bundle.records("requests")
    reqs = [r for r in every if _int(r.get("sent_ns")) is not None]
    _skipped(warnings, bundle, len(every) - len(reqs), "request(s) without a send time")
    reqs.sort(key=lambda r: int(r["sent_ns"]))
    windows = profiler_windows(bundle.meta)
    span_tracks = 0
    stored_text = False
    if reqs:
        pid = tb.process("requests", "client requests", "requests")
        for r in reqs:
            stored_text |= "prompt_text" in r or "output_text" in r
            _request(tb, pid, r, amono, names, windows, include_text)
            tid = r.get("trace_id")
            if isinstance(tid, str) and tid in spans_by_trace:
                span_tracks += _span_lanes(tb, pid, f"req:{r.get('rid')}", f"{r.get('rid')} · engine spans",
                                           spans_by_trace.pop(tid), aunix, include_text)
    if spans_by_trace:
        pid = tb.process("spans", "engine spans (no client request)", "spans")
        for trace_id, spans in sorted(spans_by_trace.items(), key=lambda kv: min(int(s["start_unix_ns"]) for s in kv[1])):
            root = min(spans, key=lambda s: int(s["start_unix_ns"]))
            span_tracks += _span_lanes(tb, pid, f"trace:{trace_id}", f"{root.get('name')} · trace {trace_id[:8]}",
                                       spans, aunix, include_text)
    return len(reqs), span_tracks, stored_text


def _request(tb: TraceBuilder, pid: int, r: dict[str, Any], amono: int, phase_names: dict[Any, Any],
             windows: Sequence[tuple[float, float]], include_text: bool) -> None:
    rid = str(r.get("rid"))
    sent = int(r["sent_ns"]) - amono
    end = (_int(r.get("end_ns")) or int(r["sent_ns"])) - amono
    intended = _int(r.get("intended_ns"))
    intended = intended - amono if intended is not None else None
    first = _int(r.get("first_token_ns"))
    first = min(max(first - amono, sent), end) if first is not None else None
    start = min(intended, sent) if intended is not None else sent
    end = max(end, sent)
    tid = tb.thread(pid, f"req:{rid}", f"req {rid}")
    ok = bool(r.get("ok"))
    args = {k: r.get(k) for k in ("rid", "phase", "warmup", "ok", "http_status", "error", "api", "trace_id",
                                  "span_id", "prompt_tokens", "prompt_tokens_source", "max_tokens",
                                  "output_tokens_usage", "output_tokens_chunks", "n_chunks", "finish_reason",
                                  "cached_tokens", "capped")}
    args["phase_name"] = phase_names.get(r.get("phase"))
    args["ttft_ms"] = (first - sent) / 1e6 if first is not None else None
    args["e2e_ms"] = (end - sent) / 1e6
    args["excluded_profiler"] = overlaps(float(r["sent_ns"]), float(r.get("end_ns") or r["sent_ns"]), windows)
    if include_text:
        args.update({k: r.get(k) for k in ("prompt_text", "output_text", "error_detail")})
    name = "request" if ok else f"request ({r.get('error') or 'failed'})"
    tb.slice(pid, tid, name, start, end, CAT_REQUEST, args)
    if intended is not None and intended < sent:
        tb.slice(pid, tid, "queued", intended, sent, CAT_REQUEST, {"schedule_lag_ms": (sent - intended) / 1e6})
    if first is not None:
        tb.slice(pid, tid, "TTFT", sent, first, CAT_REQUEST, {"ttft_ms": (first - sent) / 1e6})
        tb.slice(pid, tid, "decode", first, end, CAT_REQUEST, {"decode_ms": (end - first) / 1e6})
    else:
        tb.slice(pid, tid, "no first token", sent, end, CAT_REQUEST)


def _span_lanes(tb: TraceBuilder, pid: int, key: str, name: str, spans: list[dict[str, Any]], aunix: int,
                include_text: bool) -> int:
    iv = [(int(s["start_unix_ns"]) - aunix, max(_int(s.get("end_unix_ns")) or int(s["start_unix_ns"]),
                                                  int(s["start_unix_ns"])) - aunix) for s in spans]
    lane = lanes(iv)
    n = max(lane) + 1
    tids = [tb.thread(pid, f"{key}:spans:{i}", name if i == 0 else f"{name} ({i + 1})") for i in range(n)]
    for s, (a, b), ln in zip(spans, iv, lane, strict=True):
        attrs = {k: v for k, v in (s.get("attributes") or {}).items() if include_text or not _text_key(str(k))}
        args = {"trace_id": s.get("trace_id"), "span_id": s.get("span_id"), "parent_span_id": s.get("parent_span_id"),
                "kind": s.get("kind"), "service": (s.get("resource") or {}).get("service.name"),
                "status": (s.get("status") or {}).get("code"), "attributes": attrs}
        tb.slice(pid, tids[ln], str(s.get("name")), a, b, CAT_SPAN, args)
        for ev in s.get("events") or []:
            t = _int(ev.get("time_unix_ns")) if isinstance(ev, dict) else None
            if t is not None:
                tb.instant(pid, tids[ln], str(ev.get("name")), t - aunix, CAT_SPAN)
    return n


# -- counters -----------------------------------------------------------------------------------------------
def _metrics(tb: TraceBuilder, m: pd.DataFrame | None) -> int:
    if m is None or m.empty:
        return 0
    pid = tb.process("metrics", "engine metrics", "metrics")
    tracks = 0
    multi_dp = m.groupby("signal")["dp"].nunique()
    for (signal, dp), g in m.groupby(["signal", "dp"], sort=True, dropna=False):
        g = g.sort_values("t_s")
        unit = str(g["unit"].iloc[0] or "") if "unit" in g else ""
        kind = str(g["kind"].iloc[0])
        where = f" [dp {dp}]" if multi_dp.get(signal, 1) > 1 else ""
        t = g["t_s"].to_numpy(dtype=float)
        if kind == "counter":
            dt = t - g["t0_s"].to_numpy(dtype=float)
            vals = g["delta"].to_numpy(dtype=float) / dt
            name = f"{signal}{where} ({unit or 'count'}/s)"
        else:
            vals = g["value"].to_numpy(dtype=float)
            name = f"{signal}{where}" + (f" ({unit})" if unit and unit not in str(signal) else "")
        pts = [(ti, v) for ti, v in zip(t, vals, strict=True) if math.isfinite(ti) and math.isfinite(v)]
        for ti, v in pts:
            tb.counter(pid, name, round(ti * 1e9), v, "metrics")
        tracks += bool(pts)
    return tracks


def _gpu(tb: TraceBuilder, g: pd.DataFrame | None) -> int:
    if g is None or g.empty:
        return 0
    pid = tb.process("gpu", "GPU counters (NVML)", "gpu")
    tracks = 0
    for dev, d in g.sort_values("t_s").groupby("gpu", sort=True):
        t = d["t_s"].to_numpy(dtype=float)
        cols: list[tuple[str, Any]] = [(c, d[c].to_numpy(dtype=float)) for c in GPU_COUNTERS if c in d]
        cols.append(("throttle_active", d["throttle_active"].astype(float).to_numpy()))
        for col, vals in cols:
            pts = [(ti, v) for ti, v in zip(t, vals, strict=True) if math.isfinite(ti) and math.isfinite(v)]
            for ti, v in pts:
                tb.counter(pid, f"GPU{dev} {col}", round(ti * 1e9), v, "nvml")
            tracks += bool(pts)
    return tracks


# -- py-spy -------------------------------------------------------------------------------------------------
def flame(stacks: Sequence[tuple[Sequence[str], int]], start: int, end: int) -> list[tuple[int, str, int, int, int]]:
    """The stacks of one window as flame-graph slices (depth, frame, start, end, samples) laid out over
    [start, end]: stacks sorted by frames, each as wide as its share of the samples, equal prefixes merged."""
    rows = sorted((tuple(f), int(n)) for f, n in stacks if n > 0)
    total = sum(n for _, n in rows)
    if total <= 0 or end <= start:
        return []
    out: list[tuple[int, str, int, int, int]] = []
    open_: list[list[Any]] = []  # per depth: [frame, start, samples]
    cum = 0
    for frames, n in rows:
        pos = start + (end - start) * cum // total
        common = 0
        while common < len(open_) and common < len(frames) and open_[common][0] == frames[common]:
            common += 1
        while len(open_) > common:
            f, s0, k = open_.pop()
            out.append((len(open_), f, s0, pos, k))
        for f in frames[common:]:
            open_.append([f, pos, 0])
        for o in open_[: len(frames)]:
            o[2] += n
        cum += n
    while open_:
        f, s0, k = open_.pop()
        out.append((len(open_), f, s0, end, k))
    return out


def _host(tb: TraceBuilder, tables: dict[str, pd.DataFrame], bundle: Bundle) -> int:
    st = tables.get("host_stacks")
    dumps = tables.get("host_dumps")
    threads = tables.get("host_threads")
    procs = tables.get("host_processes")
    roles = {int(p): str(r) for p, r in zip(procs["pid"], procs["role"], strict=True)} if procs is not None else {}
    rate = bundle.meta.probe_detail("pyspy").get("rate_hz")

    def pid_of(p: int) -> int:
        return tb.process(f"pyspy:{p}", f"py-spy · {roles.get(p, 'other')} (pid {p})", "pyspy")

    seen: set[tuple[int, int]] = set()
    if st is not None and len(st):
        names = st.groupby(["pid", "tid"])["thread"].first()
        for (p, t, t0, t1), g in st.groupby(["pid", "tid", "t0_s", "t_s"], sort=True):
            pid = pid_of(int(p))
            tid = tb.thread(pid, f"t{int(t)}", f"{names.get((p, t)) or 'thread'} ({int(t)})")
            seen.add((int(p), int(t)))
            a, b = round(float(t0) * 1e9), round(float(t1) * 1e9)
            total = int(g["samples"].sum())
            tb.slice(pid, tid, "py-spy window", a, b, CAT_PYSPY,
                     {"samples": total, "rate_hz": rate,
                      "note": "stacks below are laid out by their share of the window's samples, not by time"})
            rows = [(s.split(";") if s else ["(no Python frames)"], int(n))
                    for s, n in zip(g["stack"], g["samples"], strict=True)]
            for _depth, f, s0, s1, k in flame(rows, a, b):
                if s1 > s0:
                    tb.slice(pid, tid, f, s0, s1, CAT_PYSPY, {"samples": k, "share": k / total})
    if dumps is not None and len(dumps):
        for r in dumps.to_dict("records"):
            if not isinstance(r.get("tid"), (int, float)) or not math.isfinite(float(r["tid"])):
                continue
            pid = pid_of(int(r["pid"]))
            tid = tb.thread(pid, f"t{int(r['tid'])}", f"{r.get('name') or 'thread'} ({int(r['tid'])})")
            seen.add((int(r["pid"]), int(r["tid"])))
            what = "holds the GIL" if r.get("gil") else ("active" if r.get("active") else "idle")
            tb.instant(pid, tid, f"py-spy dump: {what}", round(float(r["t_s"]) * 1e9), CAT_PYSPY,
                       {"gil": bool(r.get("gil")), "active": bool(r.get("active"))})
    if threads is not None and len(threads):
        per = threads.groupby(["pid", "t_s"])["cpu_ratio"].sum()
        for (p, t), v in per.items():
            tb.counter(pid_of(int(p)), "CPU (cores)", round(float(t) * 1e9), float(v), "host")
    return len(seen)


def run(bundle: Bundle, out: Path, *, include_text: bool = False) -> Written:
    """The registry's entry point (diagnose/export/__init__.py): write, and say what was written."""
    res = export(bundle, out, include_text=include_text)
    return Written(", ".join(f"{k.replace('_', ' ')} {v}" for k, v in res.counts.items() if v), list(res.warnings))
