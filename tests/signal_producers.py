"""Run every producer of signals over every input we ship and record what it emits.

Inputs: every sample bundle in sample_traces/, every trace in tests/data/traces (the lone-trace path), and a
few small synthetic inputs for the paths no shipped sample takes (a sweep with every SLO term, a bundle with
OTLP spans joined to requests, every engine setting in the manifest, a trace with mixed steps, an NVML
capture with NVLink counters from the fake NVML library, host samples with a scan of other processes), and the
readiness signals of the shipped readiness sample and of two synthetic readiness runs. Used by tests/test_signal_catalog.py.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagnose.io.bundle import Bundle
from diagnose.model import Signal, Window
from diagnose.normalize import derived, load_normalizers
from diagnose.pipeline import open_input, run_window

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"
TRACES = ROOT / "tests" / "data" / "traces"
# normalize/trace.py passes through the signals trace/signals.py computed (its table trace_signals)
PASS_THROUGH = {"diagnose.normalize.trace": "diagnose.trace.signals"}


@dataclass(frozen=True)
class Emitted:
    name: str
    unit: str
    source: str
    producer: str  # the module that computed it
    where: str  # the input it was seen on


def sample_bundles() -> list[Path]:
    return sorted(p for p in SAMPLES.glob("*/bundle") if (p / "manifest.json").exists())


def trace_inputs() -> list[Path]:
    return sorted(p for p in TRACES.iterdir() if p.is_dir() or p.name.endswith((".json", ".json.gz")))


def _emit(sigs: list[Signal], producer: str, where: str) -> Iterator[Emitted]:
    for s in sigs:
        yield Emitted(s.name, s.unit, s.source, PASS_THROUGH.get(producer, producer), where)


def from_bundle(path: Path) -> list[Emitted]:
    return from_input(open_input(path), str(path))


def from_trace(path: Path) -> list[Emitted]:
    """A lone trace goes through the same stages, adapted into an in-memory bundle (pipeline.open_input)."""
    return from_input(open_input(path), str(path))


def from_input(b: Bundle, where: str) -> list[Emitted]:
    """Every normaliser over the run window, each phase window and all time (a synthetic bundle's manifest
    window need not cover its records), then the derived signals of the run window."""
    mods = load_normalizers()
    tables = {}
    for m in mods:
        tables.update(m.tables(b))
    phases = b.phases()
    out: list[Emitted] = []
    run: dict[str, Signal] = {}
    per_phase: dict[int, dict[str, Signal]] = {}
    windows = [run_window(b, phases), *(p.window() for p in phases), Window(-math.inf, math.inf)]
    for i, w in enumerate(windows):
        got: dict[str, Signal] = {}
        for m in mods:
            sigs = [s for s in m.signals(tables, w) if s.is_finite()]
            out.extend(_emit(sigs, m.__name__, where))
            got.update({s.name: s for s in sigs})
        if i == 0:
            run = got
        elif i <= len(phases):
            per_phase[phases[i - 1].phase] = got
    d = derived.signals(run, phases, per_phase, derived.slo_terms(b.meta))
    out.extend(_emit(list(d.values()), derived.__name__, where))
    return out


# -- synthetic inputs for the paths no shipped sample takes ---------------------------------------------------
def synthetic_sweep_with_every_slo(tmp: Path) -> Path:
    """Two load levels (sweep_* signals), every SLO term (slo_*, *_over_slo_ratio), client self-check."""
    from diagnose.normalize.derived import PCTS, SLO_METRICS
    from tests.test_client_metrics import make_bundle, req

    reqs, chunks = [], []
    for ph, ttft in ((0, 10), (1, 40)):
        for i in range(8):
            sent = ph * 1000 + i * 100
            reqs.append({**req(f"p{ph}-{i}", sent, sent + ttft + 20, first=sent + ttft, n=3, phase=ph),
                         "body_bytes": 700})  # the streamed answer's size (stream_bytes_per_token_mean)
            chunks.append({"rid": f"p{ph}-{i}", "t": [sent + ttft, sent + ttft + 10, sent + ttft + 20],
                           "tok": [1, 1, 1]})
    phases = [{"phase": 0, "name": "c=1", "concurrency": 1, "start": 0, "end": 900},
              {"phase": 1, "name": "c=4", "concurrency": 4, "start": 1000, "end": 1900}]
    health = [{"t": i * 100, "loop_lag_ms": 0.3, "in_flight": 4, "cpu_percent": 40.0} for i in range(20)]
    slo = {f"{m}_{p}_ms": 100.0 for m in SLO_METRICS for p in PCTS}
    make_bundle(tmp, reqs, chunks, health=health, phases=phases, slo=slo)
    return tmp / "b"


def synthetic_otel_join(tmp: Path) -> Path:
    from tests.test_otel_join import _bundle

    return _bundle(tmp, n=50)  # enough requests for the slow requests' own split (the 5 at or above the P90)


def sample_with_engine_config(tmp: Path) -> Path:
    """A shipped sample whose manifest states every engine setting (as a server info endpoint would), its
    requests asking for log-probabilities (attach --logprobs; no shipped sample does)."""
    from diagnose.normalize.prometheus import ENGINE_SETTINGS

    dst = tmp / "bundle"
    shutil.copytree(SAMPLES / "vllm_cpu_queue_bound" / "bundle", dst)
    m = json.loads((dst / "manifest.json").read_text())
    m["target"]["engine_config"] = {key: 2 for key in ENGINE_SETTINGS}
    m["workload"].setdefault("extra", {})["logprobs"] = 20
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def synthetic_mixed_steps_trace(tmp: Path) -> Path:
    from tests.trace.helpers import annotation, kernel, launch, write_trace

    evs = []
    t = 0.0
    for i, (ctx, dur) in enumerate([(0, 100), (0, 110), (1, 300), (0, 100), (1, 330)]):
        evs.append(annotation(f"execute_context_{ctx}({ctx * 64})_generation_4(4)", t, dur))
        evs.append(launch("cudaLaunchKernel", t + 1, 2, i))
        evs.append(kernel("void vllm::rms_norm_kernel", t + 5, 30, i))
        t += dur + 20
    return write_trace(tmp / "mixed.json", evs)


def synthetic_nvml_with_nvlink(tmp: Path) -> Path:
    from tests.fakes.fake_nvml import scenario
    from tests.test_nvml_probe import capture

    _, b = capture(tmp, scenario("busy"), seconds=0.8)
    return Path(b.path)


def synthetic_short_client_stall(tmp: Path) -> Path:
    from tests.test_client_stall import _bundle

    return _bundle(tmp, [5.0], 500.0)


def synthetic_host_with_foreign_scan(tmp: Path) -> Path:
    """Host samples with the probe's scan of processes outside the engine (no shipped sample has one yet)."""
    from tests.test_host_normalize import engine_loop_and_worker

    engine_loop_and_worker(tmp, 0.28, 0.72, foreign=[{"pid": 777, "name": "python3", "cores": 0.95, "core": 0}])
    return tmp / "b"


