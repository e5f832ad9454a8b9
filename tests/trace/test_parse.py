"""The streaming reader: layouts, pieces, units and every kind of bad input (one-line InputError)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from diagnose.errors import InputError
from diagnose.trace import analyze_trace
from diagnose.trace import parse as parse_mod
from diagnose.trace.parse import read_trace
from tests.trace.helpers import DATA, kernel, launch, write_trace


def _events(n: int) -> list[dict]:
    evs = []
    for i in range(n):
        # names with braces and the "}, {" sequence inside strings must not break piece cutting
        evs.append(launch("cudaLaunchKernel", 10.0 * i, 2.0, i))
        evs.append(kernel("void k<{lambda()#1}, {x}>}, {\"(int)", 10.0 * i + 3, 4.0, i,
                          **{"Input Dims": [[1, 2], [3]], "nested": [{"a": {"b": 1}}, {"c": 2}]}))
        evs.append({"ph": "X", "cat": "python_function", "name": f"f{i}.py(1): g", "pid": 1, "tid": 1,
                    "ts": 10.0 * i, "dur": 1.0, "args": {"Python id": i}})
        evs.append({"ph": "f", "id": i, "pid": 0, "tid": 7, "ts": 10.0 * i + 3, "cat": "ac2g", "name": "ac2g"})
    return evs


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("gz", [False, True])
def test_pieces_match_a_whole_file_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gz: bool,
                                         indent: int | None) -> None:
    monkeypatch.setattr(parse_mod, "PIECE", 4096)  # force hundreds of pieces
    monkeypatch.setattr(parse_mod, "READ_BLOCK", 1000)
    p = write_trace(tmp_path / ("t.json.gz" if gz else "t.json"), _events(600), gz=gz, indent=indent,
                    displayTimeUnit="ms", baseTimeNanoseconds=1_700_000_000_000_000_000)
    rt = read_trace(p)
    assert rt.events_total == 2400
    assert len(rt.gpu) == 600 and len(rt.runtime) == 600
    assert rt.python is None  # python_function skipped by default
    assert rt.categories["python_function"] == 600 and rt.categories["ac2g"] == 600
    assert rt.gpu["ts_us"].tolist() == [10.0 * i + 3 for i in range(600)]
    assert set(rt.gpu["name"].astype(str)) == {"void k<{lambda()#1}, {x}>}, {\"(int)"}
    assert rt.meta["baseTimeNanoseconds"] == 1_700_000_000_000_000_000  # tail metadata after the events
    assert rt.meta["displayTimeUnit"] == "ms"


def test_include_python_keeps_python_functions(tmp_path: Path) -> None:
    p = write_trace(tmp_path / "t.json", _events(5))
    rt = read_trace(p, include_python=True)
    assert rt.python is not None and len(rt.python) == 5
    a = analyze_trace(p, include_python=True)
    assert a.tables["trace_python_functions"]["count"].sum() == 5


def test_bare_array_and_events_first(tmp_path: Path) -> None:
    evs = _events(3)
    (tmp_path / "a.json").write_text(json.dumps(evs))
    assert len(read_trace(tmp_path / "a.json").gpu) == 3
    (tmp_path / "b.json").write_text(json.dumps({"traceEvents": evs, "displayTimeUnit": "ns"}))
    rt = read_trace(tmp_path / "b.json")
    assert len(rt.gpu) == 3 and rt.meta["displayTimeUnit"] == "ns"


def test_nanosecond_timestamps_are_converted(tmp_path: Path) -> None:
    ns = 1_700_000_000_000_000_000
    p = write_trace(tmp_path / "t.json", [kernel("gemm", ns + 5000, 2000, 1), launch("cudaLaunchKernel", ns, 1000, 1)])
    rt = read_trace(p)
    assert rt.time_unit == "ns"
    assert rt.gpu["dur_us"].tolist() == [2.0]
    assert any("nanoseconds" in w for w in rt.warnings)


def test_negative_missing_and_string_values(tmp_path: Path) -> None:
    evs = [kernel("a", 0, 5, 1), kernel("b", 10, -1, 2), {**kernel("c", 20, 5, 3), "dur": None},
           {**kernel("d", 30, 5, 4), "dur": "oops"}, {**kernel("e", 40, 5, 5), "tid": "stream 7"},
           {"ph": "X", "cat": "weird_cat", "name": "x", "ts": 1, "dur": 1},
           {k: v for k, v in kernel("f", 50, 5, 6).items() if k != "ts"}]
    rt = read_trace(write_trace(tmp_path / "t.json", evs))
    assert sorted(rt.gpu["name"].astype(str)) == ["a", "e"]
    text = " ".join(rt.warnings)
    assert "negative duration" in text and "numeric duration" in text and "weird_cat (1)" in text
    assert "1 events without a numeric timestamp" in text


@pytest.mark.parametrize("content, message", [
    (b"", "empty file"),
    (b"   \n", "empty file"),
    (b"hello", "not a trace"),
    (b'{"schemaVersion": 1, "deviceProperties": []}', "no \"traceEvents\""),
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": "X", "na', "truncated"),
    (b'{"traceEvents": [{"ph": "X" "name": "a"}]}', "invalid or truncated JSON"),
    (b'{"traceEvents": []}', "no events"),
])
def test_bad_input_is_one_line_error(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(InputError) as ei:
        analyze_trace(p)
    text = str(ei.value)
    assert message in text and str(p) in text and "\n" not in text


def test_truncated_and_corrupt_gzip(tmp_path: Path) -> None:
    data = (DATA / "mi300x_sglang_qwen3_8b_decode.json.gz").read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated gzip"):
        analyze_trace(tmp_path / "cut.json.gz")
    (tmp_path / "bad.json.gz").write_bytes(data[:10] + b"\x00" * 200 + data[210:])
    with pytest.raises(InputError, match="corrupt gzip|invalid"):
        analyze_trace(tmp_path / "bad.json.gz")


def test_missing_path_and_empty_dir(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such trace"):
        analyze_trace(tmp_path / "nope.json")
    with pytest.raises(InputError, match="no trace files"):
        analyze_trace(tmp_path)


def test_gzip_detected_by_content_not_name(tmp_path: Path) -> None:
    p = tmp_path / "trace.json"
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": _events(2)}).encode()))
    assert len(read_trace(p).gpu) == 2


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.json.gz")))
def test_every_real_trace_parses(name: str) -> None:
    rt = read_trace(DATA / name)
    assert rt.events_total > 0
    assert (rt.gpu["dur_us"] >= 0).all() and (rt.cpu_ops["dur_us"] >= 0).all()
    assert rt.gpu.empty or rt.gpu["ts_us"].notna().all()


def test_early_error_stops_the_inflate_thread(tmp_path: Path) -> None:
    import threading

    p = tmp_path / "big.json.gz"
    p.write_bytes(gzip.compress(b"hello" + b" " * 3_000_000))
    with pytest.raises(InputError, match="not a trace"):
        read_trace(p)
    assert not [t for t in threading.enumerate() if t.name == "trace-inflate"]
