"""The load probe against a real local aiohttp server (tests/load_testserver.py): records, workloads,
option negotiation, prompts, cancellation."""

from __future__ import annotations

import asyncio
import random
import statistics
from pathlib import Path
from typing import Any

import pytest

from diagnose.capture.workload import Phase, WorkloadSpec, build_phases
from diagnose.io.bundle import Bundle, open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.load import LoadProbe, _gap_fn
from diagnose.probes.prompts import PromptFactory
from tests.load_testserver import TestServer


def spec_for(concurrency: str | None = "2", rate: str | None = None, **kw: Any) -> WorkloadSpec:
    mode, phases = build_phases(concurrency if rate is None else None, rate, kw.pop("max_concurrency", None))
    base: dict[str, Any] = {"duration_s": None, "num_requests": 6, "input_tokens": 32, "output_tokens": 8}
    base.update(kw)
    return WorkloadSpec(mode=mode, phases=phases, **base)


async def run_probe(server: TestServer, spec: WorkloadSpec, out: Path, *, cancel_after: float | None = None,
                    stop_after: float | None = None, url: str | None = None) -> tuple[ProbeStatus | None, Bundle]:
    if url is None:
        url = await server.start()
    bw = BundleWriter(out)
    ctx = CaptureContext(bundle=bw, target=Target(url=url), stop=asyncio.Event())
    status: ProbeStatus | None = None
    task = asyncio.ensure_future(LoadProbe(spec, progress=False).run(ctx))
    try:
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            if stop_after is not None:
                await asyncio.sleep(stop_after)
                ctx.stop.set()
            status = await task
    finally:
        await server.stop()
    if status is not None:
        bw.set_probe_status(status)
    bw.finish()
    assert ctx.stop.is_set()
    return status, open_bundle(out)


def test_closed_loop_records_are_complete_and_exact(tmp_path: Path) -> None:
    srv = TestServer()
    status, b = asyncio.run(run_probe(srv, spec_for("3", warmup_requests=2, num_requests=10), tmp_path / "b"))
    assert status is not None and status.state == "ok"
    assert status.detail["requests_ok"] == 12 and status.detail["requests_failed"] == 0
    assert status.detail["request_options"] == {"stream_options": {"include_usage": True,
                                                                   "continuous_usage_stats": True},
                                                "ignore_eos": True}
    recs = b.records("requests")
    assert len(recs) == 12
    assert sum(r["warmup"] for r in recs) == 2
    assert sum(r["intended_ns"] is None for r in recs) == 3  # each worker's first request
    for r in recs:
        assert r["ok"] and r["error"] is None and r["http_status"] == 200
        assert r["sent_ns"] <= r["headers_ns"] <= r["first_token_ns"] <= r["end_ns"]
        assert r["output_tokens_usage"] == 8 and r["output_tokens_chunks"] == 8 and r["n_chunks"] == 8
        assert r["finish_reason"] == "length"
        assert r["prompt_tokens_source"] == "tokenize" and r["prompt_tokens"] == 32
        assert r["intended_ns"] is None or r["intended_ns"] <= r["sent_ns"]
        assert len(r["trace_id"]) == 32 and len(r["span_id"]) == 16
        assert "prompt_text" not in r and "output_text" not in r
    # the server saw exactly these ids and trace contexts (preflight + calibration excluded)
    run_headers = [h for h in srv.headers if not h["x-request-id"].endswith("preflight")]
    by_id = {h["x-request-id"]: h for h in run_headers}
    assert set(by_id) == {r["rid"] for r in recs}
    for r in recs:
        assert by_id[r["rid"]]["traceparent"] == f"00-{r['trace_id']}-{r['span_id']}-01"
    prompts = [body["prompt"] for body in srv.bodies[1:]]
    assert len(set(prompts)) == len(prompts)  # unique prompts
    chunks = {c["rid"]: c for c in b.records("chunks")}
    assert all(len(chunks[r["rid"]]["t_ns"]) == 8 and chunks[r["rid"]]["tok"] == [1] * 8 for r in recs)
    phases = b.records("phases")
    assert len(phases) == 1 and phases[0]["requests"] == 12 and not phases[0]["interrupted"]
    assert b.records("client_health")  # self-check samples were written


def test_multi_token_chunks_counted_from_continuous_usage(tmp_path: Path) -> None:
    srv = TestServer(tokens_per_chunk=3)
    status, b = asyncio.run(run_probe(srv, spec_for("2", output_tokens=10), tmp_path / "b"))
    assert status is not None and status.state == "ok"
    for c in b.records("chunks"):
        assert c["tok"] == [3, 3, 3, 1]
    assert all(r["output_tokens_chunks"] == 10 and r["n_chunks"] == 4 for r in b.records("requests"))