def synthetic_fleet(tmp: Path) -> Path:
    """A fleet bundle (diagnose attach --prometheus) from the answers recorded from a real Prometheus."""
    from tests.fleet_prom import recorded_bundle

    return recorded_bundle(tmp / "fleet")


def synthetic_tasks(tmp: Path) -> Path:
    """Tasks of several turns with retries and an SLO (attach --turns; no shipped sample has them)."""
    from tests.test_client_metrics import make_bundle
    from tests.test_tasks import TASKS

    make_bundle(tmp, TASKS, [], slo={"e2e_p99_ms": 35.0})
    return tmp / "b"


def synthetic_every_error_class(tmp: Path) -> Path:
    """One failed request of every error class (diagnose/normalize/errors.py), a Retry-After, a server that
    stopped and came back (no shipped sample fails that way)."""
    from tests.test_client_metrics import make_bundle
    from tests.test_errors_taxonomy import PHASE, VLLM_REQUESTED, _failed, req

    reqs = [req("ok0", 0, 5, first=1, n=3), _failed("ctx", 10, VLLM_REQUESTED),
            _failed("429", 20, "HTTP 429: slow down", status=429, error="http_429", retry_after_s=1.0),
            _failed("401", 30, "HTTP 401: no", status=401), _failed("404", 40, "HTTP 404: no model", status=404),
            _failed("400", 50, "HTTP 400: bad field"), _failed("504", 60, "HTTP 504: gw", status=504, error="http_5xx"),
            _failed("500", 70, "HTTP 500: oops", status=500, error="http_5xx"),
            _failed("reset", 80, "connection closed", status=0, error="reset"),
            _failed("timeout", 90, "no answer", status=200, error="timeout"),
            _failed("sse", 100, "not an event stream", status=200, error="malformed_sse"),
            req("ok1", 110, 115, first=111, n=3)]
    make_bundle(tmp, reqs, [], phases=PHASE)
    return tmp / "b"


