"""Regression tests for the analysis side of issue 12 (defects 4-10, 17, 19, 22): each fails on the code before
the fix (a6a18ad) and passes now. docs/robustness.md lists the promise each one checks."""

from __future__ import annotations

import gzip
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from diagnose.errors import DiagnoseError
from diagnose.io.bundle import open_bundle
from diagnose.pipeline import analyze as analyze_lib
from diagnose.trace.parse import read_trace
from tests.badinput import (
    REPO,
    analyze,
    check_contract,
    copy_sample,
    edit_manifest,
    edit_records,
    outcome,
    read_stream,
    stream_path,
    write_stream,
)
from tests.badinput_cases import BASE, CASES, TRACE_SAMPLE

KERNEL = b'{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 7}'


def _run_case(name: str, tmp_path: Path) -> tuple[str, object]:
    spec = CASES[name](tmp_path)
    (tmp_path / "out").mkdir()
    o = outcome(analyze(spec.args, tmp_path / "out"))
    return check_contract(o, names=spec.names, expect=spec.expect, needle=spec.needle), o


# -- defect 4: a wrong-typed field ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", [
    "record-chunks-t-string", "record-chunks-t-dict", "record-phase-string", "record-phases-concurrency-string",
    "host-thread-pid-string", "host-process-ppid-dict", "gpu-gpu-dict", "record-metrics-value-huge",
    "record-metrics-value-int-huge", "record-rid-list", "record-chunks-rid-dict", "host-system-idle-string",
])
def test_wrong_typed_record_is_skipped_and_counted_with_file_and_line(name: str, tmp_path: Path) -> None:
    why, _o = _run_case(name, tmp_path)
    assert not why


@pytest.mark.parametrize("name", ["manifest-streams-list", "manifest-artifacts-list", "manifest-workload-string",
                                  "manifest-stream-records-string", "manifest-workload-phases-dict",
                                  "manifest-slo-value-string"])
def test_wrong_typed_manifest_field_is_one_line_naming_file_and_field(name: str, tmp_path: Path) -> None:
    why, o = _run_case(name, tmp_path)
    assert not why
    assert o.code == 2  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["cli-rules-binary-yaml", "cli-rules-utf16", "cli-thresholds-binary"])
def test_binary_yaml_is_one_line_naming_the_file(name: str, tmp_path: Path) -> None:
    why, _o = _run_case(name, tmp_path)
    assert not why


# -- defect 5: a corrupt deflate block ---------------------------------------------------------------------
def test_corrupt_deflate_block_keeps_the_records_before_it(tmp_path: Path) -> None:
    b = copy_sample(BASE, tmp_path / "b")
    recs = read_stream(b, "requests")
    good = gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in recs[:10]))
    bad = bytearray(gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in recs[10:])))
    bad[10] = 0xFF  # the first deflate block header: BTYPE=11, reserved: zlib.error "invalid block type"
    p = stream_path(b, "requests")
    assert p is not None and p.name.endswith(".gz")
    p.write_bytes(good + bytes(bad))
    bundle = open_bundle(b)
    assert [r["rid"] for r in bundle.iter_records("requests")] == [r["rid"] for r in recs[:10]]
    assert any(str(p) in w and "ends early" in w for w in bundle.warnings)


