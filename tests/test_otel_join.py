"""The OTel join: client requests + engine llm_request spans -> per-request decomposition, signals, sections."""

from __future__ import annotations

import gzip
import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from diagnose.analysis import Window
from diagnose.errors import InputError
from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.normalize import otel
from diagnose.reports.formatting import fmt_text
from diagnose.reports.sections.otel import sections as otel_sections

MS = 1_000_000
ALL = Window(-1e9, 1e9)


def _span(tid: str, start_unix: int, *, ttft: float, e2e: float, queue: float, prefill: float, decode: float,
          name: str = "llm_request") -> dict[str, Any]:
    return {"trace_id": tid, "span_id": tid[:16], "parent_span_id": "ab" * 8, "name": name, "kind": "SERVER",
            "start_unix_ns": start_unix, "end_unix_ns": start_unix + int(e2e * 1e9),
            "attributes": {"gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.e2e": e2e,
                           "gen_ai.latency.time_in_queue": queue, "gen_ai.latency.time_in_model_prefill": prefill,
                           "gen_ai.latency.time_in_model_decode": decode, "gen_ai.usage.prompt_tokens": 200,
                           "gen_ai.usage.completion_tokens": 64},
            "resource": {"service.name": "vllm"}, "source": "grpc-protobuf"}


def _bundle(tmp_path: Path, n: int = 10, *, unmatched: int = 0, warmup: int = 0, failed: int = 0,
            requests: bool = True) -> Path:
    """Request i: sent at 1 s + 0.1 s*i; arrives at the server 2 ms later; queue (10 + 10 i) ms, prefill 25 ms,
    frontend 5 ms -> server TTFT (40 + 10 i) ms; first chunk at the client 1 ms after the server's TTFT;
    decode 140 ms; server E2E = TTFT + 140 + 10 ms; client E2E = server E2E + 4 ms; with ``failed`` the last
    joined request is a failure."""
    bw = BundleWriter(tmp_path / "b")
    reqs, spans = [], []
    for i in range(n + unmatched):
        sent = bw.anchor_mono_ns + 1000 * MS + i * 100 * MS
        tid = f"{i + 1:032x}"
        queue, prefill, frontend, decode = 10 + 10 * i, 25, 5, 140
        ttft = queue + prefill + frontend
        e2e = ttft + decode + 10
        reqs.append({"rid": f"r{i}", "phase": 0 if i < (n + unmatched) // 2 else 1, "warmup": i < warmup,
                     "ok": not (failed and i == n - 1),
                     "sent_ns": sent, "first_token_ns": sent + (2 + ttft + 1) * MS, "end_ns": sent + (2 + e2e + 4) * MS,
                     "trace_id": tid, "span_id": f"{i + 1:016x}"})
        if i < n:
            arrival_unix = bw.anchor_unix_ns + (sent - bw.anchor_mono_ns) + 2 * MS
            spans.append(_span(tid, arrival_unix, ttft=ttft / 1e3, e2e=e2e / 1e3, queue=queue / 1e3,
                               prefill=prefill / 1e3, decode=decode / 1e3))
    spans.append({**_span("ff" * 16, bw.anchor_unix_ns, ttft=0, e2e=1, queue=0, prefill=0, decode=0,
                          name="Load model"), "attributes": {}})
    if requests:
        bw.stream("requests").write_many(reqs)
    bw.stream("spans").write_many(spans)
    bw.finish()
    return bw.path


def _signals(tables: dict[str, Any], window: Window = ALL) -> dict[str, Any]:
    return {s.name: s for s in otel.signals(tables, window)}


def test_per_request_decomposition_is_exact(tmp_path: Path) -> None:
    t = otel.tables(open_bundle(_bundle(tmp_path)))
    rb = t["request_breakdown"].set_index("rid")
    r = rb.loc["r3"]
    assert bool(r["matched"])
    assert r["client_ttft_ms"] == pytest.approx(2 + 70 + 1)
    assert r["server_ttft_ms"] == pytest.approx(70)
    assert r["queue_ms"] == pytest.approx(40) and r["prefill_ms"] == pytest.approx(25)
    assert r["frontend_ms"] == pytest.approx(5)
    assert r["client_network_ms"] == pytest.approx(3)
    assert r["pre_server_ms"] == pytest.approx(2, abs=1e-3)
    assert r["decode_ms"] == pytest.approx(140)
    assert r["e2e_frontend_ms"] == pytest.approx(5 + 10)
    assert r["e2e_client_network_ms"] == pytest.approx(2 + 4)
    # the parts add up to what the client saw
    parts = r["client_network_ms"] + r["frontend_ms"] + r["queue_ms"] + r["prefill_ms"]
    assert parts == pytest.approx(r["client_ttft_ms"])
    # the startup span is in the spans table but not a request
    assert "Load model" in set(t["spans"]["name"]) and len(rb) == 10