READINESS_SAMPLE = SAMPLES / "readiness_vllm_cpu" / "readiness.json"
# the readiness paths the shipped vLLM sample does not take: llama.cpp's slots left busy, vLLM's counts left
# with a KV cache, stale gauges, a kept stream broken, a first request failed against an SLO, an overload with
# errors, rejections and the client's cap met, a restart that failed
_STEP = {"factor": 2.0, "rate_rps": 10.0, "done_rps": 4.0, "sent": 40, "planned": 40, "ok": 20, "rejected": 12,
         "rejected_with_retry_after": 3, "errors": 2, "error_examples": ["timeout: no bytes in 60 s"],
         "client_capped": 6, "open_capped": 6, "ttft_p99_ms": 900.0, "e2e_p50_ms": 300.0}
READINESS_SYNTHETIC = (
    {"cancellation": {"streams": 4, "aborted": 2, "before": {"in_flight": 0}, "release_s": 0.2, "idle_s": None,
                      "leaked": 2, "leaked_state": {"in_flight": 2, "busy_slots": [0, 3]},
                      "kept_failed": ["reset: connection reset"]},
     "cold_start": {"first_request_failed": "http_503: loading", "first_ttft_ms": 40.0}, "slo": {"ttft_p99_ms": 30},
     "overload": {"capacity_rps": 5.0, "max_in_flight": 8, "recovery_s": 3.0, "steps": [_STEP]},
     "failure": {"restart_failed": "exited with status 1", "health_gap_s": None}},
    {"cancellation": {"streams": 4, "aborted": 2, "before": {"in_flight": 0}, "release_s": 0.2, "idle_s": None,
                      "stale_gauge": {"in_flight": 2}, "leaked_during": {"in_flight": 3, "running": 3.0,
                                                                         "waiting": 0.0, "kv_usage": 0.02}},
     "cold_start": None, "slo": {}, "overload": None, "failure": None},
)


def from_readiness(measurements: Mapping[str, Any], thresholds: Mapping[str, float], slo: Mapping[str, float],
                   where: str) -> list[Emitted]:
    from diagnose.readiness import signals as rsig

    m = measurements
    sigs = {**rsig.cancellation(m.get("cancellation")), **rsig.cold_start(m.get("cold_start"), slo),
            **rsig.overload(m.get("overload"), thresholds, slo), **rsig.failure(m.get("failure"))}
    return list(_emit(list(sigs.values()), rsig.__name__, where))


def readiness_emitted() -> list[Emitted]:
    doc = json.loads(READINESS_SAMPLE.read_text())
    out = from_readiness(doc["measurements"], doc["thresholds"], doc["slo"], str(READINESS_SAMPLE))
    for i, m in enumerate(READINESS_SYNTHETIC):
        out += from_readiness(m, doc["thresholds"], m["slo"], f"synthetic readiness #{i + 1}")
    return out


def emitted_everywhere(tmp: Path) -> list[Emitted]:
    out: list[Emitted] = []
    for b in sample_bundles():
        out.extend(from_bundle(b))
    for t in trace_inputs():
        out.extend(from_trace(t))
    for i, make in enumerate((synthetic_sweep_with_every_slo, synthetic_otel_join, sample_with_engine_config,
                              synthetic_nvml_with_nvlink, synthetic_short_client_stall,
                              synthetic_host_with_foreign_scan, synthetic_fleet, synthetic_tasks,
                              synthetic_every_error_class)):
        d = tmp / f"s{i}"
        d.mkdir()
        out.extend(from_bundle(make(d)))
    d = tmp / "trace"
    d.mkdir()
    out.extend(from_trace(synthetic_mixed_steps_trace(d)))
    out.extend(readiness_emitted())
    return out


