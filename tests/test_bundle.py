"""Capture bundle v1: writing as it goes, reading back, and every kind of damage."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from diagnose.errors import BundleError
from diagnose.io.bundle import SCHEMA_VERSION, open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus


def _write(tmp_path: Path) -> BundleWriter:
    w = BundleWriter(tmp_path / "b", target={"url": "http://127.0.0.1:1"}, workload={"mode": "concurrency"})
    s = w.stream("requests", "one per request")
    for i in range(3):
        s.write({"rid": f"r{i}", "ok": True, "sent_ns": i})
    w.set_probe_status(ProbeStatus("load", "ok", detail={"requests_ok": 3}))
    return w


def test_round_trip_complete(tmp_path: Path) -> None:
    w = _write(tmp_path)
    w.finish()
    b = open_bundle(tmp_path / "b")
    assert b.manifest["schema_version"] == SCHEMA_VERSION
    assert not b.partial
    assert [r["rid"] for r in b.records("requests")] == ["r0", "r1", "r2"]
    assert b.manifest["streams"]["requests"]["records"] == 3
    assert b.probe_statuses()[0].detail == {"requests_ok": 3}
    assert b.warnings == []


def test_unfinished_capture_is_readable_and_partial(tmp_path: Path) -> None:
    _write(tmp_path)  # never finished: as after a crash
    b = open_bundle(tmp_path / "b")
    assert b.partial
    assert len(b.records("requests")) == 3
    assert any("partial" in w for w in b.warnings)


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    w = _write(tmp_path)
    w.finish()
    with open(tmp_path / "b" / "requests.jsonl", "ab") as fh:
        fh.write(b'{"rid": "r3", "ok": tr')
    b = open_bundle(tmp_path / "b")
    assert [r["rid"] for r in b.records("requests")] == ["r0", "r1", "r2"]
    assert any("unreadable" in w for w in b.warnings)


def test_truncated_gzip_stream_keeps_what_was_readable(tmp_path: Path) -> None:
    w = _write(tmp_path)
    w.finish()
    raw = (tmp_path / "b" / "requests.jsonl").read_bytes() * 200
    data = gzip.compress(raw)
    (tmp_path / "b" / "requests.jsonl").unlink()
    (tmp_path / "b" / "requests.jsonl.gz").write_bytes(data[: len(data) // 2])
    b = open_bundle(tmp_path / "b")
    recs = b.records("requests")
    assert 0 < len(recs) < 600
    assert any("ends early" in w for w in b.warnings)


def test_not_a_bundle(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    with pytest.raises(BundleError, match="no manifest.json"):
        open_bundle(tmp_path / "x")
    with pytest.raises(BundleError, match="no such file"):
        open_bundle(tmp_path / "missing")
    (tmp_path / "f.txt").write_text("hi")
    with pytest.raises(BundleError, match="not a capture bundle"):
        open_bundle(tmp_path / "f.txt")


def test_unknown_schema_version(tmp_path: Path) -> None:
    w = _write(tmp_path)
    w.finish()
    mf = tmp_path / "b" / "manifest.json"
    m = json.loads(mf.read_text())
    m["schema_version"] = 99
    mf.write_text(json.dumps(m))
    with pytest.raises(BundleError, match="unknown schema_version 99"):
        open_bundle(tmp_path / "b")


def test_corrupt_manifest(tmp_path: Path) -> None:
    w = _write(tmp_path)
    w.finish()
    (tmp_path / "b" / "manifest.json").write_text('{"schema_version": 1, ')
    with pytest.raises(BundleError, match="not valid JSON"):
        open_bundle(tmp_path / "b")


def test_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    _write(tmp_path).finish()
    with pytest.raises(BundleError, match="not empty"):
        BundleWriter(tmp_path / "b")
    w = BundleWriter(tmp_path / "b", overwrite=True)
    assert w.manifest["streams"] == {}
    assert not (tmp_path / "b" / "requests.jsonl").exists()


def test_manifest_never_holds_api_key_field(tmp_path: Path) -> None:
    w = _write(tmp_path)
    w.finish()
    text = (tmp_path / "b" / "manifest.json").read_text().lower()
    assert "api_key" not in text and "authorization" not in text


@pytest.mark.parametrize(("field", "value", "named"), [
    ("capture", "oops", "field capture: expected an object"),
    ("clock_anchor", None, None),
    ("clock_anchor", {"unix_ns": "1", "monotonic_ns": 0}, "field capture.clock_anchor.unix_ns"),
    ("probes", ["load"], "field probes: expected an object"),
    ("options", {"slo": "ttft_p99=1s"}, "field options.slo: expected an object"),
    ("target", {"engine": 7}, "field target.engine: expected a string"),
])
def test_wrong_typed_manifest_field_is_one_line_naming_file_and_field(tmp_path: Path, field: str, value: object,
                                                                       named: str | None) -> None:
    w = BundleWriter(tmp_path / "b")
    w.finish()
    mf = tmp_path / "b" / "manifest.json"
    m = json.loads(mf.read_text())
    if field == "clock_anchor":
        m["capture"]["clock_anchor"] = value
    else:
        m[field] = value
    mf.write_text(json.dumps(m))
    if named is None:  # a null anchor reads as "no anchor", not as a crash
        assert open_bundle(tmp_path / "b").anchor_mono_ns == 0
        return
    with pytest.raises(BundleError) as e:
        open_bundle(tmp_path / "b")
    assert named in str(e.value) and str(mf) in str(e.value) and "\n" not in str(e.value)
