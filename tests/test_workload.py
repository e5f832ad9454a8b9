"""Workload files (docs/workload.md): reading the three formats, replaying them with the load probe against a
real local server (offsets, lengths, prefix groups, --speed, --loop, the concurrency cap), `diagnose workload`
from a bundle and back, and the workload card."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from diagnose.capture.workload import Phase, Replay, WorkloadSpec, prefix_share
from diagnose.errors import DiagnoseError, InputError
from diagnose.io.bundle import Bundle, open_bundle
from diagnose.io.workload_file import encode_workload, from_bundle, read_workload
from diagnose.io.writer import BundleWriter
from tests.cli_inproc import diagnose
from tests.load_testserver import TestServer
from tests.test_load_probe import run_probe, spec_for

DATA = Path(__file__).parent / "data" / "workload"
DIAG = [sys.executable, "-m", "diagnose"]


class StampServer(TestServer):
    """The test server, also stamping when each request arrives (same monotonic clock as the client's) and
    counting requests in flight."""

    __test__ = False

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.arrivals: dict[str, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.arrivals[request.headers.get("x-request-id", "")] = time.monotonic_ns()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await super().completions(request)
        finally:
            self.in_flight -= 1


def replay_spec(rp: Replay, max_concurrency: int | None = None) -> WorkloadSpec:
    return WorkloadSpec(mode="replay", phases=(Phase(index=0, name="replay", max_concurrency=max_concurrency),),
                        duration_s=None, warmup_requests=0, input_tokens=32, output_tokens=8, replay=rp)


def write_diag(path: Path, rows: list[dict[str, Any]], block_tokens: int = 16) -> Path:
    lines = [json.dumps({"diagnose_workload": 1, "block_tokens": block_tokens})] + [json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


ROWS = [  # A and B share two blocks, C one of them, D none; offsets out of order on purpose
    {"offset_s": 0.0, "input_tokens": 60, "output_tokens": 5, "prefix": ["g1", "g2"], "session": "s1", "turn": 0},
    {"offset_s": 0.30, "input_tokens": 41, "output_tokens": 3, "prefix": ["g1", "g2"], "session": "s1", "turn": 1},
    {"offset_s": 0.12, "input_tokens": 25, "output_tokens": 7, "prefix": ["g1"]},
    {"offset_s": 0.50, "input_tokens": 90, "output_tokens": 2},
    {"offset_s": 0.55, "input_tokens": 12, "output_tokens": 9},
    {"offset_s": 0.80, "input_tokens": 33, "output_tokens": 4, "prefix": ["g1", "g2", "g3"]},
]
SORTED = sorted(ROWS, key=lambda r: r["offset_s"])


def sent(srv: TestServer) -> list[tuple[str, dict[str, Any]]]:
    """(request id, body) of each request the run sent (the option preflight left out)."""
    return [(h["x-request-id"], b) for h, b in zip(srv.headers, srv.bodies, strict=True)
            if not h["x-request-id"].endswith("preflight")]


def words(body: dict[str, Any]) -> list[str]:
    return str(body["prompt"]).split()


def check_schedule(b: Bundle, srv: StampServer, offsets: list[float], speed: float) -> None:
    """Each request was scheduled at exactly its offset / speed, sent no earlier, and arrived at the server
    at its offset within the client's measured schedule lag plus the measured transport time."""
    recs = sorted(b.records("requests"), key=lambda r: r["intended_ns"])
    assert len(recs) == len(offsets)
    t0 = recs[0]["intended_ns"]
    for r, off in zip(recs, offsets, strict=True):
        assert abs((r["intended_ns"] - t0) / 1e9 - off / speed) < 1e-6
        assert r["sent_ns"] >= r["intended_ns"]
    lag = max(r["sent_ns"] - r["intended_ns"] for r in recs)
    transport = max(srv.arrivals[r["rid"]] - r["sent_ns"] for r in recs)
    assert transport >= 0
    a0 = srv.arrivals[recs[0]["rid"]]
    for r, off in zip(recs, offsets, strict=True):
        err = (srv.arrivals[r["rid"]] - a0) - off / speed * 1e9
        assert abs(err) <= lag + transport, (r["rid"], err / 1e6, lag / 1e6, transport / 1e6)


# -- reading ------------------------------------------------------------------------------------------------
def test_reads_diagnose_format_sorted_with_header(tmp_path: Path) -> None:
    rp = read_workload(write_diag(tmp_path / "w.jsonl", ROWS, block_tokens=32), speed=2, loop=3)
    assert rp.format == "diagnose" and rp.block_tokens == 32 and rp.speed == 2 and rp.loop == 3
    assert [r.offset_s for r in rp.requests] == [r["offset_s"] for r in SORTED]
    assert [r.input_tokens for r in rp.requests] == [r["input_tokens"] for r in SORTED]
    assert rp.requests[0].prefix == ("g1", "g2") and rp.requests[0].session == "s1" and rp.requests[2].turn == 1
    assert rp.skipped == 0 and rp.note == ""
    # without a header: the default block, and offsets made relative to the first request
    (tmp_path / "n.jsonl").write_text('{"offset_s": 5, "input_tokens": 3, "output_tokens": 1}\n'
                                      '{"offset_s": 6.5, "input_tokens": 4, "output_tokens": 2}\n')
    rp = read_workload(tmp_path / "n.jsonl")
    assert rp.block_tokens == 16 and [r.offset_s for r in rp.requests] == [0.0, 1.5]


def test_reads_mooncake_sample() -> None:
    rp = read_workload(DATA / "mooncake_sample.jsonl")
    raw = [json.loads(line) for line in (DATA / "mooncake_sample.jsonl").read_text().splitlines()]
    assert rp.format == "mooncake" and rp.block_tokens == 512 and len(rp.requests) == len(raw) == 12
    assert [r.offset_s for r in rp.requests] == [x["timestamp"] / 1000 for x in raw]
    assert [(r.input_tokens, r.output_tokens) for r in rp.requests] == [(x["input_length"], x["output_length"])
                                                                        for x in raw]
    assert all(r.prefix[:2] == ("1", "2") for r in rp.requests[::3])
    # requests 3, 6, 9 find the two shared 512-token blocks already sent: that share of all input tokens
    total = sum(x["input_length"] for x in raw)
    assert prefix_share(rp.requests, 512) == pytest.approx(3 * 1024 / total)


def test_reads_azure_sample() -> None:
    rp = read_workload(DATA / "azure_sample.csv", speed=4)
    with (DATA / "azure_sample.csv").open() as fh:
        raw = list(csv.DictReader(fh))
    assert rp.format == "azure" and len(rp.requests) == len(raw) == 12 and rp.speed == 4
    assert [(r.input_tokens, r.output_tokens) for r in rp.requests] == [
        (int(x["ContextTokens"]), int(x["GeneratedTokens"])) for x in raw]
    assert rp.requests[0].offset_s == 0.0
    assert rp.requests[1].offset_s == pytest.approx(46.6862160 - 46.6805900, abs=1e-6)  # 7-digit fractions
    assert all(r.prefix == () for r in rp.requests)


@pytest.mark.parametrize(("name", "text", "where"), [
    ("empty.jsonl", "\n\n", "empty workload file"),
    ("prose.jsonl", "hello\n", "prose.jsonl:1: not a workload file"),
    ("allbad.jsonl", '{"offset_s": -1, "input_tokens": 3, "output_tokens": 1}\n', "allbad.jsonl:1: Expected"),
    ("header.jsonl", '{"diagnose_workload": 9}\n', "header.jsonl:1: bad header"),
    ("moon.jsonl", '{"timestamp": 1, "input_length": "x", "output_length": 2}\n', "moon.jsonl:1: Expected `int`"),
    ("cols.csv", "TIMESTAMP,Tokens\n2023-01-01 00:00:00,3\n", "cols.csv:1: not an Azure LLM trace CSV: missing"),
    ("dates.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", "dates.csv:2: bad TIMESTAMP"),
])
def test_bad_files_are_one_line_errors_naming_file_and_line(tmp_path: Path, name: str, text: str,
                                                           where: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError) as e:
        read_workload(tmp_path / name)
    assert where in str(e.value) and "\n" not in str(e.value)


def test_bad_records_are_skipped_and_counted(tmp_path: Path) -> None:
    (tmp_path / "w.jsonl").write_text('{"offset_s": 0, "input_tokens": 3, "output_tokens": 1}\n'
                                      '{"offset_s": 1, "input_tokens": 0, "output_tokens": 1}\n'
                                      'not json\n'
                                      '{"offset_s": 2, "input_tokens": 3, "output_tokens": 1}\n')
    rp = read_workload(tmp_path / "w.jsonl")
    assert len(rp.requests) == 2 and rp.skipped == 2
    assert "skipped 2 unreadable record(s)" in rp.note and "w.jsonl:2:" in rp.note
    (tmp_path / "a.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,5,2\n"
                                    "2023-11-16 18:15:47,x,2\n2023-11-16 18:15:48,7,-1\n")
    rp = read_workload(tmp_path / "a.csv")
    assert len(rp.requests) == 1 and rp.skipped == 2 and "a.csv:3:" in rp.note
    for bad in ({"speed": 0.0}, {"loop": 0}):
        with pytest.raises(InputError):
            read_workload(tmp_path / "a.csv", **bad)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="no such file"):
        read_workload(tmp_path / "missing.jsonl")