def test_join_ratio_and_ttft_shares(tmp_path: Path) -> None:
    t = otel.tables(open_bundle(_bundle(tmp_path, n=8, unmatched=2, warmup=1)))
    s = _signals(t)
    # 9 measured client requests (1 warm-up), 7 of them joined
    assert s["join_matched_ratio"].value == pytest.approx(7 / 9)
    j = [i for i in range(1, 8)]
    ttft = sum(2 + 10 + 10 * i + 30 + 1 for i in j)
    assert s["ttft_queue_share_ratio"].value == pytest.approx(sum(10 + 10 * i for i in j) / ttft)
    assert s["ttft_prefill_share_ratio"].value == pytest.approx(25 * 7 / ttft)
    assert s["ttft_frontend_share_ratio"].value == pytest.approx(5 * 7 / ttft)
    assert s["ttft_client_network_share_ratio"].value == pytest.approx(3 * 7 / ttft)
    total = sum(s[k].value for k in ("ttft_queue_share_ratio", "ttft_prefill_share_ratio",
                                     "ttft_frontend_share_ratio", "ttft_client_network_share_ratio"))
    assert total == pytest.approx(1.0)
    assert s["ttft_queue_share_ratio"].series and all(0 < v < 1 for _, v in s["ttft_queue_share_ratio"].series)
    assert s["span_queue_time_p99_ms"].value == pytest.approx(float(
        __import__("numpy").percentile([10 + 10 * i for i in range(1, 8)], 99)))
    assert s["span_prefill_time_p99_ms"].value == pytest.approx(25)
    assert s["span_requests_count"].value == 7


def test_the_slow_requests_ttft_is_split_on_its_own(tmp_path: Path) -> None:
    # request i queues (10 + 10 i) ms: the slowest requests are slow because they queue, which the mean over
    # all requests dilutes; at or above the P90 of 50 requests: the 5 slowest, i = 45..49
    import pandas as pd

    t = otel.tables(open_bundle(_bundle(tmp_path, n=50)))
    s = _signals(t)
    slow = [2 + 10 + 10 * i + 30 + 1 for i in range(45, 50)]
    assert s["ttft_tail_queue_share_ratio"].value == pytest.approx(sum(10 + 10 * i for i in range(45, 50)) / sum(slow))
    assert s["ttft_tail_queue_share_ratio"].value > s["ttft_queue_share_ratio"].value
    assert sum(s[f"ttft_tail_{k}_share_ratio"].value for k in ("queue", "prefill", "frontend", "client_network")) \
        == pytest.approx(1.0)
    assert "the 5 requests at or above the TTFT P90" in s["ttft_tail_queue_share_ratio"].description
    # an SLO on TTFT P99 judges the requests at or above the P99: here 1 request, too few for a split
    t["client_slo"] = pd.DataFrame([{"key": "ttft_p99", "limit_ms": 100.0}])
    assert "ttft_tail_queue_share_ratio" not in _signals(t)


def test_phase_windows_split_requests(tmp_path: Path) -> None:
    t = otel.tables(open_bundle(_bundle(tmp_path, n=10)))
    s0 = _signals(t, Window(-1e9, 1e9, phase=0, label="p0"))
    s1 = _signals(t, Window(-1e9, 1e9, phase=1, label="p1"))
    assert s0["span_queue_time_p50_ms"].value < s1["span_queue_time_p50_ms"].value
    later = _signals(t, Window(1.55, 1e9))  # sends at 1.0..1.9 s: requests 6..9
    assert later["span_requests_count"].value == 4


def test_failed_requests_are_not_counted_as_unjoined(tmp_path: Path) -> None:
    t = otel.tables(open_bundle(_bundle(tmp_path, n=4, failed=1)))
    assert _signals(t)["join_matched_ratio"].value == pytest.approx(1.0)


def test_observe_mode_shares_are_of_server_ttft(tmp_path: Path) -> None:
    t = otel.tables(open_bundle(_bundle(tmp_path, n=5, requests=False)))
    s = _signals(t)
    assert "join_matched_ratio" not in s and "ttft_client_network_share_ratio" not in s
    server_ttft = sum(40 + 10 * i for i in range(5))
    assert s["ttft_queue_share_ratio"].value == pytest.approx(sum(10 + 10 * i for i in range(5)) / server_ttft)
    assert "of server TTFT" in s["ttft_queue_share_ratio"].description
    secs = {x.id: x for x in otel_sections(t)}
    assert [x.name for x in secs["otel_ttft_decomposition"].payload.series] == ["server frontend", "queue",
                                                                                    "prefill"]


