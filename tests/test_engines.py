"""Engine detection and the per-engine metric maps.

vLLM detection runs against the real server in tests/engine/test_prometheus_vllm.py. SGLang, TGI and
llama.cpp cannot run here, so they are FAKE loopback servers answering with the documented endpoint shapes
(engine_telemetry.md sections 2, 3, 5): they test our parsing of those shapes, not the engines.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from diagnose.engines.detect import (
    METRIC_MAPS,
    EngineInfo,
    detect_engine,
    engine_from_metric_names,
    is_engine_relevant,
    metric_map,
)

DATA = Path(__file__).parent / "data" / "metrics"


async def _detect_with(routes: dict[str, Any], status: int = 200) -> EngineInfo:
    app = web.Application()
    for path, body in routes.items():
        async def h(request: web.Request, body: Any = body) -> web.StreamResponse:
            if isinstance(body, str):
                return web.Response(text=body, status=status)
            return web.json_response(body, status=status)
        app.router.add_get(path, h)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session:
            return await detect_engine(f"http://127.0.0.1:{port}/", session, timeout_s=2)
    finally:
        await runner.cleanup()


def test_fake_sglang_is_detected_from_owned_by_with_version_and_max_running() -> None:
    info = asyncio.run(_detect_with({
        "/v1/models": {"object": "list", "data": [{"id": "qwen", "owned_by": "sglang"}]},
        "/server_info": {"version": "0.5.23", "frontend": "python", "max_running_requests": 48},
    }))
    assert (info.name, info.version, info.models) == ("sglang", "0.5.23", ("qwen",))
    assert info.config == {"max_num_seqs": 48}
    assert info.evidence == ("/v1/models owned_by=sglang",)


def test_fake_tgi_is_detected_from_info() -> None:
    info = asyncio.run(_detect_with({
        "/v1/models": {"data": [{"id": "bigscience/bloom", "owned_by": "bigscience/bloom"}]},
        "/info": {"model_id": "bigscience/bloom", "version": "3.3.6", "max_concurrent_requests": 128,
                  "router": "text-generation-router"},
    }))
    assert (info.name, info.version) == ("tgi", "3.3.6")
    assert info.config["max_concurrent_requests"] == 128


def test_fake_llamacpp_is_detected_and_slots_are_its_concurrency() -> None:
    info = asyncio.run(_detect_with({
        "/v1/models": {"data": [{"id": "model.gguf", "owned_by": "llamacpp"}]},
        "/props": {"total_slots": 4, "build_info": "b6000-abc", "default_generation_settings": {"n_ctx": 4096}},
    }))
    # the context from /props: each slot's n_ctx times the slots (-c is their total)
    assert (info.name, info.version, info.config) == ("llamacpp", "b6000-abc", {"max_num_seqs": 4,
                                                                                "context_size": 16384})


def test_unknown_server_falls_back_to_metric_prefixes() -> None:
    info = asyncio.run(_detect_with({"/metrics": (DATA / "sglang_handwritten.txt").read_text()}))
    assert info.name == "sglang" and info.evidence == ("/metrics prefix sglang:",)
    assert info.models == ()


def test_plain_openai_server_is_unknown() -> None:
    info = asyncio.run(_detect_with({"/v1/models": {"data": [{"id": "gpt-x", "owned_by": "someone"}]},
                                     "/version": {"version": "1.2"}}))
    assert info.name == "unknown" and info.models == ("gpt-x",) and info.version == "1.2"


def test_garbage_and_errors_give_unknown_without_raising() -> None:
    info = asyncio.run(_detect_with({"/v1/models": "<html>nope</html>", "/props": "[1, 2"}, status=200))
    assert info == EngineInfo()
    info = asyncio.run(_detect_with({"/v1/models": {"data": []}}, status=500))
    assert info.name == "unknown"


def test_dead_server_gives_unknown() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go() -> EngineInfo:
        async with aiohttp.ClientSession() as session:
            return await detect_engine(f"http://127.0.0.1:{port}", session, timeout_s=1)

    info = asyncio.run(go())
    assert info.to_json() == {"name": "unknown", "version": None, "models": [], "evidence": [], "config": {}}


def test_engine_from_metric_names_votes_by_prefix() -> None:
    assert engine_from_metric_names(["vllm:a", "vllm:b", "process_cpu_seconds_total"]) == "vllm"
    assert engine_from_metric_names(["tgi_queue_size", "llamacpp:x", "tgi_batch_current_size"]) == "tgi"
    assert engine_from_metric_names(["http_requests_total", "process_cpu_seconds_total"]) is None


def test_probe_filter_keeps_engine_namespaces_and_process_basics() -> None:
    assert is_engine_relevant("vllm:num_requests_waiting")
    assert is_engine_relevant("sglang:token_usage") and is_engine_relevant("llamacpp:requests_deferred")
    assert is_engine_relevant("process_resident_memory_bytes") and is_engine_relevant("process_cpu_seconds_total")
    assert not is_engine_relevant("vllm:num_preemptions_created")
    assert not is_engine_relevant("http_request_duration_seconds_bucket")
    assert not is_engine_relevant("python_gc_collections_total")
    assert not is_engine_relevant("process_open_fds")


def test_maps_cover_the_core_signals_and_use_only_real_namespaces() -> None:
    core = {"queue_depth", "running_requests"}
    for engine, refs in METRIC_MAPS.items():
        signals = {r.signal for r in refs}
        assert core <= signals, engine
        for r in refs:
            assert r.kind in ("gauge", "counter", "histogram") and r.names
            assert all(is_engine_relevant(n) for n in r.names), (engine, r.names)
    assert {r.signal for r in metric_map("no-such-engine")} == {"process_cpu_seconds",
                                                                "process_resident_memory_bytes"}
    vllm = {r.signal: r for r in METRIC_MAPS["vllm"]}
    assert vllm["kv_usage_ratio"].names == ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert vllm["itl_seconds"].names[1] == "vllm:time_per_output_token_seconds"  # pre-0.11 name