def test_attach_with_a_bad_workload_is_one_line_before_connecting(tmp_path: Path) -> None:
    (tmp_path / "w.jsonl").write_text('{"offset_s": "soon"}\n')
    p = diagnose("attach", "--url", "http://127.0.0.1:9", "--workload", str(tmp_path / "w.jsonl"),
                 "-o", str(tmp_path / "b"))
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(lines) == 1, p.stderr
    assert lines[0].startswith("diagnose: error:") and "w.jsonl:1:" in lines[0]
    assert not (tmp_path / "b").exists()


# -- replay -------------------------------------------------------------------------------------------------
def test_replay_sends_recorded_offsets_lengths_and_prefix_groups(tmp_path: Path) -> None:
    rp = read_workload(write_diag(tmp_path / "w.jsonl", ROWS))
    srv = StampServer()
    status, b = asyncio.run(run_probe(srv, replay_spec(rp), tmp_path / "b"))
    assert status is not None and status.state == "ok" and status.detail["requests_ok"] == len(ROWS)
    check_schedule(b, srv, [r["offset_s"] for r in SORTED], 1.0)
    recs = {r["rid"]: r for r in b.records("requests")}
    by_index: dict[int, list[str]] = {}
    for rid, body in sent(srv):
        rec = recs[rid]
        row = SORTED[rec["replay_index"]]
        assert body["max_tokens"] == row["output_tokens"] == rec["max_tokens"] and body["ignore_eos"] is True
        assert len(words(body)) + 1 == row["input_tokens"] == rec["prompt_tokens"]  # the server adds BOS
        assert rec["prompt_tokens_source"] == "tokenize" and rec["output_tokens_chunks"] == row["output_tokens"]
        assert rec.get("prefix", []) == row.get("prefix", []) and rec.get("session") == row.get("session")
        assert "prompt_text" not in rec
        by_index[rec["replay_index"]] = words(body)
    a, c, b_, d, e, f = (by_index[i] for i in range(6))  # sorted: A, C, B, D, E, F
    assert a[:32] == b_[:32] == f[:32] and a[32:40] != b_[32:40]  # two shared 16-token blocks, then unique
    assert c[:16] == a[:16] and c[16:24] != a[16:24]  # one shared block
    assert d[:16] != a[:16] and e != d[:len(e)]  # no prefix group: unique from the start
    assert b.records("phases")[0]["mode"] == "replay"