# -- defect 6: the trace reader is linear ---------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_trace_without_event_boundaries_reaches_the_size_guard(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    p.write_bytes(b'{"traceEvents": [' + KERNEL + b", ")
    os.truncate(p, 2 << 30)  # a 2 GB sparse tail of zero bytes
    with pytest.raises(DiagnoseError, match="no event boundary") as e:
        read_trace(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


@pytest.mark.timeout(60)
def test_spaces_after_the_array_opens_reach_the_size_guard(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    with open(p, "wb") as fh:
        fh.write(b'{"traceEvents": [')
        for _ in range(300):
            fh.write(b" " * (1 << 20))
    with pytest.raises(DiagnoseError, match="no event boundary"):
        read_trace(p)


@pytest.mark.timeout(60)
def test_one_huge_event_is_read(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    item = b'{"a": 1}, '
    with open(p, "wb") as fh:
        fh.write(b'{"traceEvents": [' + KERNEL + b', {"ph": "X", "cat": "cpu_op", "name": "big", "ts": 3, "dur": 1, '
                 b'"pid": 0, "tid": 1, "args": {"items": [')
        for _ in range(40):  # 40 MB of "}, {" inside one event
            fh.write(item * ((1 << 20) // len(item)))
        fh.write(b'{"a": 1}]}}, ' + KERNEL + b"]}")
    rt = read_trace(p)
    assert rt.events_total == 3 and len(rt.gpu) == 2 and len(rt.cpu_ops) == 1


# -- defect 7: FIFOs and special files ----------------------------------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["file-trace-fifo", "manifest-fifo", "stream-fifo", "cli-thresholds-fifo",
                                  "file-trace-directory-of-fifo"])
def test_fifo_never_hangs(name: str, tmp_path: Path) -> None:
    why, _o = _run_case(name, tmp_path)
    assert not why


def test_devnull_linked_as_trace_says_not_a_regular_file(tmp_path: Path) -> None:
    why, o = _run_case("file-trace-devnull-link", tmp_path)
    assert not why
    assert "not a regular file" in o.error_line and "Not a directory" not in o.error_line  # type: ignore[attr-defined]


# -- defect 8: missing or emptied streams -------------------------------------------------------------------
def test_all_streams_deleted_is_no_healthy_verdict(tmp_path: Path) -> None:
    why, o = _run_case("streams-all-deleted", tmp_path)
    assert not why
    assert o.code == 5 and "No bottleneck found" not in o.stdout  # type: ignore[attr-defined]
    js = orjson.loads((tmp_path / "out" / "findings.json").read_bytes())
    assert {p["name"]: p["state"] for p in js["probes"]}["load"] == "failed"


def test_emptied_requests_compared_with_the_manifest_count(tmp_path: Path) -> None:
    why, o = _run_case("stream-requests-emptied", tmp_path)
    assert not why
    assert o.code == 5  # type: ignore[attr-defined]


def test_empty_jsonl_beside_full_gz_reads_the_gz(tmp_path: Path) -> None:
    b = copy_sample(BASE, tmp_path / "b")
    (b / "requests.jsonl").write_bytes(b"")
    a = analyze_lib(b)
    assert a.signals["requests_measured"].value > 0
    assert any("requests.jsonl" in w and "ignored" in w for w in a.warnings)


def test_emptied_phases_keep_the_baseline_out(tmp_path: Path) -> None:
    b = copy_sample(BASE, tmp_path / "b")
    intact = analyze_lib(b).signals["requests_measured"].value
    write_stream(b, "phases", [])
    a = analyze_lib(b)
    assert a.signals["requests_measured"].value == intact  # the baseline's requests are not mixed in
    assert any("phases" in w and "read 0 of the 2 records" in w for w in a.warnings)
    assert any("baseline" in w for w in a.warnings)


# -- defect 9: impossible values ------------------------------------------------------------------------------
@pytest.mark.parametrize("edit", ["ttft-negative", "ttft-hugely-negative", "end-before-sent"])
def test_impossible_request_latency_is_dropped_and_counted(edit: str, tmp_path: Path) -> None:
    b = copy_sample(BASE, tmp_path / "b")
    delta = {"ttft-negative": 1_000_000_000, "ttft-hugely-negative": 5 * 10**16, "end-before-sent": 0}[edit]

    def fn(recs: list[dict[str, object]]) -> None:
        r = recs[5]
        if edit == "end-before-sent":
            r["end_ns"] = int(r["sent_ns"]) - 10  # type: ignore[call-overload]
        else:
            r["first_token_ns"] = int(r["sent_ns"]) - delta  # type: ignore[call-overload]
    edit_records(b, "requests", fn)
    a = analyze_lib(b)
    assert a.signals["ttft_p50_ms"].value > 0 and a.signals["e2e_p50_ms"].value > 0
    assert any("requests.jsonl" in w and "line 6" in w and "before sent_ns" in w for w in a.warnings)


def test_negative_loop_lag_is_dropped_and_counted(tmp_path: Path) -> None:
    b = copy_sample(BASE, tmp_path / "b")
    edit_records(b, "client_health", lambda recs: recs[3].update(loop_lag_ms=-1e9))
    a = analyze_lib(b)
    assert a.signals["client_loop_lag_p99_ms"].value >= 0
    assert any("client_health" in w and "line 4" in w for w in a.warnings)


def test_duplicate_request_ids_counted_once(tmp_path: Path) -> None:
    b = copy_sample(BASE, tmp_path / "b")
    intact = analyze_lib(b).signals["requests_measured"].value
    recs = read_stream(b, "requests")
    write_stream(b, "requests", recs + recs[5:9])
    a = analyze_lib(b)
    assert a.signals["requests_measured"].value == intact
    assert any("4 duplicate request record(s)" in w for w in a.warnings)


@pytest.mark.parametrize("name", ["cli-threshold-nan", "cli-threshold-inf", "cli-thresholds-nan"])
def test_non_finite_threshold_is_refused(name: str, tmp_path: Path) -> None:
    why, o = _run_case(name, tmp_path)
    assert not why
    assert o.code == 2  # type: ignore[attr-defined]


# -- defect 10: artifact paths confined to the bundle -------------------------------------------------------
@pytest.mark.parametrize("name", ["artifact-dotdot-passwd", "artifact-absolute-passwd", "artifact-symlink-out"])
def test_artifact_outside_the_bundle_is_never_read(name: str, tmp_path: Path) -> None:
    why, _o = _run_case(name, tmp_path)
    assert not why
    report = (tmp_path / "out" / "report.html").read_text() + (tmp_path / "out" / "findings.json").read_text()
    head = Path("/etc/passwd").read_text()[:12]
    assert head not in report  # not a byte of the file reaches the report or the JSON


def test_trace_errors_never_echo_file_bytes(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    p.write_bytes(b"secret-token-123 and more")
    with pytest.raises(DiagnoseError) as e:
        read_trace(p)
    assert "secret" not in str(e.value)


# -- defect 17: a broken profiler artifact ----------------------------------------------------------------
def test_broken_trace_artifact_warns_and_marks_the_profiler_failed(tmp_path: Path) -> None:
    why, o = _run_case("artifact-trace-broken", tmp_path)
    assert not why
    assert any("trace analysis skipped" in w for w in o.warnings)  # type: ignore[attr-defined]
    js = orjson.loads((tmp_path / "out" / "findings.json").read_bytes())
    prof = {p["name"]: p for p in js["probes"]}["profiler"]
    assert prof["state"] == "failed" and "trace" in prof["reason"]
    assert any("trace analysis skipped" in w for w in js["warnings"])


def test_trace_sample_untouched_has_its_profiler_ok(tmp_path: Path) -> None:
    b = copy_sample(TRACE_SAMPLE, tmp_path / "b")
    a = analyze_lib(b)
    assert {s.name: s.state for s in a.probe_statuses}.get("profiler") == "ok"
    assert not any("trace analysis skipped" in w for w in a.warnings)


# -- defect 19: one line never read whole ------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_huge_stream_line_is_skipped_with_bounded_memory(tmp_path: Path) -> None:
    b = copy_sample(BASE, tmp_path / "b")
    p = stream_path(b, "requests")
    assert p is not None
    p.unlink()
    big = b / "requests.jsonl"
    big.write_bytes(b'{"rid": "a", "ok": true}\n')
    with open(big, "r+b") as fh:
        fh.truncate(1 << 30)  # a 1 GB sparse line of zero bytes
    edit_manifest(b, lambda m: m["streams"]["requests"].update(file="requests.jsonl"))
    # the peak from /proc (VmHWM: this process's own, unlike ru_maxrss, which a child inherits from pytest)
    code = textwrap.dedent(f"""
        from diagnose.io.bundle import open_bundle
        b = open_bundle({str(b)!r})
        n = sum(1 for _ in b.iter_records("requests"))
        hwm = next(ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")).split()[1]
        print(n, int(hwm) // 1024, "|".join(b.warnings))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=110, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    n, peak_mb, warnings = r.stdout.split(" ", 2)
    assert n == "1"
    assert int(peak_mb) < 400, f"peak RSS {peak_mb} MB"
    assert "too long" in warnings and "line 2" in warnings


# -- defect 22: a report that does not fit ---------------------------------------------------------------
def test_report_that_does_not_fit_leaves_no_temp_file(tmp_path: Path) -> None:
    b = copy_sample(BASE, tmp_path / "b")
    out = tmp_path / "out"
    out.mkdir()

    def limit() -> None:  # a file-size limit: writes past 64 KiB fail (EFBIG), as on a full disk
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    r = subprocess.run([sys.executable, "-m", "diagnose", "analyze", str(b), "-o", str(out / "report.html")],
                       capture_output=True, text=True, timeout=120, preexec_fn=limit, cwd=REPO, check=False)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("diagnose: error: cannot write report ") and str(out / "report.html") in lines[-1]
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in out.iterdir()) == []
