"""llama.cpp's /slots probe against a loopback server that answers as llama-server does: numbers kept, text
never; its signals; a server without /slots; engines it does not apply to."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp import web

from diagnose.io.writer import BundleWriter
from diagnose.model import ProbeStatus, Window
from diagnose.normalize import slots as slots_norm
from diagnose.pipeline import analyze
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.slots import SlotsProbe, slot_rows
from tests.test_prometheus_probe import _serve

SECRET_TEXT = "the prompt text that must never reach the bundle"


def _slot(i: int, busy: bool, tokens: int, decoded: int, n_ctx: int = 256) -> dict[str, Any]:
    """One slot as llama-server 0c1e57098 writes it (server_slot::to_json, not only_metrics): n_prompt_tokens is
    the tokens in the slot's context (prompt + generated so far); prompt and generated text are there too."""
    return {"id": i, "n_ctx": n_ctx, "speculative": False, "is_processing": busy, "id_task": 7,
            "n_prompt_tokens": tokens, "n_prompt_tokens_processed": 5, "n_prompt_tokens_cache": 1,
            "params": {"n_predict": 256}, "prompt": SECRET_TEXT, "generated": SECRET_TEXT,
            "next_token": [{"has_next_token": busy, "has_new_line": False, "n_remain": 10, "n_decoded": decoded}]}


def test_slot_rows_keep_numbers_only() -> None:
    rows = slot_rows([_slot(0, True, 200, 72), {"id": 1, "n_ctx": 256, "is_processing": False}])
    assert rows == [{"id": 0, "n_ctx": 256, "busy": True, "tokens": 200, "decoded": 72},
                    {"id": 1, "n_ctx": 256, "busy": False, "tokens": None, "decoded": None}]
    assert SECRET_TEXT not in json.dumps(rows)
    # a build that reports n_past: what the context holds, whatever n_prompt_tokens counts there
    assert slot_rows([{"id": 0, "n_ctx": 512, "is_processing": True, "n_past": 300, "n_prompt_tokens": 128}])[0][
        "tokens"] == 300
    assert slot_rows({"error": "not a list"}) is None and slot_rows([1, 2]) is None


def _capture(tmp_path: Path, handler: Any, engine: str = "llamacpp", duration_s: float = 0.4
             ) -> tuple[SlotsProbe, CaptureContext, ProbeStatus | None]:
    async def main() -> tuple[SlotsProbe, CaptureContext, ProbeStatus | None]:
        runner, base = await _serve(handler, "/slots")  # the Prometheus probe tests' loopback server
        try:
            bw = BundleWriter(tmp_path / "b", target={"url": base, "engine": engine})
            ctx = CaptureContext(bundle=bw, target=Target(url=base, engine=engine), stop=asyncio.Event())
            probe = SlotsProbe(interval_s=0.05)
            status = None
            if probe.applies(ctx):
                assert probe.available(ctx) == (True, "")
                task = asyncio.create_task(probe.run(ctx))
                await asyncio.sleep(duration_s)
                ctx.stop.set()
                status = await asyncio.wait_for(task, 10)
                bw.set_probe_status(status)
            bw.finish()
            return probe, ctx, status
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_samples_of_a_llama_server_become_context_signals(tmp_path: Path) -> None:
    n = {"calls": 0}

    async def handler(request: web.Request) -> web.Response:
        n["calls"] += 1
        full = n["calls"] % 2 == 0  # every other sample a slot is at the end of its context
        return web.json_response([_slot(0, True, 256 if full else 140, 120 if full else 12), _slot(1, False, 90, 3)])

    _, _, st = _capture(tmp_path, handler)
    assert st is not None and st.state == "ok", st
    assert st.detail["samples"] >= 4 and st.detail["slots"] == 2 and st.reason.startswith(f"{st.detail['samples']} samples")
    cost = st.detail["cost"]
    assert cost["target_ms"] > 0 and cost["colocated"]  # the server's time for the exchanges, measured
    raw = (tmp_path / "b" / "slots.jsonl").read_text()
    assert SECRET_TEXT not in raw and "prompt" not in raw  # numbers only
    tables = slots_norm.tables(_open(tmp_path / "b"))
    sig = {s.name: s.value for s in slots_norm.signals(tables, Window(0.0, 1e9))}
    assert sig["slot_context_tokens"] == 256
    assert sig["slot_context_used_max_ratio"] == 1.0  # 256 of 256 in a busy slot
    assert sig["slots_busy_mean"] == 1.0  # the idle slot's old numbers do not count


def test_an_answer_arriving_in_pieces_is_read_whole(tmp_path: Path) -> None:
    """/slots of many slots arrives in several pieces (a busy server, a slow network): one read(n) returns what
    has arrived so far, which is not JSON yet. Every sample must still be read whole."""
    body = json.dumps([_slot(i, i % 2 == 0, 100 + i, 10) for i in range(16)]).encode()
    assert len(body) > 4096

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for i in range(0, len(body), 1024):
            await resp.write(body[i:i + 1024])
            await asyncio.sleep(0.003)
        await resp.write_eof()
        return resp

    _, _, st = _capture(tmp_path, handler, duration_s=0.6)
    assert st is not None and st.state == "ok", st
    assert st.detail["samples"] >= 3 and st.detail["slots"] == 16, st.detail
    assert st.detail.get("failed", 0) == 0, st.detail


def _open(path: Path) -> Any:
    from diagnose.io.bundle import open_bundle

    return open_bundle(path)


def test_a_server_started_with_no_slots_makes_the_probe_unavailable(tmp_path: Path) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": 501, "message": "This server does not support slots endpoint."}},
                                 status=501)

    _, _, st = _capture(tmp_path, handler)
    assert st is not None and st.state == "unavailable" and "HTTP 501" in st.reason, st
    assert not (tmp_path / "b" / "slots.jsonl").exists()


def test_another_engine_leaves_the_probe_out(tmp_path: Path) -> None:
    async def handler(request: web.Request) -> web.Response:  # pragma: no cover - never called
        raise AssertionError("a vLLM capture must not ask for /slots")

    _, _, st = _capture(tmp_path, handler, engine="vllm")
    assert st is None


def test_a_bundle_without_slots_gives_no_slot_signals() -> None:
    a = analyze(Path(__file__).resolve().parent.parent / "sample_traces" / "vllm_cpu_healthy")
    assert not {"slot_context_tokens", "slot_context_used_max_ratio", "slots_busy_mean"} & set(a.signals)
    b = analyze(Path(__file__).resolve().parent.parent / "sample_traces" / "llama_ctx_too_small")
    assert b.signals["slot_context_tokens"].value == 256 and b.signals["slot_context_used_max_ratio"].value >= 0.95