CONVERSATION = [  # two sessions of three turns recorded 0.1 s apart; each answer takes ~0.25 s (20 x 12 ms)
    {"offset_s": 0.0, "input_tokens": 20, "output_tokens": 20, "session": "a", "turn": 0},
    {"offset_s": 0.02, "input_tokens": 20, "output_tokens": 20, "session": "b", "turn": 0},
    {"offset_s": 0.10, "input_tokens": 40, "output_tokens": 20, "session": "a", "turn": 1},
    {"offset_s": 0.12, "input_tokens": 40, "output_tokens": 20, "session": "b", "turn": 1},
    {"offset_s": 0.20, "input_tokens": 60, "output_tokens": 20, "session": "a", "turn": 2},
    {"offset_s": 0.22, "input_tokens": 60, "output_tokens": 20, "session": "b", "turn": 2},
    {"offset_s": 0.05, "input_tokens": 10, "output_tokens": 2},  # no session: at its offset
]


@pytest.mark.parametrize("wait", [True, False])
def test_a_replayed_session_turn_waits_for_the_previous_answer(tmp_path: Path, wait: bool) -> None:
    rp = read_workload(write_diag(tmp_path / "w.jsonl", CONVERSATION))
    srv = StampServer(itl_s=0.012)
    spec = dataclasses.replace(replay_spec(rp), session_wait=wait)
    b = asyncio.run(run_with_manifest(srv, spec, tmp_path / "b"))
    status = next(p for p in b.meta.probes if p.name == "load")
    assert status.detail["requests_ok"] == len(CONVERSATION)
    recs = b.records("requests")
    by = {(r.get("session"), r.get("turn")): r for r in recs}
    for s in ("a", "b"):
        for t in (1, 2):
            prev, cur = by[(s, t - 1)], by[(s, t)]
            if wait:  # sent once the previous answer ended, and due then (no schedule lag from the wait)
                assert cur["sent_ns"] >= prev["end_ns"] and cur["intended_ns"] >= prev["end_ns"]
                assert cur["sent_ns"] - cur["intended_ns"] < 50e6
            else:  # at its offset, while the previous answer still streams
                assert cur["sent_ns"] < prev["end_ns"]
    lone = by[(None, None)]
    assert abs((lone["intended_ns"] - by[("a", 0)]["intended_ns"]) / 1e9 - 0.05) < 1e-6  # not held back
    from diagnose.pipeline import analyze
    from diagnose.signals.workload_card import workload_card

    a = analyze(b.path)
    card = workload_card(a)
    assert card is not None
    # each session is a task of three turns (planned from the file), measured end to end
    assert a.signals["tasks_completed"].value == 2 and a.signals["tasks_abandoned_ratio"].value == 0
    e2e = [(r["end_ns"] - r["sent_ns"]) / 1e6 for r in recs if r.get("session")]
    if wait:  # three answers one after another
        assert a.signals["task_latency_p50_ms"].value >= 3 * min(e2e)
    else:  # the turns overlap: the task ends with its last turn, 0.2 s after its first was sent
        assert a.signals["task_latency_p50_ms"].value < 200 + 1.5 * max(e2e)
    assert ("each turn sent after the previous turn's answer" if wait else "turns sent at their offsets") in (
        card["arrival"]) and "2 sessions" in card["arrival"]


