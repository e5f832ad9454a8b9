"""A real aiohttp server on 127.0.0.1 that answers like vLLM's OpenAI API, or misbehaves on purpose.

Used by tests/test_load_*.py. Modes: ok, status (answer ``status`` with a JSON error), reset (close the
connection mid-stream), stall (stop streaming, keep the connection open), malformed (a data line that is not
JSON), nonsse (200 with a JSON body to a streaming request). ``reject`` lists request options answered with
400 (as servers that do not know them do): continuous_usage_stats, stream_options, ignore_eos.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web


class TestServer:
    __test__ = False  # not a pytest class

    def __init__(self, mode: str = "ok", *, status: int = 200, tokens_per_chunk: int = 1, itl_s: float = 0.0,
                 ttft_s: float = 0.0, reject: tuple[str, ...] = (), tokenize: bool = True) -> None:
        self.mode = mode
        self.status = status
        self.k = tokens_per_chunk
        self.itl_s = itl_s
        self.ttft_s = ttft_s
        self.reject = reject
        self.tokenize = tokenize
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        if self.tokenize:
            app.router.add_post("/tokenize", self.tokenize_route)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def tokenize_route(self, request: web.Request) -> web.Response:
        js = await request.json()
        text = js.get("prompt") if "prompt" in js else " ".join(m["content"] for m in js.get("messages", []))
        n = 1 + len(str(text).split())  # BOS + one token per word
        return web.json_response({"count": n, "max_model_len": 2048, "tokens": list(range(n))})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        so = body.get("stream_options") or {}
        rejected = (("continuous_usage_stats" in self.reject and so.get("continuous_usage_stats"))
                    or ("stream_options" in self.reject and "stream_options" in body)
                    or ("ignore_eos" in self.reject and "ignore_eos" in body))
        if rejected:
            return web.json_response({"object": "error", "message": "unknown field", "code": 400}, status=400)
        if self.mode == "status":
            return web.json_response({"object": "error", "message": f"status {self.status} on purpose"},
                                     status=self.status)
        if self.mode == "nonsse":
            return web.json_response({"choices": [{"text": "x"}]})
        chat = request.path.endswith("/chat/completions")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(self.ttft_s)
        n = int(body.get("max_tokens") or 16)
        cont = bool(so.get("continuous_usage_stats"))
        if chat:
            await resp.write(self._chunk(chat, "", None, 0, cont, role=True))
        sent = 0
        while sent < n:
            k = min(self.k, n - sent)
            sent += k
            last = sent >= n
            await resp.write(self._chunk(chat, " tok" * k, "length" if last else None, sent, cont))
            if sent == 2 and self.mode in ("reset", "stall", "malformed"):
                if self.mode == "reset":
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                if self.mode == "malformed":
                    await resp.write(b"data: {not json\n\n")
                    continue
                await asyncio.sleep(3600)
            if self.itl_s and not last:
                await asyncio.sleep(self.itl_s)
        if so.get("include_usage"):
            usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": n + 7,
                     "prompt_tokens_details": {"cached_tokens": 0}}
            await resp.write(b"data: " + json.dumps({"id": "x", "choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    @staticmethod
    def _chunk(chat: bool, text: str, finish: str | None, cum: int, cont: bool, role: bool = False) -> bytes:
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        obj: dict[str, Any] = {"id": "cmpl-1", "object": "chunk", "model": "tiny", "choices": [choice]}
        if cont:
            obj["usage"] = {"prompt_tokens": 7, "completion_tokens": cum, "total_tokens": cum + 7}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"