def test_rejected_options_are_negotiated_once(tmp_path: Path) -> None:
    srv = TestServer(tokens_per_chunk=2, reject=("continuous_usage_stats",))
    status, b = asyncio.run(run_probe(srv, spec_for("2", output_tokens=6), tmp_path / "b"))
    assert status is not None and status.state == "ok"
    assert status.detail["request_options"]["stream_options"] == {"include_usage": True}
    with_cus = [x for x in srv.bodies if (x.get("stream_options") or {}).get("continuous_usage_stats")]
    assert len(with_cus) == 1  # asked once, then never again
    for r in b.records("requests"):
        assert r["ok"] and r["output_tokens_usage"] == 6
        assert r["output_tokens_chunks"] == 3  # one per chunk without exact counts: usage tells the truth
    srv2 = TestServer(reject=("stream_options", "ignore_eos"))
    status2, b2 = asyncio.run(run_probe(srv2, spec_for("1", num_requests=2), tmp_path / "b2"))
    assert status2 is not None and status2.state == "ok" and status2.detail["request_options"] == {}
    assert all(r["ok"] and r["output_tokens_usage"] is None for r in b2.records("requests"))


def test_chat_role_chunk_is_not_the_first_token(tmp_path: Path) -> None:
    srv = TestServer(ttft_s=0.02)
    status, b = asyncio.run(run_probe(srv, spec_for("1", num_requests=2, api="chat"), tmp_path / "b"))
    assert status is not None and status.state == "ok"
    for r in b.records("requests"):
        assert r["api"] == "chat" and r["n_chunks"] == 8
        assert (r["first_token_ns"] - r["sent_ns"]) / 1e6 >= 19.0
    assert all("messages" in x for x in srv.bodies[1:])


def test_open_loop_rate_and_sweep_phases(tmp_path: Path) -> None:
    srv = TestServer()
    spec = spec_for(rate="100,200", num_requests=15, arrival="gamma", burstiness=0.5)
    status, b = asyncio.run(run_probe(srv, spec, tmp_path / "b"))
    assert status is not None and status.state == "ok"
    recs = b.records("requests")
    assert len(recs) == 30 and {r["phase"] for r in recs} == {0, 1}
    for ph in (0, 1):
        intended = [r["intended_ns"] for r in recs if r["phase"] == ph]
        assert intended == sorted(intended)
    phases = b.records("phases")
    assert [p["rate"] for p in phases] == [100.0, 200.0] and all(p["mode"] == "rate" for p in phases)
    assert phases[0]["end_ns"] <= phases[1]["start_ns"]


def test_arrival_gaps_have_the_asked_rate_and_burstiness() -> None:
    for arrival, shape, cv in (("poisson", 1.0, 1.0), ("gamma", 0.25, 2.0), ("constant", 1.0, 0.0)):
        spec = WorkloadSpec(arrival=arrival, burstiness=shape)  # type: ignore[arg-type]
        gap = _gap_fn(spec, 50.0, random.Random(1))
        xs = [gap() for _ in range(40000)]
        mean = statistics.fmean(xs)
        assert mean == pytest.approx(0.02, rel=0.05)
        assert statistics.pstdev(xs) / mean == pytest.approx(cv, abs=0.08)


def test_duration_bounds_the_phase_and_per_phase_override(tmp_path: Path) -> None:
    srv = TestServer(itl_s=0.01)
    phases = (Phase(index=0, name="base", concurrency=1, num_requests=2, role="baseline"),
              Phase(index=1, name="c=2", concurrency=2, duration_s=0.6))
    spec = WorkloadSpec(phases=phases, duration_s=None, num_requests=None, input_tokens=16, output_tokens=5)
    status, b = asyncio.run(run_probe(srv, spec, tmp_path / "b"))
    assert status is not None and status.state == "ok"
    ph = b.records("phases")
    assert ph[0]["role"] == "baseline" and ph[0]["requests"] == 2
    dur = (ph[1]["end_ns"] - ph[1]["start_ns"]) / 1e9
    assert 0.6 <= dur < 1.5
    assert all(r["sent_ns"] <= ph[1]["start_ns"] + 0.6e9 for r in b.records("requests") if r["phase"] == 1)


def test_cancel_mid_run_keeps_finished_records_and_marks_in_flight(tmp_path: Path) -> None:
    srv = TestServer(itl_s=0.01)
    spec = spec_for("2", num_requests=None, duration_s=30.0, output_tokens=10)
    _, b = asyncio.run(run_probe(srv, spec, tmp_path / "b", cancel_after=1.5))
    recs = b.records("requests")
    done = [r for r in recs if r["ok"]]
    incomplete = [r for r in recs if r["error"] == "incomplete"]
    assert len(done) >= 2 and len(incomplete) == 2
    assert all(r["n_chunks"] == 10 for r in done)
    ph = b.records("phases")
    assert len(ph) == 1 and ph[0]["interrupted"] and ph[0]["end_ns"] is not None