def test_speed_2_halves_the_span_and_loop_repeats(tmp_path: Path) -> None:
    rp = read_workload(write_diag(tmp_path / "w.jsonl", ROWS), speed=2, loop=2)
    srv = StampServer()
    status, b = asyncio.run(run_probe(srv, replay_spec(rp), tmp_path / "b"))
    assert status is not None and status.detail["requests_ok"] == 2 * len(ROWS)
    period = rp.period_s()
    assert period == pytest.approx(0.8 + 0.8 / 5)
    offsets = [r["offset_s"] for r in SORTED] + [period + r["offset_s"] for r in SORTED]
    check_schedule(b, srv, offsets, 2.0)  # every offset halved: the span is half the recorded one
    recs = sorted(b.records("requests"), key=lambda r: r["intended_ns"])
    assert (recs[len(ROWS) - 1]["intended_ns"] - recs[0]["intended_ns"]) / 1e9 == pytest.approx(0.8 / 2, abs=1e-6)
    assert [r["replay_loop"] for r in recs] == [0] * len(ROWS) + [1] * len(ROWS)
    assert [r["replay_index"] for r in recs] == list(range(len(ROWS))) * 2


def test_replay_concurrency_cap(tmp_path: Path) -> None:
    rows = [{"offset_s": 0.01 * i, "input_tokens": 10, "output_tokens": 4} for i in range(6)]
    rp = read_workload(write_diag(tmp_path / "w.jsonl", rows))
    srv = StampServer(itl_s=0.02)
    status, b = asyncio.run(run_probe(srv, replay_spec(rp, max_concurrency=2), tmp_path / "b"))
    assert status is not None and status.detail["requests_ok"] == 6
    assert srv.max_in_flight <= 2
    assert any(r["capped"] for r in b.records("requests"))


