#!/usr/bin/env python3
"""A toy continuous-batching LLM engine on a CUDA GPU (torch), behind an OpenAI-compatible streaming API.

Not a language model: it exists so that diagnose's GPU paths (NVML counters, a CUDA profiler trace, the
GPU rules) can be exercised for real on a lent GPU machine, where no vLLM GPU build can be installed
(no network there). Its GPU work has the shape of LLM serving, so the counters move the way they do
under a real engine:

- **decode step**: every running request gets one token per step. The step multiplies the batch's hidden
  states [B, H] by every layer's weight matrix, so each step reads all the weights from device memory:
  memory-bandwidth-bound, like real decode at small batch.
- **prefill**: a new request first runs [prompt_tokens, H] through the layers: compute-bound (tensor cores).
- **host work**: ``--host-ms`` spins Python on the engine thread between steps (a stand-in for scheduling,
  sampling and detokenisation in Python), leaving the GPU idle meanwhile: a host-bound engine.

The engine runs in its own thread (GPU work and its synchronize never block the event loop); tokens go back
to the streams with ``loop.call_soon_threadsafe``. At most ``--max-batch`` requests run; the rest queue.

Endpoints: POST /v1/completions (stream or not), GET /v1/models, GET /version, GET /health,
POST /start_profile {"max_iterations": N, "profile_prefix": P} (torch.profiler with CUDA activities over the
next N steps, written to ``--profiler-dir`` as P-rank0.pt.trace.json.gz, like vLLM's worker traces), POST
/stop_profile. Prompts are never stored; the output text is " tok" per token.

Usage: gpu_toy_engine.py [--port 8000] [--weights-gb 8] [--hidden 8192] [--max-batch 64] [--host-ms 0]
                         [--device cuda] [--profiler-dir DIR]
Runs on CPU too (``--device cpu`` with small weights), which is how benchmarks/gpu_device_check.sh is
checked without a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

MODEL = "toy-gpu"
VERSION = "0.1.0"


@dataclass
class Req:
    prompt_tokens: int
    max_tokens: int
    out: asyncio.Queue[int | None]
    loop: asyncio.AbstractEventLoop
    done: int = 0
    prefilled: bool = False


class Engine:
    def __init__(self, *, weights_gb: float, hidden: int, max_batch: int, host_ms: float, device: str,
                 profiler_dir: str | None) -> None:
        self.device = torch.device(device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        per_layer = hidden * hidden * (2 if self.dtype == torch.bfloat16 else 4)
        self.layers = max(1, int(weights_gb * 2**30 // per_layer))
        g = torch.Generator(device="cpu").manual_seed(0)
        w = (torch.randn(hidden, hidden, generator=g) / math.sqrt(hidden)).to(self.device, self.dtype)
        self.weights = [w] + [w.clone() for _ in range(self.layers - 1)]  # distinct memory: every layer is read
        self.hidden = hidden
        self.max_batch = max_batch
        self.host_s = host_ms / 1000.0
        self.profiler_dir = Path(profiler_dir) if profiler_dir else None
        self.incoming: queue.Queue[Req] = queue.Queue()
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.steps = 0
        self._profile: tuple[int, str] | None = None  # (steps left, prefix) once asked
        self._prof: Any = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="toy-engine", daemon=True)

    def start(self) -> None:
        self._forward(torch.zeros(1, self.hidden, device=self.device, dtype=self.dtype))  # warm-up
        self._sync()
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)

    def submit(self, req: Req) -> None:
        self.incoming.put(req)

    def start_profile(self, iterations: int, prefix: str) -> None:
        self._profile = (iterations, prefix)

    # -- engine thread ------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.weights:
            x = torch.tanh(x @ w)
        return x

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.running and not self.waiting:  # idle: wait for a request
                try:
                    self.waiting.append(self.incoming.get(timeout=0.05))
                except queue.Empty:
                    continue
            while True:  # everything else that has arrived
                try:
                    self.waiting.append(self.incoming.get_nowait())
                except queue.Empty:
                    break
            while self.waiting and len(self.running) < self.max_batch:
                self.running.append(self.waiting.pop(0))
            if self.running:
                self._step()

    def _step(self) -> None:
        self._maybe_start_profiler()
        rf = torch.profiler.record_function
        # ProfilerStep#N: the annotation torch's own step() writes, by which the trace analysis finds steps
        with rf(f"ProfilerStep#{self.steps}"), rf("execute_model"):
            new = [r for r in self.running if not r.prefilled]
            for r in new:  # prefill: the prompt's tokens through every layer (compute-bound)
                with rf("prefill"):
                    self._forward(torch.ones(max(1, r.prompt_tokens), self.hidden, device=self.device,
                                             dtype=self.dtype))
                r.prefilled = True
            with rf("decode"):  # one token for every running request (reads all weights)
                self._forward(torch.ones(len(self.running), self.hidden, device=self.device, dtype=self.dtype))
            self._sync()
        if self.host_s > 0:  # Python on the engine thread while the GPU waits
            with rf("host_work"):
                end = time.perf_counter() + self.host_s
                while time.perf_counter() < end:
                    pass
        self.steps += 1
        keep = []
        for r in self.running:
            r.done += 1
            last = r.done >= r.max_tokens
            r.loop.call_soon_threadsafe(r.out.put_nowait, r.done)
            if last:
                r.loop.call_soon_threadsafe(r.out.put_nowait, None)
            else:
                keep.append(r)
        self.running = keep
        self._maybe_stop_profiler()

    def _maybe_start_profiler(self) -> None:
        if self._profile is None or self._prof is not None:
            return
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(activities=acts, record_shapes=False)
        self._prof.__enter__()

    def _maybe_stop_profiler(self) -> None:
        if self._prof is None or self._profile is None:
            return
        left, prefix = self._profile
        left -= 1
        self._profile = (left, prefix)
        if left > 0:
            return
        prof, self._prof, self._profile = self._prof, None, None
        prof.__exit__(None, None, None)
        if self.profiler_dir is not None:
            self.profiler_dir.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(self.profiler_dir / f"{prefix}-rank0.pt.trace.json.gz"))


def _chunk(rid: str, text: str, finish: str | None) -> bytes:
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": MODEL,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def make_app(engine: Engine) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except Exception:
            return web.json_response({"error": {"message": "body is not JSON"}}, status=400)
        prompt = body.get("prompt", "")
        prompt_tokens = len(prompt.split()) if isinstance(prompt, str) else len(prompt)
        max_tokens = int(body.get("max_tokens") or 16)
        loop = asyncio.get_running_loop()
        req = Req(prompt_tokens, max_tokens, asyncio.Queue(), loop)
        engine.submit(req)
        rid = f"cmpl-{uuid.uuid4().hex[:16]}"
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                 "total_tokens": prompt_tokens + max_tokens}
        if not body.get("stream"):
            while await req.out.get() is not None:
                pass
            return web.json_response({"id": rid, "object": "text_completion", "model": MODEL, "usage": usage,
                                      "choices": [{"index": 0, "text": " tok" * max_tokens,
                                                   "finish_reason": "length"}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        while (n := await req.out.get()) is not None:
            await resp.write(_chunk(rid, " tok", "length" if n >= max_tokens else None))
        if (body.get("stream_options") or {}).get("include_usage"):
            tail = {"id": rid, "object": "text_completion", "model": MODEL, "choices": [], "usage": usage}
            await resp.write(b"data: " + json.dumps(tail).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model",
                                                              "max_model_len": 4096}]})

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": f"toy-gpu-engine {VERSION}"})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def start_profile(request: web.Request) -> web.Response:
        if engine.profiler_dir is None:
            return web.json_response({"error": "profiler not enabled (--profiler-dir)"}, status=404)
        try:
            body = await request.json()
        except Exception:
            body = {}
        engine.start_profile(int(body.get("max_iterations") or 8), str(body.get("profile_prefix") or "toy"))
        return web.json_response({})

    async def stop_profile(_: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions), web.get("/v1/models", models),
                    web.get("/version", version), web.get("/health", health),
                    web.post("/start_profile", start_profile), web.post("/stop_profile", stop_profile)])
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--weights-gb", type=float, default=8.0)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--host-ms", type=float, default=0.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profiler-dir")
    a = ap.parse_args()
    engine = Engine(weights_gb=a.weights_gb, hidden=a.hidden, max_batch=a.max_batch, host_ms=a.host_ms,
                    device=a.device, profiler_dir=a.profiler_dir)
    engine.start()
    print(f"toy engine: {engine.layers} layers of {a.hidden}x{a.hidden} on {engine.device}, "
          f"max batch {a.max_batch}, host {a.host_ms} ms/step", flush=True)
    try:
        web.run_app(make_app(engine), host=a.host, port=a.port, print=None)
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