def test_outside_stop_ends_the_run_with_partial_status(tmp_path: Path) -> None:
    srv = TestServer(itl_s=0.005)
    spec = spec_for("2", num_requests=None, duration_s=30.0, output_tokens=10)
    status, b = asyncio.run(run_probe(srv, spec, tmp_path / "b", stop_after=0.6))
    assert status is not None and status.state == "ok" and status.detail.get("interrupted") is True
    assert b.records("phases")[0]["interrupted"]
    assert all(r["ok"] for r in b.records("requests"))  # in-flight requests finished within the grace


def test_prompts_exact_unique_and_shared_prefix() -> None:
    f = PromptFactory(100, shared_prefix_fraction=0.5, seed=3)
    a, b = f.make(0), f.make(1)
    wa, wb = a.text.split(), b.text.split()
    assert len(wa) == len(wb) == 99 and a.tokens == 100 and a.source == "estimate"
    assert wa[:50] == wb[:50] and wa[50:] != wb[50:]
    assert len({f.make(i).text for i in range(2000)}) == 2000
    g = PromptFactory(100, seed=3)
    assert g.make(0).text.split()[0] != g.make(1).text.split()[0]  # no shared prefix asked: differ at once


def test_api_key_text_storage_and_capped_open_loop(tmp_path: Path) -> None:
    async def scenario() -> tuple[TestServer, ProbeStatus, Bundle]:
        srv = TestServer(itl_s=0.01)
        url = await srv.start()
        bw = BundleWriter(tmp_path / "b")
        ctx = CaptureContext(bundle=bw, target=Target(url=url, api_key="sk-test-123"), stop=asyncio.Event())
        spec = spec_for(rate="500", num_requests=12, max_concurrency=2, store_text=True)
        status = await LoadProbe(spec, progress=True).run(ctx)  # progress forced on: must not break anything
        await srv.stop()
        bw.finish()
        return srv, status, open_bundle(tmp_path / "b")

    srv, status, b = asyncio.run(scenario())
    assert status.state == "ok"
    assert all(h["authorization"] == "Bearer sk-test-123" for h in srv.headers)
    recs = b.records("requests")
    assert all(r["prompt_text"].split() and r["output_text"] == " tok" * 8 for r in recs)
    assert sum(r["capped"] for r in recs) >= 5  # 500/s asked, 2 in flight allowed: most arrivals wait
    for f in (tmp_path / "b").rglob("*"):  # the key is never written to disk
        assert not f.is_file() or b"sk-test-123" not in f.read_bytes()


def test_periodic_flush_is_sliced_and_the_final_flush_keeps_order(tmp_path: Path) -> None:
    """A wave of finished requests is serialised a few records per event-loop turn (so chunk stamps are
    never held up by one long write), written in order by the I/O thread, and all on disk after flush()."""
    from diagnose.probes.load import FLUSH_SLICE, _LoadRun

    async def go() -> list[int]:
        bw = BundleWriter(tmp_path / "b")
        ctx = CaptureContext(bundle=bw, target=Target(url="http://127.0.0.1:1"), stop=asyncio.Event())
        run = _LoadRun(spec_for("1"), ctx, progress=False)
        n = FLUSH_SLICE * 10 + 3
        run._chunk_buf.extend({"rid": f"r{i}", "t_ns": list(range(256)), "tok": [1] * 256} for i in range(n))
        run.flush_soon()
        await asyncio.sleep(0)  # one slice per loop turn
        left = [len(run._chunk_buf)]
        await asyncio.sleep(0)
        left.append(len(run._chunk_buf))
        run.flush()
        run._io.shutdown(wait=True)
        await run.client.close()
        bw.finish()
        return [n, *left]

    n, after1, after2 = asyncio.run(go())
    assert after1 == n - FLUSH_SLICE and after2 == n - 2 * FLUSH_SLICE
    rids = [r["rid"] for r in open_bundle(tmp_path / "b").records("chunks")]
    assert rids == [f"r{i}" for i in range(n)]


def test_prompts_are_deterministic_per_seed() -> None:
    a, b, c = PromptFactory(64, seed=5), PromptFactory(64, seed=5), PromptFactory(64, seed=6)
    assert [a.make(i).text for i in range(50)] == [b.make(i).text for i in range(50)]
    assert a.make(7).text != c.make(7).text
    assert all(len(a.make(i).text.split()) == a.planned_tokens() - a.base for i in range(50))