def test_replay_under_uvloop_never_sends_early(tmp_path: Path) -> None:
    """attach runs on uvloop, whose timers have 1 ms resolution and wake up to a millisecond early: a replayed
    request was sent about 0.3 ms before its intended time (a negative schedule lag) until the sleep took the
    rest (probes/sse.py sleep_until)."""
    import uvloop

    rp = read_workload(DATA / "mooncake_sample.jsonl", speed=4)
    srv = StampServer()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        status, b = runner.run(run_probe(srv, replay_spec(rp), tmp_path / "b"))
    assert status is not None and status.detail["requests_ok"] == 12
    check_schedule(b, srv, [r.offset_s for r in rp.requests], 4.0)


@pytest.mark.parametrize("name", ["mooncake_sample.jsonl", "azure_sample.csv"])
def test_replay_public_formats(tmp_path: Path, name: str) -> None:
    rp = read_workload(DATA / name, speed=4)
    srv = StampServer()
    status, b = asyncio.run(run_probe(srv, replay_spec(rp), tmp_path / "b"))
    assert status is not None and status.detail["requests_ok"] == 12
    check_schedule(b, srv, [r.offset_s for r in rp.requests], 4.0)
    recs = {r["rid"]: r for r in b.records("requests")}
    got: dict[int, list[str]] = {}
    for rid, body in sent(srv):
        req = rp.requests[recs[rid]["replay_index"]]
        assert len(words(body)) + 1 == req.input_tokens and body["max_tokens"] == req.output_tokens
        got[recs[rid]["replay_index"]] = words(body)
    if rp.format == "mooncake":  # requests 0, 3, 6, 9 share hash ids 1, 2: the same first 1024 tokens
        assert got[0][:1024] == got[3][:1024] == got[9][:1024] and got[0][1024:1030] != got[3][1024:1030]
        assert got[1][:512] != got[0][:512]