def test_sections_bars_waterfall_and_unmatched(tmp_path: Path) -> None:
    t = otel.tables(open_bundle(_bundle(tmp_path, n=10, unmatched=1)))
    secs = {x.id: x for x in otel_sections(t)}
    bars = secs["otel_ttft_decomposition"].payload
    assert [fmt_text(c).split(" ")[0] for c in bars.categories] == ["P50", "P90", "P99"]
    assert [x.name for x in bars.series] == ["client+network", "server frontend", "queue", "prefill"]
    # each bar is one real request: its parts add up to that request's client TTFT (nearest rank)
    for k, q in enumerate((50, 90, 99)):
        i = min(9, max(0, math.ceil(q / 100 * 10) - 1))
        assert sum(x.values[k] for x in bars.series) == pytest.approx(2 + 40 + 10 * i + 1)
    e2e = secs["otel_e2e_decomposition"].payload
    assert [x.name for x in e2e.series][-1] == "decode"
    shares = secs["otel_ttft_shares"].payload
    assert shares.columns[-1] == "share of TTFT" and len(shares.rows) == 4
    assert all(r[-1].unit == "ratio" for r in shares.rows)
    assert sum(r[-1].value for r in shares.rows) == pytest.approx(1.0)
    wf = secs["otel_slowest_waterfall"].payload.rows
    assert fmt_text(wf[0].label) == "r9 (TTFT 133 ms, E2E 286 ms)" and len(wf) == 10
    segs = wf[0].segments
    assert [g.name for g in segs] == ["client+network", "server frontend", "queue", "prefill", "decode",
                                         "rest (output, streaming back)"]
    assert segs[3].end == pytest.approx(2 + 130)  # prefill ends at the server's first token
    assert segs[-1].end == pytest.approx(2 + 130 + 140 + 10 + 4)
    assert all(a.end == pytest.approx(b.start) for a, b in zip(segs, segs[1:], strict=False))
    assert "1 successful request(s) had no server span" in fmt_text(secs["otel_unmatched"].payload.text)


def test_no_spans_means_no_tables_or_signals(tmp_path: Path) -> None:
    bw = BundleWriter(tmp_path / "b")
    bw.finish()
    t = otel.tables(open_bundle(bw.path))
    assert t == {} and otel.signals(t, ALL) == [] and otel_sections(t) == []


def _otlp(tid: str, start_ns: int, queue_s: float) -> dict[str, Any]:
    def kv(k: str, v: float) -> dict[str, Any]:
        return {"key": k, "value": {"doubleValue": v}}
    return {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [{
        "traceId": tid, "spanId": "0123456789abcdef", "name": "llm_request", "kind": 2,
        "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(start_ns + 300 * MS),
        "attributes": [kv("gen_ai.latency.time_to_first_token", queue_s + 0.03),
                       kv("gen_ai.latency.time_in_queue", queue_s),
                       kv("gen_ai.latency.time_in_model_prefill", 0.02), kv("gen_ai.latency.e2e", 0.3),
                       kv("gen_ai.latency.time_in_model_decode", 0.15)]}]}]}]}


@pytest.mark.parametrize("layout", ["object", "lines", "array", "gzip", "bundle_stream"])
def test_span_files_for_post_mortem(tmp_path: Path, layout: str) -> None:
    docs = [_otlp(f"{i + 1:032x}", 1_700_000_000 * 10**9 + i * 10**9, 0.05 * (i + 1)) for i in range(3)]
    p = tmp_path / "spans.json"
    if layout == "object":
        merged = {"resourceSpans": [rs for d in docs for rs in d["resourceSpans"]]}
        p.write_bytes(orjson.dumps(merged))
    elif layout == "lines":
        p.write_bytes(b"\n".join(orjson.dumps(d) for d in docs) + b"\n")
    elif layout == "array":
        p.write_bytes(orjson.dumps(docs))
    elif layout == "gzip":
        p = tmp_path / "spans.json.gz"
        p.write_bytes(gzip.compress(b"\n".join(orjson.dumps(d) for d in docs)))
    else:
        spans = otel.read_spans_file(_write(tmp_path / "src.json", docs))
        p = tmp_path / "spans.jsonl"
        p.write_bytes(b"".join(orjson.dumps(s) + b"\n" for s in spans))
    t = otel.load_spans_file(p)
    assert len(t["request_breakdown"]) == 3
    assert t["spans"]["start_s"].min() == 0.0 and t["spans"]["start_s"].max() == pytest.approx(2.0)
    s = _signals(t)
    assert s["ttft_queue_share_ratio"].value == pytest.approx((0.05 + 0.10 + 0.15) / (0.3 + 3 * 0.03))
    assert s["ttft_frontend_share_ratio"].value == pytest.approx(3 * 0.01 / (0.3 + 3 * 0.03))
    assert s["span_queue_time_p99_ms"].value == pytest.approx(149.0, rel=0.01)


def _write(p: Path, docs: list[dict[str, Any]]) -> Path:
    p.write_bytes(b"\n".join(orjson.dumps(d) for d in docs))
    return p


@pytest.mark.parametrize("content,match", [
    (None, "cannot read span file"),
    (b"{not json\nat all", r"spans.json:1: not JSON"),
    (b'{"resourceSpans": []}', "no spans found"),
    (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz", "spanId": "12"}]}]}]}', "record 1"),
    (b"\x1f\x8b broken gzip", "cannot read span file"),
    ("fifo", "a FIFO"),  # refused at once: reading it would wait for a writer
])
def test_bad_span_files_are_one_line_input_errors(tmp_path: Path, content: bytes | str | None, match: str) -> None:
    import os

    p = tmp_path / "spans.json"
    if content == "fifo":
        os.mkfifo(p)
    elif isinstance(content, bytes):
        p.write_bytes(content)
    with pytest.raises(InputError, match=match) as ei:
        otel.load_spans_file(p)
    assert "\n" not in str(ei.value)
