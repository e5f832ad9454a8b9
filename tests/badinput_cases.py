"""The bad-input corpus: named cases over bundles, traces, span files and CLI arguments (tests/test_fuzz_read.py
runs them all; tests/test_hardening_read.py runs the ones each defect of issue 12 is about).

Each builder takes a fresh temporary directory and returns a :class:`Spec`: the arguments for ``diagnose
analyze`` and what the contract (tests/badinput.py) expects of the run.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tests.badinput import (
    LOAD_STREAMS,
    copy_sample,
    edit_manifest,
    edit_records,
    read_stream,
    stream_path,
    write_stream,
)

BASE = "vllm_cpu_healthy"  # the sample most cases damage (load, Prometheus and py-spy streams)
GPU = "h200_toy_host_bound"  # the sample with gpu_samples
TRACE_SAMPLE = "h200_toy_idle_between_steps"  # the sample with a torch_trace artifact
DATA = Path(__file__).resolve().parent / "data" / "badinput"


@dataclass
class Spec:
    args: list[str | Path]
    expect: str = "any"  # "error" | "warn" | "result" | "any" (tests/badinput.check_contract)
    names: list[str] = field(default_factory=list)  # the error / a warning names one of these
    needle: str = ""


Builder = Callable[[Path], Spec]
CASES: dict[str, Builder] = {}


def case(name: str) -> Callable[[Builder], Builder]:
    def deco(fn: Builder) -> Builder:
        assert name not in CASES, name
        CASES[name] = fn
        return fn
    return deco


def _b(tmp: Path, sample: str = BASE, extra: tuple[str, ...] = ()) -> Path:
    """The sample's small bundle with the load probe's streams and ``extra`` (the stream a case damages)."""
    keep = (*LOAD_STREAMS, *extra, *(("metric_families",) if "metrics" in extra else ()))
    return copy_sample(sample, tmp / "bundle", keep=keep)


# -- manifest fields of the wrong type: one line naming manifest.json and the field ------------------------
def _manifest_case(name: str, fn: Callable[[dict[str, Any]], None], fld: str, sample: str = BASE) -> None:
    def build(tmp: Path) -> Spec:
        b = _b(tmp, sample)
        edit_manifest(b, fn)
        return Spec([b], "error", ["manifest.json"], fld)
    case(f"manifest-{name}")(build)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    keys = path.split(".")

    def fn(m: dict[str, Any]) -> None:
        d = m
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return fn


for _name, _path, _value in [
    ("capture-not-object", "capture", "yes"), ("capture-list", "capture", [1, 2]),
("clock-anchor-string", "capture.clock_anchor", "now"),
    ("anchor-mono-string", "capture.clock_anchor.monotonic_ns", "12"),
    ("anchor-unix-float", "capture.clock_anchor.unix_ns", 1.5e18),
    ("anchor-huge", "capture.clock_anchor.monotonic_ns", 2**64),
    ("probes-list", "probes", ["load"]), ("probe-state-bad", "probes.load.state", "great"),
    ("probe-detail-list", "probes.load.detail", [1]), ("options-slo-string", "options.slo", "fast"),
    ("options-string", "options", "x"), ("target-list", "target", []), ("target-url-int", "target.url", 5),
    ("complete-string", "capture.complete", "yes"), ("ended-string", "capture.ended_unix_ns", "later"),
    ("streams-list", "streams", ["requests"]), ("artifacts-list", "artifacts", ["x"]),
    ("workload-string", "workload", "w"), ("workload-phases-dict", "workload.phases", {"a": 1}),
    ("engine-config-list", "target.engine_config", [1]), ("stream-records-string", "streams.requests.records", "many"),
    ("artifact-file-int", "artifacts.evil", {"file": 5, "kind": "torch_trace"}),
    ("artifact-entry-string", "artifacts.evil", "x"), ("tool-string", "tool", "t"), ("kind-int", "kind", 3),
    ("slo-value-string", "options.slo", {"ttft_p99": "fast"}),
]:
    _manifest_case(_name, _set(_path, _value), _path)


@case("manifest-clock-anchor-null")
def _anchor_null(tmp: Path) -> Spec:  # read as "no anchor" (tests/test_bundle.py), with a warning
    b = _b(tmp)
    edit_manifest(b, _set("capture.clock_anchor", None))
    return Spec([b], "warn", ["manifest.json"], "clock_anchor")


@case("manifest-schema-version-string")
def _schema_version(tmp: Path) -> Spec:
    b = _b(tmp)
    edit_manifest(b, _set("schema_version", "1"))
    return Spec([b], "error", ["manifest.json"], "schema_version")


@case("manifest-not-object")
def _manifest_list(tmp: Path) -> Spec:
    b = _b(tmp)
    (b / "manifest.json").write_bytes(b"[1, 2, 3]")
    return Spec([b], "error", ["manifest.json"])


@case("manifest-not-json")
def _manifest_bad_json(tmp: Path) -> Spec:
    b = _b(tmp)
    (b / "manifest.json").write_bytes(b'{"schema_version": 1,')
    return Spec([b], "error", ["manifest.json"])


@case("manifest-binary")
def _manifest_binary(tmp: Path) -> Spec:
    b = _b(tmp)
    (b / "manifest.json").write_bytes(bytes(range(256)) * 4)
    return Spec([b], "error", ["manifest.json"])


@case("manifest-empty")
def _manifest_empty(tmp: Path) -> Spec:
    b = _b(tmp)
    (b / "manifest.json").write_bytes(b"")
    return Spec([b], "error", ["manifest.json"])


@case("manifest-directory")
def _manifest_dir(tmp: Path) -> Spec:
    b = _b(tmp)
    (b / "manifest.json").unlink()
    (b / "manifest.json").mkdir()
    return Spec([b], "error", ["manifest.json"])


@case("manifest-fifo")
def _manifest_fifo(tmp: Path) -> Spec:
    b = _b(tmp)
    (b / "manifest.json").unlink()
    os.mkfifo(b / "manifest.json")
    return Spec([b], "error", ["manifest.json"])


# -- stream records of the wrong type: skipped, counted, warned with file and line ----------------------------
def _record_case(name: str, stream: str, fn: Callable[[dict[str, Any]], None], sample: str = BASE,
                 index: int = 3) -> None:
    def build(tmp: Path) -> Spec:
        b = _b(tmp, sample, (stream,))

        def edit(recs: list[dict[str, Any]]) -> None:
            fn(recs[min(index, len(recs) - 1)])
        p = edit_records(b, stream, edit)
        return Spec([b], "warn", [p.name], f"line {min(index, len(read_stream(b, stream)) - 1) + 1}")
    case(f"record-{name}")(build)


def _kv(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def fn(r: dict[str, Any]) -> None:
        r[key] = value
    return fn


def _chunk_t(value: Any) -> Callable[[dict[str, Any]], None]:
    def fn(r: dict[str, Any]) -> None:
        r["t_ns"][1] = value
    return fn


def _first_of(key: str, sub: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def fn(r: dict[str, Any]) -> None:
        r[key][0][sub] = value
    return fn


def _host_kind(kind: str, key: str, value: Any) -> Callable[[Path], Spec]:
    def build(tmp: Path) -> Spec:
        b = _b(tmp, BASE, ("host_samples",))
        recs = read_stream(b, "host_samples")
        i = next(i for i, r in enumerate(recs) if r.get("kind") == kind)
        recs[i][key] = value
        p = write_stream(b, "host_samples", recs)
        return Spec([b], "warn", [p.name], f"line {i + 1}")
    return build


def _gpu_kind(kind: str, key: str, value: Any) -> Callable[[Path], Spec]:
    def build(tmp: Path) -> Spec:
        b = _b(tmp, GPU, ("gpu_samples",))
        recs = read_stream(b, "gpu_samples")
        i = next(i for i, r in enumerate(recs) if r.get("kind") == kind)
        recs[i][key] = value
        p = write_stream(b, "gpu_samples", recs)
        return Spec([b], "warn", [p.name], f"line {i + 1}")
    return build


for _name, _stream, _fn in [
    ("phase-string", "requests", _kv("phase", "1")), ("phase-float", "requests", _kv("phase", 1.5)),
    ("phase-huge", "requests", _kv("phase", 2**70)), ("sent-string", "requests", _kv("sent_ns", "now")),
    ("sent-float", "requests", _kv("sent_ns", 1e30)), ("sent-huge-int", "requests", _kv("sent_ns", 2**63)),
    ("end-list", "requests", _kv("end_ns", [1])), ("ok-string", "requests", _kv("ok", "yes")),
    ("usage-string", "requests", _kv("output_tokens_usage", "64")),
    ("usage-negative", "requests", _kv("output_tokens_usage", -5)),
    ("usage-huge", "requests", _kv("output_tokens_usage", 10**30)),
    ("warmup-dict", "requests", _kv("warmup", {})), ("rid-list", "requests", _kv("rid", [1])),
    ("error-dict", "requests", _kv("error", {"a": 1})), ("ttft-negative", "requests", lambda r: r.update(
        first_token_ns=r["sent_ns"] - 1_000_000_000)),
    ("ttft-hugely-negative", "requests", lambda r: r.update(first_token_ns=r["sent_ns"] - 5 * 10**19 // 1000)),
    ("end-before-sent", "requests", lambda r: r.update(end_ns=r["sent_ns"] - 10)),
    ("chunks-t-string", "chunks", _chunk_t("12")), ("chunks-t-dict", "chunks", _chunk_t({"t": 1})),
    ("chunks-t-float", "chunks", _chunk_t(1.5)), ("chunks-t-huge", "chunks", _chunk_t(2**64)),
    ("chunks-t-not-list", "chunks", _kv("t_ns", "x")), ("chunks-tok-string", "chunks", _kv("tok", "x")),
    ("chunks-rid-dict", "chunks", _kv("rid", {"x": 1})),
    ("phases-concurrency-string", "phases", _kv("concurrency", "2")),
    ("phases-phase-string", "phases", _kv("phase", "1")),
    ("phases-start-string", "phases", _kv("start_ns", "0")),
    ("phases-role-int", "phases", _kv("role", 3)),
    ("health-lag-negative", "client_health", _kv("loop_lag_ms", -1e9)),
    ("health-lag-string", "client_health", _kv("loop_lag_ms", "slow")),
    ("health-lag-huge", "client_health", _kv("loop_lag_ms", 1e308)),
    ("health-t-string", "client_health", _kv("t_ns", "t")),
    ("metrics-t-string", "metrics", _kv("t_ns", "t")), ("metrics-samples-dict", "metrics", _kv("samples", {})),
    ("metrics-value-huge", "metrics", lambda r: r["samples"][4].__setitem__(2, 1e308)),
    ("metrics-value-int-huge", "metrics", lambda r: r["samples"][4].__setitem__(2, 2**63)),
    ("metrics-labels-list", "metrics", lambda r: r["samples"][4].__setitem__(1, [1])),
    ("metrics-sample-short", "metrics", lambda r: r["samples"].__setitem__(4, ["x"])),
    ("families-name-dict", "metric_families", _kv("name", {})),
]:
    _record_case(_name, _stream, _fn, index=3 if _stream != "phases" else 1)

for _name, _kind, _key, _value in [
    ("process-pid-string", "process", "pid", "514"), ("process-ppid-dict", "process", "ppid", {}),
    ("thread-pid-string", "thread_cpu", "pid", "x"), ("thread-utime-string", "thread_cpu", "utime_s", "1"),
    ("thread-run-huge", "thread_cpu", "run_ns", 2**64), ("thread-t-float", "thread_cpu", "t_ns", 1.5),
    ("stack-frames-dict", "stack", "frames", {"a": 1}), ("stack-count-string", "stack", "count", "3"),
    ("stack-pid-string", "stack", "pid", "p"), ("system-idle-string", "system_cpu", "idle", "x"),
    ("dump-threads-string", "dump", "threads", "x"), ("dump-pid-list", "dump", "pid", [1]),
    ("cost-cpu-string", "pyspy_cost", "cpu_s", "x"),
]:
    case(f"host-{_name}")(_host_kind(_kind, _key, _value))

for _name, _kind, _key, _value in [
    ("gpu-dict", "sample", "gpu", {"id": 0}), ("gpu-string", "sample", "gpu", "0"),
    ("util-huge", "sample", "util_gpu_ratio", 1e308), ("throttle-huge", "sample", "throttle_reasons", 2**70),
    ("device-gpu-dict", "device", "gpu", {}), ("procs-gpu-list", "procs", "gpu", [0]),
    ("procs-list-string", "procs", "procs", "x"), ("power-string", "sample", "power_w", "x"),
]:
    case(f"gpu-{_name}")(_gpu_kind(_kind, _key, _value))


# -- streams: missing, emptied, corrupt, duplicated, special files ----------------------------------------------
@case("streams-all-deleted")
def _all_deleted(tmp: Path) -> Spec:
    b = _b(tmp)
    for p in b.glob("*.jsonl*"):
        p.unlink()
    return Spec([b], "warn", ["requests"])


@case("stream-requests-emptied")
def _requests_emptied(tmp: Path) -> Spec:
    b = _b(tmp)
    n = len(read_stream(b, "requests"))
    p = write_stream(b, "requests", [])
    return Spec([b], "warn", [p.name], f"read 0 of the {n} records")


@case("stream-requests-deleted")
def _requests_deleted(tmp: Path) -> Spec:
    b = _b(tmp)
    stream_path(b, "requests").unlink()  # type: ignore[union-attr]
    return Spec([b], "warn", ["requests"])


@case("stream-empty-jsonl-beside-gz")
def _empty_beside_gz(tmp: Path) -> Spec:
    b = _b(tmp)
    (b / "requests.jsonl").write_bytes(b"")
    return Spec([b], "warn", ["requests.jsonl"])


@case("stream-phases-emptied")
def _phases_emptied(tmp: Path) -> Spec:
    b = _b(tmp)
    p = write_stream(b, "phases", [])
    return Spec([b], "warn", [p.name])


@case("stream-requests-truncated-mid-line")
def _truncated(tmp: Path) -> Spec:
    b = _b(tmp)
    p = stream_path(b, "requests")
    assert p is not None
    data = gzip.decompress(p.read_bytes())
    p.write_bytes(gzip.compress(data[: len(data) // 2]))
    return Spec([b], "warn", [p.name])


@case("stream-gz-cut")
def _gz_cut(tmp: Path) -> Spec:
    b = _b(tmp)
    p = stream_path(b, "requests")
    assert p is not None
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) // 2])
    return Spec([b], "warn", [p.name])


@case("stream-gz-corrupt-deflate")
def _gz_corrupt(tmp: Path) -> Spec:
    b = _b(tmp)
    p = stream_path(b, "requests")
    assert p is not None
    raw = bytearray(p.read_bytes())
    for i in range(len(raw) // 2, len(raw) // 2 + 64):
        raw[i] ^= 0xA5
    p.write_bytes(bytes(raw))
    return Spec([b], "warn", [p.name])


@case("stream-gz-not-gzip")
def _gz_not_gzip(tmp: Path) -> Spec:
    b = _b(tmp, BASE, ("metrics",))
    p = stream_path(b, "metrics")
    assert p is not None
    p.write_bytes(b"this is not gzip at all\n" * 10)
    return Spec([b], "warn", [p.name])


@case("stream-fifo")
def _stream_fifo(tmp: Path) -> Spec:
    b = _b(tmp)
    p = stream_path(b, "client_health")
    assert p is not None
    p.unlink()
    os.mkfifo(b / "client_health.jsonl.gz")
    return Spec([b], "warn", ["client_health.jsonl.gz"])


@case("stream-symlink-out")
def _stream_symlink(tmp: Path) -> Spec:
    b = _b(tmp)
    p = stream_path(b, "client_health")
    assert p is not None
    p.unlink()
    (b / "client_health.jsonl").symlink_to("/etc/passwd")
    return Spec([b], "warn", ["client_health.jsonl"], "outside the bundle")


@case("stream-directory")
def _stream_dir(tmp: Path) -> Spec:
    b = _b(tmp, BASE, ("metrics",))
    p = stream_path(b, "metrics")
    assert p is not None
    p.unlink()
    (b / "metrics.jsonl.gz").mkdir()
    return Spec([b], "warn", ["metrics.jsonl.gz"])


@case("stream-binary-garbage")
def _stream_garbage(tmp: Path) -> Spec:
    b = _b(tmp)
    p = write_stream(b, "client_health", [], raw=bytes(range(256)) * 40)
    return Spec([b], "warn", [p.name])


@case("stream-not-objects")
def _stream_not_objects(tmp: Path) -> Spec:
    b = _b(tmp)
    p = write_stream(b, "client_health", [1, "x", [1, 2], None])
    return Spec([b], "warn", [p.name])


@case("stream-duplicate-rids")
def _dup_rids(tmp: Path) -> Spec:
    b = _b(tmp)
    recs = read_stream(b, "requests")
    p = write_stream(b, "requests", recs + recs[10:20])
    return Spec([b], "warn", [p.name], "duplicate")


@case("stream-overlong-line")
def _overlong(tmp: Path) -> Spec:
    b = _b(tmp)
    recs = read_stream(b, "requests")
    data = b"".join(orjson.dumps(r) + b"\n" for r in recs)
    raw = data + b'{"rid": "big", "x": "' + b"a" * (40 << 20) + b'"}\n'
    p = write_stream(b, "requests", [], raw=raw)
    return Spec([b], "warn", [p.name], "long")


@case("stream-duplicated-both-forms")
def _both_forms(tmp: Path) -> Spec:
    b = _b(tmp)
    p = stream_path(b, "requests")
    assert p is not None
    (b / "requests.jsonl").write_bytes(gzip.decompress(p.read_bytes()))
    return Spec([b], "warn", ["requests.jsonl"])


# -- artifacts: escaping the bundle, broken -----------------------------------------------------------------
def _artifact_case(name: str, file: str) -> None:
    def build(tmp: Path) -> Spec:
        b = _b(tmp)

        def fn(m: dict[str, Any]) -> None:
            m["artifacts"]["evil"] = {"file": file, "kind": "torch_trace"}
        edit_manifest(b, fn)
        return Spec([b], "warn", ["evil"], "outside")
    case(f"artifact-{name}")(build)


_artifact_case("dotdot-passwd", "../../../../../../../../etc/passwd")
_artifact_case("absolute-passwd", "/etc/passwd")
_artifact_case("absolute-hostname", "/etc/hostname")


@case("artifact-symlink-out")
def _artifact_symlink(tmp: Path) -> Spec:
    b = _b(tmp)
    (b / "artifacts" / "t.json").symlink_to("/etc/passwd")

    def fn(m: dict[str, Any]) -> None:
        m["artifacts"]["evil"] = {"file": "artifacts/t.json", "kind": "torch_trace"}
    edit_manifest(b, fn)
    return Spec([b], "warn", ["evil"], "outside")


@case("artifact-trace-broken")
def _artifact_broken(tmp: Path) -> Spec:
    b = _b(tmp, TRACE_SAMPLE)
    m = orjson.loads((b / "manifest.json").read_bytes())
    name, entry = next((k, v) for k, v in m["artifacts"].items() if v.get("kind") == "torch_trace")
    (b / entry["file"]).write_bytes(b"\x1f\x8b garbage that is not a trace")
    return Spec([b], "warn", [name])


@case("artifact-trace-missing")
def _artifact_missing(tmp: Path) -> Spec:
    b = _b(tmp, TRACE_SAMPLE)
    m = orjson.loads((b / "manifest.json").read_bytes())
    entry = next(v for v in m["artifacts"].values() if v.get("kind") == "torch_trace")
    (b / entry["file"]).unlink()
    return Spec([b], "warn", [Path(entry["file"]).name])


# -- lone traces and span files ---------------------------------------------------------------------------------
def _file_case(name: str, fname: str, data: bytes, expect: str = "error") -> None:
    def build(tmp: Path) -> Spec:
        p = tmp / fname
        p.write_bytes(data)
        return Spec([p], expect, [fname])
    case(f"file-{name}")(build)


for _name, _fname, _data in [
    ("trace-empty", "t.json", b""), ("trace-spaces", "t.json", b"   \n  "),
    ("trace-not-json", "t.json", b"hello world"), ("trace-number", "t.json", b"42"),
    ("trace-no-events-key", "t.json", b'{"a": 1}'), ("trace-events-not-list", "t.json", b'{"traceEvents": 5}'),
    ("trace-empty-events", "t.json", b'{"traceEvents": []}'), ("trace-truncated", "t.json",
                                                               b'{"traceEvents": [{"ph": "X", "cat": "kernel"'),
    ("trace-bad-gzip", "t.json.gz", b"\x1f\x8b\x08\x00garbage"), ("trace-null-bytes", "t.json", b"\0" * 5000),
    ("trace-events-strings", "t.json", b'{"traceEvents": ["a", "b"]}'),
    ("trace-bare-array-garbage", "t.json", b"[1, 2, {"),
    ("spans-empty-list", "s.json", b'{"resourceSpans": []}'),
    ("spans-bad", "s.json", b'{"resourceSpans": [{"scopeSpans": "x"}]}'),
    ("spans-lines-bad", "s.jsonl", b'{"resourceSpans": []}\nnot json\n'),
    ("unknown-suffix", "t.txt", b"{}"),
]:
    _file_case(_name, _fname, _data)

_file_case("trace-one-kernel", "t.json",
           b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 7}]}',
           "result")
_file_case("trace-kernel-dur-string", "t.json",
           b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": "x", "pid": 0, "tid": 7},'
           b' {"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": 2, "pid": 0, "tid": 7}]}', "warn")
_file_case("trace-kernel-ts-huge", "t.json",
           b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1e308, "dur": 1e308, "pid": 0, "tid": 7},'
           b' {"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": 2, "pid": 0, "tid": 7}]}', "any")
_file_case("trace-tid-dict", "t.json",
           b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": {}, "tid": {}}]}',
           "any")


@case("file-trace-fifo")
def _trace_fifo(tmp: Path) -> Spec:
    p = tmp / "t.json"
    os.mkfifo(p)
    return Spec([p], "error", ["t.json"])


@case("file-trace-devnull-link")
def _devnull(tmp: Path) -> Spec:
    p = tmp / "x.json"
    p.symlink_to("/dev/null")
    return Spec([p], "error", ["x.json"])


@case("file-trace-directory-of-fifo")
def _trace_dir_fifo(tmp: Path) -> Spec:
    d = tmp / "traces"
    d.mkdir()
    os.mkfifo(d / "rank0.json")
    return Spec([d], "error", ["traces"])


@case("file-missing")
def _missing(tmp: Path) -> Spec:
    return Spec([tmp / "nope"], "error", ["nope"])


@case("dir-empty")
def _empty_dir(tmp: Path) -> Spec:
    (tmp / "e").mkdir()
    return Spec([tmp / "e"], "error", ["e"])


# -- CLI arguments ---------------------------------------------------------------------------------------
def _cli_case(name: str, extra: list[str], needle: str, *, rules: bytes | None = None,
              thresholds: bytes | None = None) -> None:
    def build(tmp: Path) -> Spec:
        b = _b(tmp)
        args: list[str | Path] = [b, *extra]
        if rules is not None:
            d = tmp / "myrules"
            d.mkdir()
            (d / "X001.yaml").write_bytes(rules)
            args += ["--rules", d]
        if thresholds is not None:
            (tmp / "th.yaml").write_bytes(thresholds)
            args += ["--thresholds", tmp / "th.yaml"]
        return Spec(args, "error", [needle])
    case(f"cli-{name}")(build)


_cli_case("threshold-nan", ["--threshold", "client_loop_lag_max_ms=nan"], "--threshold")
_cli_case("threshold-inf", ["--threshold", "client_loop_lag_max_ms=inf"], "--threshold")
_cli_case("threshold-no-eq", ["--threshold", "client_loop_lag_max_ms"], "--threshold")
_cli_case("threshold-text", ["--threshold", "client_loop_lag_max_ms=fast"], "--threshold")
_cli_case("threshold-unknown", ["--threshold", "nope=1"], "--threshold")
_cli_case("rules-binary-yaml", [], "X001.yaml", rules=bytes(range(256)) * 8)
_cli_case("rules-yaml-list", [], "X001.yaml", rules=b"- 1\n- 2\n")
_cli_case("rules-yaml-bad", [], "X001.yaml", rules=b"id: [unclosed\n")
_cli_case("rules-utf16", [], "X001.yaml", rules="id: X001\n".encode("utf-16"))
_cli_case("thresholds-binary", [], "th.yaml", thresholds=bytes(range(256)) * 8)
_cli_case("thresholds-nan", [], "th.yaml", thresholds=b"client_loop_lag_max_ms: .nan\n")
_cli_case("thresholds-list", [], "th.yaml", thresholds=b"- 1\n")
_cli_case("rules-not-dir", ["--rules", "/etc/hostname"], "/etc/hostname")


@case("cli-thresholds-fifo")
def _thresholds_fifo(tmp: Path) -> Spec:
    b = _b(tmp)
    os.mkfifo(tmp / "th.yaml")
    return Spec([b, "--thresholds", tmp / "th.yaml"], "error", ["th.yaml"])


@case("cli-thresholds-missing")
def _thresholds_missing(tmp: Path) -> Spec:
    b = _b(tmp)
    return Spec([b, "--thresholds", tmp / "none.yaml"], "error", ["none.yaml"])
