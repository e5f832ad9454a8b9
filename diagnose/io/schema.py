"""The schema of every stream record a bundle holds, checked as each record is read (docs/bundle-format.md).

Each stream (and, for ``host_samples`` / ``gpu_samples``, each record ``kind``) has a msgspec Struct below that
states the type and range of every field the analysis reads; fields nobody reads are not checked. A record is
checked by converting the decoded dict to its Struct (:func:`check`); the reader keeps the dict, so the
normalisers read records exactly as before, but only records that passed. A record that does not match (a
string where a number belongs, a timestamp outside int64, a negative latency) is skipped, and the reader
counts it with its file and line (diagnose/io/bundle.py ``Bundle.iter_records``).

Ranges: timestamps (``*_ns``) are integers within +-2**62 ns (so differences never overflow int64); other
numbers are finite and within +-1e18 (so sums and unit conversions stay finite); counts are non-negative.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

NS = Annotated[int, Meta(ge=-(2**62), le=2**62)]  # a CLOCK_MONOTONIC or unix timestamp, ns
Num = Annotated[float, Meta(ge=-1e18, le=1e18)]  # any finite measurement
NonNeg = Annotated[float, Meta(ge=0, le=1e18)]
Count = Annotated[int, Meta(ge=0, le=2**53)]
PhaseIdx = Annotated[int, Meta(ge=0, le=1_000_000)]
Pid = Annotated[int, Meta(ge=0, le=2**62)]
GpuIdx = Annotated[int, Meta(ge=0, le=65535)]
LagMs = Annotated[float, Meta(ge=0, le=1e9)]  # an event-loop lag cannot be negative
Key = str | int  # a request id


class _Rec(Struct, forbid_unknown_fields=False):
    """Base: unknown keys are allowed (newer writers add fields; the analysis ignores them)."""


# -- load probe --------------------------------------------------------------------------------------------
class Request(_Rec):
    rid: Key
    phase: PhaseIdx = 0
    warmup: bool = False
    ok: bool = False
    capped: bool | None = None
    sent_ns: NS | None = None
    headers_ns: NS | None = None
    first_token_ns: NS | None = None
    end_ns: NS | None = None
    intended_ns: NS | None = None
    http_status: Annotated[int, Meta(ge=0, le=999)] | None = None
    error: str | None = None
    error_detail: str | dict[str, Any] | None = None
    api: str | None = None
    prompt_tokens: Count | None = None
    prompt_tokens_source: str | None = None
    prompt_tokens_usage: Count | None = None
    max_tokens: Count | None = None
    output_tokens_usage: Count | None = None
    output_tokens_chunks: Count | None = None
    n_chunks: Count | None = None
    cached_tokens: Count | None = None
    finish_reason: str | None = None
    trace_id: str | None = None
    span_id: str | None = None
    session: str | int | None = None  # its task (attach --turns) or a replayed file's session
    turn: Count | None = None
    turns: Count | None = None
    attempt: Count | None = None
    retry_after_s: NonNeg | None = None  # the server's Retry-After (429/503), seconds

    def __post_init__(self) -> None:
        if self.sent_ns is not None:
            if self.first_token_ns is not None and self.first_token_ns < self.sent_ns:
                raise ValueError("first_token_ns is before sent_ns (a negative TTFT)")
            if self.end_ns is not None and self.end_ns < self.sent_ns:
                raise ValueError("end_ns is before sent_ns (a negative latency)")


class Chunks(_Rec):
    rid: Key
    t_ns: list[NS]
    tok: list[Count | None] | None = None

    def __post_init__(self) -> None:
        t = self.t_ns
        if any(b < a for a, b in zip(t, t[1:], strict=False)):
            raise ValueError("t_ns goes backwards (a negative inter-token gap)")


class PhaseRec(_Rec):
    phase: PhaseIdx = 0
    name: str | None = None
    role: Literal["baseline", "measure"] | None = None
    repeat: Count | None = None
    mode: str | None = None
    concurrency: NonNeg | None = None
    rate: NonNeg | None = None
    max_concurrency: Count | None = None
    arrival: str | None = None
    burstiness: Num | None = None
    start_ns: NS | None = None
    end_ns: NS | None = None
    warmup_requests: Count | None = None
    requests: Count | None = None
    interrupted: bool | None = None

    def __post_init__(self) -> None:
        if self.start_ns is not None and self.end_ns is not None and self.end_ns < self.start_ns:
            raise ValueError("end_ns is before start_ns")


class ClientHealth(_Rec):
    t_ns: NS
    loop_lag_ms: LagMs | None = None
    in_flight: NonNeg | None = None
    cpu_percent: Annotated[float, Meta(ge=0, le=1e6)] | None = None
    stall_cause: str | None = None
    gc_pause_ms: NonNeg | None = None
    gc_generation: int | None = None
    flush_records: NonNeg | None = None


# -- Prometheus ----------------------------------------------------------------------------------------------
class Metrics(_Rec):
    t_ns: NS
    samples: list[Any] = []  # each [name, labels, value]: checked one by one (normalize/prometheus.py _index)
    scrape_ms: Num | None = None
    ttfb_ms: Num | None = None
    interval_s: Num | None = None
    parse_ms: Num | None = None
    bytes: Count | None = None


class MetricFamily(_Rec):
    name: str
    type: str | None = None
    help: str | None = None


# -- host (py-spy, /proc) ------------------------------------------------------------------------------------
class HostProcess(_Rec):
    pid: Pid
    t_ns: NS | None = None
    ppid: Pid | None = None
    role: str | None = None
    name: str | None = None
    cpus: Annotated[int, Meta(ge=1, le=1 << 20)] | None = None


class ThreadCpu(_Rec):
    t_ns: NS
    pid: Pid
    tid: Pid
    utime_s: NonNeg
    stime_s: NonNeg
    run_ns: Annotated[int, Meta(ge=0, le=2**62)]
    wait_ns: Annotated[int, Meta(ge=0, le=2**62)]
    comm: str | None = None
    cpu: Annotated[int, Meta(ge=-1, le=1 << 20)] | None = None
    state: str | None = None


class SystemCpu(_Rec):
    t_ns: NS
    user: Count = 0
    nice: Count = 0
    system: Count = 0
    idle: Count = 0
    iowait: Count = 0
    irq: Count = 0
    softirq: Count = 0
    steal: Count = 0
    ncpu: Count | None = None


class Stack(_Rec):
    pid: Pid = 0
    tid: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] = 0
    thread: str | None = None
    frames: list[str] = []
    count: Count = 0
    start_ns: NS | None = None
    end_ns: NS | None = None


class DumpThread(_Rec):
    tid: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    name: str | None = None
    active: bool | None = None
    gil: bool | None = None
    leaf: str | None = None


class Dump(_Rec):
    t_ns: NS
    pid: Pid
    threads: list[DumpThread] = []


class PyspyCost(_Rec):
    pid: Pid = 0
    mode: str | None = None
    cpu_s: NonNeg | None = None
    wall_s: NonNeg | None = None
    samples: Count | None = None
    rate_hz: NonNeg | None = None
    nonblocking: bool | None = None


class ForeignCpu(_Rec):
    t0_ns: NS
    t_ns: NS
    pid: Pid = 0
    name: str | None = None
    cpu_s: NonNeg = 0.0
    cpu: Annotated[int, Meta(ge=-1, le=1 << 20)] = -1
    own: bool | None = None


class ForeignScan(_Rec):
    t0_ns: NS
    t_ns: NS
    processes: Count = 0


# -- GPU (NVML) ----------------------------------------------------------------------------------------------
class GpuDevice(_Rec):
    gpu: GpuIdx = 0
    name: str | None = None
    mem_total_bytes: Count | None = None
    power_limit_w: NonNeg | None = None
    sm_clock_max_mhz: NonNeg | None = None
    gpm_supported: bool | None = None


class GpuSample(_Rec):
    t_ns: NS
    gpu: GpuIdx = 0
    util_gpu_ratio: Num | None = None
    util_mem_ratio: Num | None = None
    mem_used_bytes: NonNeg | None = None
    mem_total_bytes: NonNeg | None = None
    sm_clock_mhz: Num | None = None
    mem_clock_mhz: Num | None = None
    throttle_reasons: Annotated[int, Meta(ge=0, le=2**63 - 1)] | None = None
    power_w: Num | None = None
    power_limit_w: Num | None = None
    temp_c: Num | None = None
    pcie_tx_bytes_s: Num | None = None
    pcie_rx_bytes_s: Num | None = None
    nvlink_tx_bytes: Num | None = None
    nvlink_rx_bytes: Num | None = None
    dram_bw_util_ratio: Num | None = None
    sm_util_ratio: Num | None = None
    sm_occupancy_ratio: Num | None = None
    tensor_util_ratio: Num | None = None


class GpuUtil(_Rec):
    t_ns: list[NS]
    util_gpu_ratio: list[Num | None]
    gpu: GpuIdx = 0


class GpuProc(_Rec):
    pid: Pid | None = None
    used_bytes: NonNeg | None = None


class GpuProcs(_Rec):
    t_ns: NS
    gpu: GpuIdx = 0
    procs: list[GpuProc] = []


# -- llama.cpp /slots (probes/slots.py) -----------------------------------------------------------------------
class Slot(_Rec):
    id: Count | None = None
    n_ctx: Count | None = None
    busy: bool = False
    tokens: Count | None = None
    decoded: Count | None = None


class Slots(_Rec):
    t_ns: NS
    slots: list[Slot] = []


# -- OTLP spans (normalised, diagnose/io/otlp.py) ----------------------------------------------------------------
class Span(_Rec):
    trace_id: str | None = None
    span_id: str | None = None
    parent_span_id: str | None = None
    name: str | None = None
    kind: str | None = None
    start_unix_ns: NS | None = None
    end_unix_ns: NS | None = None
    source: str | None = None
    resource: dict[str, Any] | None = None
    attributes: dict[str, Any] | None = None


STREAMS: dict[str, type[Struct]] = {
    "requests": Request, "chunks": Chunks, "phases": PhaseRec, "client_health": ClientHealth, "metrics": Metrics,
    "metric_families": MetricFamily, "spans": Span, "slots": Slots,
}
KINDS: dict[str, dict[str, type[Struct]]] = {
    "host_samples": {"process": HostProcess, "thread_cpu": ThreadCpu, "system_cpu": SystemCpu, "stack": Stack,
                     "dump": Dump, "pyspy_cost": PyspyCost, "foreign_cpu": ForeignCpu, "foreign_scan": ForeignScan},
    "gpu_samples": {"device": GpuDevice, "sample": GpuSample, "util": GpuUtil, "procs": GpuProcs},
}


def check(stream: str, rec: dict[str, Any]) -> str | None:
    """None when ``rec`` (one decoded record of ``stream``) matches its schema, else why not (one short line).
    Streams and record kinds without a schema pass (the analysis does not read them)."""
    kinds = KINDS.get(stream)
    if kinds is not None:
        kind = rec.get("kind")
        typ = kinds.get(kind) if isinstance(kind, str) else None
    else:
        typ = STREAMS.get(stream)
    if typ is None:
        return None
    try:
        msgspec.convert(rec, typ)
    except msgspec.ValidationError as e:
        return str(e).replace("`$.", "`")
    return None