# -- bundle -> workload -> replay -> bundle -----------------------------------------------------------------
def test_round_trip_bundle_workload_replay(tmp_path: Path) -> None:
    spec = spec_for(None, rate="40", num_requests=10, warmup_requests=1, shared_prefix_fraction=0.5,
                    input_tokens=80, output_tokens=6)
    spec = WorkloadSpec(**{**spec.__dict__, "phases": (
        Phase(index=0, name="baseline c=1", concurrency=1, num_requests=3, role="baseline"),
        Phase(index=1, name=spec.phases[0].name, rate=40.0))})
    status, b1 = asyncio.run(run_probe(TestServer(), spec, tmp_path / "b1"))
    assert status is not None and status.detail["shared_prefix_tokens"] == 40
    reqs, block, _ = from_bundle(b1)
    measured = sorted((r for r in b1.records("requests") if r["phase"] == 1), key=lambda r: r["intended_ns"])
    assert len(reqs) == len(measured) == 11  # the baseline left out, the warm-up kept
    assert [r.input_tokens for r in reqs] == [80] * 11 and [r.output_tokens for r in reqs] == [6] * 11
    assert [r.offset_s for r in reqs] == pytest.approx(
        [(m["intended_ns"] - measured[0]["intended_ns"]) / 1e9 for m in measured], abs=1e-6)
    assert block == 16 and all(len(r.prefix) == 2 and r.prefix == reqs[0].prefix for r in reqs)  # 40 // 16
    # the command writes the same file; then replay it
    out = tmp_path / "w.jsonl"
    p = diagnose("workload", str(tmp_path / "b1"), "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert out.read_bytes().split(b"\n", 1)[1] == encode_workload(reqs, block_tokens=block, source="").split(b"\n", 1)[1]
    assert b"prompt" not in out.read_bytes() and "11 requests" in p.stdout
    rp = read_workload(out)
    srv = StampServer()
    status, b2 = asyncio.run(run_probe(srv, replay_spec(rp), tmp_path / "b2"))
    assert status is not None and status.detail["requests_ok"] == 11
    again, block2, _ = from_bundle(b2)
    assert block2 == block and len(again) == len(reqs)
    assert [(r.input_tokens, r.output_tokens, r.prefix) for r in again] == [
        (r.input_tokens, r.output_tokens, r.prefix) for r in reqs]
    assert [r.offset_s for r in again] == pytest.approx([r.offset_s for r in reqs], abs=1e-6)
    prompts = [words(body) for _, body in sent(srv)]
    assert all(w[:32] == prompts[0][:32] for w in prompts) and len({tuple(w) for w in prompts}) == 11


def test_workload_of_an_observe_bundle_is_one_line(tmp_path: Path) -> None:
    bw = BundleWriter(tmp_path / "obs", workload={"mode": "observe"})
    bw.finish()
    with pytest.raises(DiagnoseError, match="observe-mode capture with fewer than two metrics scrapes"):
        from_bundle(open_bundle(tmp_path / "obs"))
    p = diagnose("workload", str(tmp_path / "obs"), "-o", str(tmp_path / "w.jsonl"))
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 1 and len(lines) == 1 and lines[0].startswith("diagnose: error:"), p.stderr
    assert "observe" in lines[0] and not (tmp_path / "w.jsonl").exists()
    p = diagnose("workload", str(tmp_path / "nothing"))
    assert p.returncode == 2 and "Traceback" not in p.stderr and "no such file" in p.stderr


# -- the workload card --------------------------------------------------------------------------------------
async def run_with_manifest(server: TestServer, spec: WorkloadSpec, out: Path) -> Bundle:
    """Like run_probe, with the workload in the manifest as attach writes it."""
    from diagnose.probes.base import CaptureContext, Target
    from diagnose.probes.load import LoadProbe

    url = await server.start()
    bw = BundleWriter(out, workload=spec.to_json())
    ctx = CaptureContext(bundle=bw, target=Target(url=url), stop=asyncio.Event())
    try:
        status = await LoadProbe(spec, progress=False).run(ctx)
    finally:
        await server.stop()
    bw.set_probe_status(status)
    bw.finish()
    return open_bundle(out)


def test_workload_card_of_a_replay_and_of_a_synthetic_run(tmp_path: Path) -> None:
    import numpy as np

    from diagnose.cli.analyze import analysis_json, run_analysis

    rp = read_workload(DATA / "mooncake_sample.jsonl", speed=4)
    asyncio.run(run_with_manifest(TestServer(), replay_spec(rp), tmp_path / "r"))
    js = analysis_json(run_analysis(tmp_path / "r"))
    card = js["workload_card"]
    assert js["signals"]["workload_open_loop"]["value"] == 1.0  # a replay is an open loop (rule SCH008 reads it)
    ins = [r.input_tokens for r in rp.requests]
    outs = [r.output_tokens for r in rp.requests]
    assert card["mode"] == "replay" and card["source"] == f"replay of {DATA / 'mooncake_sample.jsonl'} (mooncake)"
    assert card["arrival"] == "recorded offsets, 4x speed" and card["requests"] == 12
    assert card["input_tokens_planned"] == {f"p{p}": pytest.approx(float(np.percentile(ins, p))) for p in (50, 90, 99)}
    assert card["output_tokens"] == {f"p{p}": pytest.approx(float(np.percentile(outs, p))) for p in (50, 90, 99)}
    assert card["prefix_share_planned"] == pytest.approx(prefix_share(rp.requests, 512))
    assert card["replay"]["requests"] == 12 and card["replay"]["speed"] == 4
    assert card["rate_rps"] is not None and card["rate_rps"] > 0 and card["concurrency_mean"] is not None
    assert card["cached_token_share"] == 0.0  # the test server reports cached_tokens 0 of 7
    assert card["fidelity"]["schedule_lag_p99_ms"] == js["signals"]["client_schedule_lag_p99_ms"]["value"]
    # the test server's usage says 7 prompt tokens whatever it got: served / planned shows the mismatch
    assert card["fidelity"]["input_served_over_planned_p50"] == pytest.approx(
        float(np.median([7 / n for n in ins])))
    assert card["fidelity"]["output_served_over_asked_p50"] == 1.0  # every output as long as recorded
    spec = spec_for(None, rate="30", num_requests=8, arrival="gamma", burstiness=0.5, shared_prefix_fraction=0.25)
    asyncio.run(run_with_manifest(TestServer(), spec, tmp_path / "s"))
    card = analysis_json(run_analysis(tmp_path / "s"))["workload_card"]
    assert card["source"] == "synthetic" and card["mode"] == "rate" and card["levels"] == ["rate=30/s"]
    assert card["arrival"] == "open loop, gamma (burstiness 0.5)" and card["prefix_share_planned"] == 0.25
    assert card["input_tokens_planned"] == {"p50": 32.0, "p90": 32.0, "p99": 32.0} and card["requests"] == 8


def test_attach_workload_end_to_end_with_card_in_json_and_report(tmp_path: Path) -> None:
    from tests.servers.truth import truth_server

    with truth_server(ttft_ms=2, itl_ms=1) as (url, _):
        p = subprocess.run([*DIAG, "attach", "--url", url, "--workload", str(DATA / "azure_sample.csv"), "--speed",
                            "3", "--baseline", "0", "--warmup", "0", "--no-nvml", "-o", str(tmp_path / "b")],
                           capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    b = open_bundle(tmp_path / "b")
    assert b.manifest["workload"]["mode"] == "replay"
    assert b.manifest["workload"]["replay"]["format"] == "azure" and b.manifest["workload"]["replay"]["speed"] == 3
    rp = read_workload(DATA / "azure_sample.csv")
    recs = sorted(b.records("requests"), key=lambda r: r["replay_index"])
    assert [r["max_tokens"] for r in recs] == [r.output_tokens for r in rp.requests] and all(r["ok"] for r in recs)
    p = diagnose("analyze", str(tmp_path / "b"), "-o", str(tmp_path / "r.html"), "--json",
                 str(tmp_path / "f.json"))
    assert p.returncode in (0, 5), p.stderr
    card = json.loads((tmp_path / "f.json").read_text())["workload_card"]
    assert card["source"].startswith("replay of ") and card["requests"] == 12 and card["mode"] == "replay"
    html = (tmp_path / "r.html").read_text()
    assert 'id="workload"' in html and "recorded offsets, 3x speed" in html
    assert html.index('id="workload"') < html.index('id="verdict"')
    # the replay's fidelity: lengths served against the file's, and the arrivals chart's two curves
    assert card["fidelity"]["output_served_over_asked_p50"] == 1.0
    assert "Replay fidelity" in html and "output tokens served / recorded 1.00" in html
    assert "Arrivals over time (requests sent per second" in html and ">scheduled<" in html


def test_replay_options_are_checked_before_connecting(tmp_path: Path) -> None:
    from diagnose.cli.attach import attach
    from diagnose.probes.load import workload_from_options

    f = write_diag(tmp_path / "w.jsonl", ROWS)

    def opts(*args: str) -> dict[str, Any]:
        return dict(attach.make_context("attach", ["--url", "http://127.0.0.1:9", *args]).params)

    spec = workload_from_options(opts("--workload", str(f), "--speed", "2", "--loop", "3", "--max-concurrency", "4",
                                      "--baseline", "2"))
    assert spec.mode == "replay" and spec.replay is not None and spec.replay.speed == 2 and spec.replay.loop == 3
    assert [p.role for p in spec.phases] == ["baseline", "measure"] and spec.phases[1].max_concurrency == 4
    assert spec.duration_s is None  # the whole file, not 30 s
    assert (spec.input_tokens, spec.output_tokens) == (33, 4)  # the baseline's size: the file's medians
    js = spec.to_json()
    assert js["replay"]["requests"] == 6 and js["replay"]["file"] == str(f) and "requests" not in js["phases"][0]
    for args, msg in ((("--workload", str(f), "-c", "4"), "drop --concurrency/--rate"),
                      (("--speed", "2"), "give --workload FILE"), (("--loop", "2"), "give --workload FILE"),
                      (("--workload", str(f), "--speed", "-1"), "--speed -1: must be a positive factor")):
        with pytest.raises(InputError, match=msg):
            workload_from_options(opts(*args))


def test_chat_replay_and_closed_loop_bundle_to_workload(tmp_path: Path) -> None:
    rp = read_workload(write_diag(tmp_path / "w.jsonl", ROWS[:3]))
    spec = replay_spec(rp)
    spec = WorkloadSpec(**{**spec.__dict__, "api": "chat"})
    srv = StampServer()
    status, _ = asyncio.run(run_probe(srv, spec, tmp_path / "b"))
    assert status is not None and status.detail["requests_ok"] == 3
    lens = sorted(len(str(body["messages"][0]["content"]).split()) + 1 for _, body in sent(srv))
    assert lens == sorted(r["input_tokens"] for r in ROWS[:3])
    # a closed loop: each worker's first request has no intended time, its send time stands in
    status, b = asyncio.run(run_probe(TestServer(), spec_for("2", num_requests=5), tmp_path / "c"))
    reqs, _, _ = from_bundle(b)
    recs = b.records("requests")
    assert sum(r["intended_ns"] is None for r in recs) == 2
    t = sorted(r["intended_ns"] if r["intended_ns"] is not None else r["sent_ns"] for r in recs)
    assert [r.offset_s for r in reqs] == pytest.approx([(x - t[0]) / 1e9 for x in t], abs=1e-6)
    assert {(r.input_tokens, r.output_tokens) for r in reqs} == {(32, 8)} and all(r.prefix == () for r in reqs)


def test_workload_card_in_the_report_is_escaped(tmp_path: Path) -> None:
    from diagnose.cli.analyze import run_analysis
    from diagnose.reports.render import write_report

    f = write_diag(tmp_path / "w<b>x.jsonl", ROWS[:2])
    asyncio.run(run_with_manifest(TestServer(), replay_spec(read_workload(f)), tmp_path / "r"))
    write_report(run_analysis(tmp_path / "r"), tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    card = html[html.index('id="workload"'):html.index("</section>", html.index('id="workload"'))]
    assert "w<b>x" not in html and "w&lt;b&gt;x.jsonl" in card and "<dt>Requests</dt><dd>2</dd>" in card


def test_workload_card_reports_cold_and_warm_apart() -> None:
    """Issue 13 item 6: the server's state when the capture began (its finished-request counter) and the first
    requests' TTFT apart from the rest of their phase, the same requests ttft_cold_ratio compares."""
    import numpy as np

    from diagnose.pipeline import analyze
    from diagnose.reports.view_model import build_view

    a = analyze(Path(__file__).resolve().parent.parent / "sample_traces" / "vllm_cpu_queue_bound" / "bundle")
    card = build_view(a)["workload_card"]
    w = {r["label"]: r["value"] for r in card}["Cold and warm"]
    served = int(a.signals["server_requests_before_capture"].value)
    assert w.startswith(f"server {'cold' if served < 10 else 'warm'} ({served} requests served before the capture)")
    req = a.tables["requests"]
    ok = req[req["ok"].astype(bool) & np.isfinite(req["ttft_ms"].to_numpy(dtype=float))].sort_values("sent_s")
    first = ok[ok["phase"] == ok["phase"].iloc[0]]["ttft_ms"].to_numpy(dtype=float)
    cold, warm = float(np.median(first[:3])), float(np.median(first[3:]))
    assert a.signals["ttft_cold_p50_ms"].value == pytest.approx(cold)
    assert a.signals["ttft_warm_p50_ms"].value == pytest.approx(warm)
    assert a.signals["ttft_cold_ratio"].value == pytest.approx(cold / warm)
    assert f"first 3 requests TTFT P50 {cold:.3g} ms, the rest of their phase {warm:.3g} ms" in w
    # the judgement follows the threshold the analysis ran with (--threshold), as VAL005 does
    bundle = Path(__file__).resolve().parent.parent / "sample_traces" / "vllm_cpu_queue_bound" / "bundle"
    moved = analyze(bundle, threshold_overrides={"cold_server_requests": float(served)})
    w2 = {r["label"]: r["value"] for r in build_view(moved)["workload_card"]}["Cold and warm"]
    assert w2.startswith(f"server warm ({served} requests served before the capture)"), w2
