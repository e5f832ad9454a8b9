"""`diagnose export --format perfetto`: the bundle's timeline as Chrome-trace JSON.

Validation: no real trace parser runs offline here (the ``perfetto`` package's TraceProcessor downloads its
binary on first use and fails without a network), so every export is decoded by tests/chrome_trace_schema.py:
strict msgspec Structs per event phase (unknown fields forbidden, ts/dur >= 0), every pid/tid named, slices on
each thread properly nested (what Perfetto and chrome://tracing need to draw one track), every flow paired.
On top: track counts per kind against the bundle's own records, and each request's engine spans inside its
request slice.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from diagnose.cli.main import cli
from diagnose.export import perfetto
from diagnose.export.chrome import lanes
from diagnose.export.files import write_file
from diagnose.io.writer import BundleWriter
from diagnose.normalize import client, gpu, host, prometheus
from diagnose.pipeline import normalize, open_input
from diagnose.trace.parse import read_trace
from tests.chrome_trace_schema import (
    Complete,
    Counter,
    FlowEnd,
    FlowStart,
    Instant,
    TraceFile,
    load,
    names,
    tracks,
)

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted(p.name for p in (ROOT / "sample_traces").iterdir() if (p / "bundle" / "manifest.json").exists())
TRACES = ROOT / "tests" / "data" / "traces"
MS = 1_000_000


def exported(source: Path, tmp_path: Path, **kw: Any) -> tuple[TraceFile, perfetto.PerfettoExport]:
    out = tmp_path / "t.perfetto.json"
    res = perfetto.export(open_input(source), out, **kw)
    return load(out.read_bytes()), res


def slices(tf: TraceFile, pid: int | None = None) -> list[Complete]:
    return [e for e in tf.traceEvents if isinstance(e, Complete) and (pid is None or e.pid == pid)]


def pid_named(tf: TraceFile, prefix: str) -> list[int]:
    return [p for p, n in names(tf)[0].items() if n.startswith(prefix)]


# -- every sample ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sample", SAMPLES)
def test_every_sample_exports_a_valid_timeline_with_one_track_per_source_record(sample: str, tmp_path: Path) -> None:
    src = ROOT / "sample_traces" / sample
    tf, res = exported(src, tmp_path)
    b = open_input(src)
    t = normalize(b, [client, prometheus, host, gpu])
    procs, threads = names(tf)
    tr = tracks(tf)

    # one track per client request, each with exactly one request slice, TTFT + decode equal to the analysis's
    reqs = b.records("requests")
    req_tracks = {n: s for n, s in tr["client requests"].items() if n.startswith("req ")}
    assert len(req_tracks) == len(reqs) == res.counts["requests"]
    assert all(sum(x.startswith("request") for x in s) == 1 for s in req_tracks.values())
    (rpid,) = pid_named(tf, "client requests")
    by_rid = {e.args["rid"]: e for e in slices(tf, rpid) if e.name.startswith("request")}
    ttft = dict(zip(t["requests"]["rid"], t["requests"]["ttft_ms"], strict=True))
    for rid, e in by_rid.items():
        if "ttft_ms" in e.args:
            assert e.args["ttft_ms"] == pytest.approx(ttft[rid], abs=1e-6)
        assert e.args.get("trace_id") == next(r.get("trace_id") for r in reqs if r["rid"] == rid)
    phases = [e for e in slices(tf) if e.cat == "phase"]
    assert len(phases) == len(b.records("phases"))

    # engine metrics: one counter track per normalised signal (and dp) with a finite value
    counters = {e.name for e in tf.traceEvents if isinstance(e, Counter) and procs[e.pid] == "engine metrics"}
    m = t.get("metrics")
    assert len(counters) == (m.groupby(["signal", "dp"]).ngroups if m is not None and len(m) else 0) \
        == res.counts["metric_counters"]

    # NVML: one counter track per GPU and reported counter
    g = t["gpu_samples"]
    gcounters = {e.name for e in tf.traceEvents if isinstance(e, Counter) and procs[e.pid] == "GPU counters (NVML)"}
    expected = {f"GPU{d} {c}" for c in (*perfetto.GPU_COUNTERS, "throttle_active") if c in g
                for d, v in g.groupby("gpu")[c] if v.astype(float).notna().any()} if len(g) else set()
    assert gcounters == expected

    # py-spy: one track per sampled thread, its windows' samples add up to the bundle's
    st, dumps = t["host_stacks"], t["host_dumps"]
    want = {(int(p), int(tid)) for p, tid in zip(st["pid"], st["tid"], strict=True)}
    want |= {(int(p), int(tid)) for p, tid in zip(dumps["pid"], dumps["tid"], strict=True)}
    pyspy = [k for k in threads if procs[k[0]].startswith("py-spy")]
    assert len(pyspy) == len(want) == res.counts["pyspy_threads"]
    windows = [e for e in slices(tf) if e.name == "py-spy window"]
    assert sum(e.args["samples"] for e in windows) == int(st["samples"].sum())

    # the profiler trace, when the bundle has one: every kernel, aligned inside the profiler window
    arts = [a for a in b.manifest["artifacts"].values() if a.get("kind") == "torch_trace" and a.get("role") != "frontend"]
    kernels = [e for e in slices(tf) if e.cat in ("kernel", "gpu_memcpy", "gpu_memset")]
    if arts:
        rt = read_trace(b.path / arts[0]["file"])
        assert len(kernels) == len(rt.gpu) > 0
        (win,) = [e for e in slices(tf) if e.cat == "profiler_window"]
        assert win.ts <= min(k.ts for k in kernels) and max(k.ts + k.dur for k in kernels) <= win.ts + win.dur
        assert sum(isinstance(e, FlowStart) for e in tf.traceEvents) == res.counts["profiler_flows"] > 0
    else:
        assert kernels == []


# -- spans joined to requests ------------------------------------------------------------------------------
def span(tid: str, span_id: str, parent: str | None, name: str, start_unix: int, dur_ms: float,
         **attrs: Any) -> dict[str, Any]:
    return {"trace_id": tid, "span_id": span_id, "parent_span_id": parent, "name": name, "kind": "SERVER",
            "start_unix_ns": start_unix, "end_unix_ns": start_unix + int(dur_ms * MS), "attributes": attrs,
            "resource": {"service.name": "vllm"}, "status": {"code": "OK"}, "source": "grpc-protobuf",
            "events": [{"name": "first_token", "time_unix_ns": start_unix + 5 * MS}]}


def spans_bundle(tmp_path: Path, n: int = 6, *, store_text: bool = False) -> Path:
    """Requests sent every 100 ms, each with an ``llm_request`` span 2 ms after the send and 4 ms before the
    end, holding one child span (and, for request 0, a second child that overlaps the first); a start-up span
    no request matches; one span attribute that carries prompt text."""
    bw = BundleWriter(tmp_path / "spans_bundle")
    reqs, spans = [], []
    for i in range(n):
        sent = bw.anchor_mono_ns + 1000 * MS + i * 100 * MS
        tid = f"{i + 1:032x}"
        rec: dict[str, Any] = {"rid": f"r{i}", "phase": 0, "warmup": False, "ok": True, "sent_ns": sent,
                               "first_token_ns": sent + 30 * MS, "end_ns": sent + 80 * MS, "trace_id": tid,
                               "span_id": f"{i + 1:016x}", "prompt_tokens": 10, "output_tokens_chunks": 5}
        if store_text:
            rec.update(prompt_text=f"secret prompt {i}", output_text="secret output")
        reqs.append(rec)
        arrival = bw.anchor_unix_ns + (sent - bw.anchor_mono_ns) + 2 * MS
        spans.append(span(tid, f"a{i:015x}", f"{i + 1:016x}", "llm_request", arrival, 74,
                          **{"gen_ai.latency.time_to_first_token": 0.027, "gen_ai.prompt": "secret prompt"}))
        spans.append(span(tid, f"b{i:015x}", f"a{i:015x}", "prefill", arrival + 3 * MS, 20))
        if i == 0:
            spans.append(span(tid, f"c{i:015x}", f"a{i:015x}", "overlapping", arrival + 10 * MS, 30))
    spans.append(span("ff" * 16, "f" * 16, None, "Load model", bw.anchor_unix_ns - 500 * MS, 300))
    bw.stream("requests").write_many(reqs)
    bw.stream("spans").write_many(spans)
    bw.finish()
    return bw.path


def test_each_requests_spans_lie_inside_its_request_slice(tmp_path: Path) -> None:
    tf, res = exported(spans_bundle(tmp_path), tmp_path)
    procs, threads = names(tf)
    (rpid,) = pid_named(tf, "client requests")
    reqs = {e.args["rid"]: e for e in slices(tf, rpid) if e.name == "request"}
    assert len(reqs) == 6
    span_slices = [e for e in slices(tf, rpid) if e.cat == "otel_span"]
    assert len(span_slices) == 6 * 2 + 1
    for e in span_slices:
        owner = threads[(e.pid, e.tid)].split(" · ")[0]
        r = reqs[owner]
        assert e.args["trace_id"] == r.args["trace_id"]
        assert r.ts <= e.ts and e.ts + e.dur <= r.ts + r.dur, (owner, e.name)
    # the overlapping child of r0 needs a second span track; the others nest on one
    assert res.counts["span_tracks"] == 6 + 1 + 1
    assert sum(threads[k].startswith("r0 · engine spans") for k in threads) == 2
    # the start-up span: its own process, before the anchor, so ts 0 moves back to it (ts stays >= 0)
    (spid,) = pid_named(tf, "engine spans (no client request)")
    (load_model,) = slices(tf, spid)
    assert load_model.name == "Load model" and load_model.ts == 0
    assert tf.otherData.origin_t_s == pytest.approx(-0.5)
    assert reqs["r0"].ts == pytest.approx(1.5e6, abs=1)  # sent at t_s = 1.0, 0.5 s after the new origin
    instants = [e for e in tf.traceEvents if isinstance(e, Instant) and e.cat == "otel_span"]
    assert len(instants) == len(span_slices) + 1


def test_text_is_left_out_unless_stored_and_asked_for(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain, stored = spans_bundle(tmp_path / "a"), spans_bundle(tmp_path / "b", store_text=True)
    out = tmp_path / "t.perfetto.json"
    for src in (plain, stored):  # without the flag: no text, stored or not (span text attributes neither)
        perfetto.export(open_input(src), out)
        assert b"secret" not in out.read_bytes()
    res = perfetto.export(open_input(stored), out, include_text=True)
    data = out.read_bytes()
    assert b"secret prompt 3" in data and b'"gen_ai.prompt"' in data and not res.warnings
    load(data)
    res = perfetto.export(open_input(plain), out, include_text=True)
    assert b"secret prompt 3" not in out.read_bytes()
    assert any("stored no request text" in w for w in res.warnings)


# -- a bare profiler trace --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["h100_single_gpu_qwen1.5_0.5b_chat.json.gz", "vllm_cpu_0.32_worker_rank0_c8.pt.trace.json.gz"])
def test_a_bare_trace_is_re_emitted_normalised(name: str, tmp_path: Path) -> None:
    path = TRACES / name
    tf, res = exported(path, tmp_path)
    rt = read_trace(path)
    procs = names(tf)[0]
    assert set(procs.values()) <= {"profiler rank 0 · host (python3)", "profiler rank 0 · host (VLLM::Worker)",
                                   "profiler rank 0 · GPU 0"}
    gpu_ev = [e for e in slices(tf) if e.cat in ("kernel", "gpu_memcpy", "gpu_memset")]
    cpu_ev = [e for e in slices(tf) if e.cat in ("cpu_op", "cuda_runtime")]
    assert len(gpu_ev) == len(rt.gpu) and len(cpu_ev) == len(rt.cpu_ops) + len(rt.runtime)
    assert 0 <= min(e.ts for e in slices(tf)) < 1  # ts 0 = the trace's earliest event, floored to 1 µs
    # durations are kept to the nanosecond
    got = sorted(e.dur for e in cpu_ev if e.cat == "cpu_op")
    assert got == pytest.approx(sorted(rt.cpu_ops["dur_us"]), abs=1.5e-3)
    assert res.counts["profiler_files"] == 1


# -- the pieces ------------------------------------------------------------------------------------------
def test_lanes_keep_nested_spans_on_one_track_and_split_overlaps() -> None:
    assert lanes([(0, 100), (10, 20), (20, 30), (30, 100)]) == [0, 0, 0, 0]
    assert lanes([(0, 50), (40, 90), (60, 70)]) == [0, 1, 0]
    assert lanes([]) == []


def test_flame_layout_is_proportional_nested_and_merges_prefixes() -> None:
    rows = [(["main", "a", "x"], 2), (["main", "b"], 1), (["main", "a", "y"], 1)]
    got = perfetto.flame(rows, 0, 400)
    by = {(d, f): (s, e, n) for d, f, s, e, n in got}
    assert by[(0, "main")] == (0, 400, 4)
    assert by[(1, "a")] == (0, 300, 3) and by[(1, "b")] == (300, 400, 1)
    assert by[(2, "x")] == (0, 200, 2) and by[(2, "y")] == (200, 300, 1)
    assert len(got) == 5 and perfetto.flame([], 0, 10) == []


# -- the command ------------------------------------------------------------------------------------------
def test_cli_writes_the_file_and_reports_bad_input_in_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "x.json"
    r = runner.invoke(cli, ["export", str(ROOT / "sample_traces" / "vllm_cpu_healthy"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "perfetto:" in r.output and out.stat().st_size > 0
    load(out.read_bytes())
    cases = [
        (["export", str(ROOT / "sample_traces" / "vllm_cpu_healthy"), "--format", "pdf"], 2, "'pdf'"),
        (["export", str(tmp_path / "missing")], 2, str(tmp_path / "missing")),
        (["export", str(ROOT / "sample_traces" / "vllm_cpu_healthy"), "-o", str(tmp_path / "no" / "x.json")], 1,
         str(tmp_path / "no" / "x.json")),
        (["export", str(ROOT / "sample_traces" / "vllm_cpu_healthy"), "-o", str(tmp_path)], 1, str(tmp_path)),
    ]
    for args, code, named in cases:
        r = runner.invoke(cli, args)
        assert r.exit_code == code, (args, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("diagnose: error:") and named in lines[0], r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]  # no temporary file left behind


def test_a_failed_write_leaves_neither_the_file_nor_a_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.json"

    def broken(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_file(target, broken)
    assert list(tmp_path.iterdir()) == []
    write_file(target, lambda tmp: tmp.write_text("whole") and None)
    assert target.read_text() == "whole" and list(tmp_path.iterdir()) == [target]


def test_export_help_imports_no_pandas() -> None:
    code = ("import sys\nfrom diagnose.cli.main import cli\ntry:\n    cli(['export', '--help'], prog_name='diagnose')\n"
            "except SystemExit:\n    pass\nprint([m for m in ('pandas', 'numpy') if m in sys.modules])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip().splitlines()[-1] == "[]", p.stdout + p.stderr
    assert "perfetto" in p.stdout and "speedscope" in p.stdout and "parquet" in p.stdout


def test_overlapping_profiler_events_get_their_own_track_and_flows_follow_them(tmp_path: Path) -> None:
    """A source stream whose kernels partly overlap (a ROCm trace does this) becomes two tracks, each nested;
    the launch arrows point at the kernel where it now is."""
    ev = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10.0, "dur": 2.0,
           "args": {"correlation": 1}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 13.0, "dur": 2.0,
           "args": {"correlation": 2}},
          {"ph": "X", "cat": "kernel", "name": "k1", "pid": 0, "tid": 7, "ts": 20.0, "dur": 10.0,
           "args": {"correlation": 1, "device": 0, "stream": 7}},
          {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 25.0, "dur": 10.0,
           "args": {"correlation": 2, "device": 0, "stream": 7}}]
    path = tmp_path / "overlap.json"
    path.write_bytes(orjson.dumps({"traceEvents": ev, "baseTimeNanoseconds": 1_700_000_000_000_000_000}))
    tf, res = exported(path, tmp_path)
    _, threads = names(tf)
    assert sorted(n for n in threads.values() if n.startswith("stream")) == ["stream 7", "stream 7 (overlap 1)"]
    assert res.counts["profiler_overlap_tracks"] == 1 and res.counts["profiler_flows"] == 2
    kernels = {e.name: (e.pid, e.tid, e.ts) for e in slices(tf) if e.cat == "kernel"}
    ends = {(e.pid, e.tid, e.ts) for e in tf.traceEvents if isinstance(e, FlowEnd)}
    assert ends == set(kernels.values())
    assert kernels["k2"][2] - kernels["k1"][2] == pytest.approx(5.0)


def test_a_directory_of_rank_traces_gives_one_process_group_per_rank(tmp_path: Path) -> None:
    tf, res = exported(TRACES / "sampled_128rank", tmp_path)
    procs = set(names(tf)[0].values())
    assert res.counts["profiler_files"] == 2
    assert {p.split(" · ")[0] for p in procs} == {"profiler rank 0", "profiler rank 1"}


def test_every_export_format_is_one_registry_entry_whose_module_runs_it(tmp_path: Path) -> None:
    """Issue 32 item 5: exports behind a registry: each format's module has the registry's run(), the CLI's
    --format choices and default suffixes are the registry's, and a format written through it says what it wrote."""
    import importlib

    from diagnose.export import EXPORTERS, FORMATS, SUFFIX
    from diagnose.pipeline import open_input

    assert set(FORMATS) == set(SUFFIX) == set(EXPORTERS) == {"perfetto", "speedscope", "parquet"}
    for e in EXPORTERS.values():
        assert callable(importlib.import_module(f"diagnose.export.{e.module}").run), e.name
    written = EXPORTERS["perfetto"].run(open_input(ROOT / "sample_traces" / "vllm_cpu_queue_bound"), tmp_path / "t.json")
    assert "requests" in written.summary and (tmp_path / "t.json").stat().st_size > 0
