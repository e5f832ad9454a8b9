"""A small OpenAI-compatible streaming server that misbehaves on purpose, for the capture fault tests.

Run as a script (``python tests/servers/faults.py --port P --mode M``) or through :func:`fault_server`.
Modes (``--mode``):

* ``ok``: streams ``--tokens`` tokens, ``--itl-ms`` apart;
* ``echo401``: every completion answers 401 with a body that echoes the Authorization header and the prompt
  (as many gateways do);
* ``echo_event``: 200 and an event stream whose first event is an ``error`` echoing header and prompt;
* ``status``: every completion answers ``--status`` (with ``Retry-After: --retry-after`` when given);
* ``stall``: every ``--stall-every``-th request sends its first token and then nothing (the connection stays
  open);
* ``die``: like ok, then the process exits ``--die-after`` seconds after its start (a server killed
  mid-capture).

``--leak-cancelled`` makes ``vllm:num_requests_running`` count the streams being served plus every stream whose
client went away (an engine that goes on generating for clients that left; the readiness tests' leak).
``--stale-gauge`` (with ``--leak-cancelled``'s metrics) shows the count as of the last stream that started or
ended normally: a stream whose client left is not counted off until another request runs (vLLM's gauges after
aborts, vllm#29928).
``--slots N`` serves at most N requests at once, the rest wait in arrival order (a server at capacity, its queue
unbounded, as vLLM's and llama-server's are); ``--max-waiting K`` bounds that queue: a request that finds K
waiting is answered 429 with ``Retry-After: 1`` at once (a gateway's concurrency limit in front of it).
``--unready-s S --state FILE`` says healthy at once (``/health`` 200); a first start creates FILE and serves, a
restart (FILE there) answers completions 503 for S seconds (a server whose health check passes before its model
serves).
``--models-status`` makes ``/v1/models`` answer that status; ``--metrics-mb`` makes ``/metrics`` that many
MB of engine-looking Prometheus text; ``--log FILE`` appends every prompt received as a JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

METRICS = (
    "# HELP vllm:num_requests_running Number of requests running.\n# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="tiny"} 1.0\n'
    "# HELP vllm:num_requests_waiting Number of requests waiting.\n# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{model_name="tiny"} 0.0\n'
)


class Faults:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.n = 0
        self.log = open(a.log, "a", encoding="utf-8") if a.log else None  # noqa: SIM115 - for the process's life
        self.huge: bytes | None = None
        # --slots N: at most N requests served at once, the rest wait in arrival order (a server at capacity)
        self.slots = asyncio.Semaphore(a.slots) if a.slots > 0 else None
        self.running = 0  # streams being served (--leak-cancelled: their metrics)
        self.leaked = 0  # streams whose client left (--leak-cancelled: counted as running for ever)
        self.shown = 0  # --stale-gauge: the running count as of the last normal start or end
        self.waiting = 0  # --slots: requests waiting for one (--max-waiting bounds them)
        self.t_start = time.monotonic()
        # --unready-s: a first start (no --state file yet) creates the file and serves at once; a restart is unready
        self.unready_s = 0.0
        if a.unready_s and a.state:
            if os.path.exists(a.state):
                self.unready_s = a.unready_s
            else:
                open(a.state, "w").close()  # noqa: SIM115 - an empty marker

    def prompt_of(self, body: dict[str, Any]) -> str:
        if "prompt" in body:
            return str(body["prompt"])
        return " ".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))

    async def models(self, request: web.Request) -> web.Response:
        if self.a.models_status != 200:
            return web.json_response({"error": {"message": "model registry unavailable"}},
                                     status=self.a.models_status)
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        if self.a.leak_cancelled or self.a.stale_gauge:
            n = self.shown if self.a.stale_gauge else self.running + self.leaked
            return web.Response(text=METRICS.replace("} 1.0", f"}} {n}.0"),
                                content_type="text/plain")
        if not self.a.metrics_mb:
            return web.Response(text=METRICS, content_type="text/plain")
        if self.huge is None:
            line = 'vllm:request_latency_bucket{model_name="tiny",le="%d",shard="%06d"} 1.0\n'
            lines = [METRICS]
            size = 0
            i = 0
            while size < self.a.metrics_mb * 1e6:
                s = line % (i % 97, i)
                lines.append(s)
                size += len(s)
                i += 1
            self.huge = "".join(lines).encode()
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})  # no length: read until the end
        await resp.prepare(request)
        for k in range(0, len(self.huge), 1 << 20):
            await resp.write(self.huge[k:k + (1 << 20)])
        await resp.write_eof()
        return resp

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.n += 1
        n = self.n
        prompt = self.prompt_of(body)
        if self.log is not None:
            self.log.write(json.dumps({"n": n, "prompt": prompt, "path": request.path, "query": dict(request.query),
                                       "auth": request.headers.get("Authorization", "")}) + "\n")
            self.log.flush()
        auth = request.headers.get("Authorization", "")
        echo = {"error": {"message": f"invalid credentials {auth} for request {prompt!r}",
                          "request": {"headers": {"Authorization": auth}, "prompt": prompt}}}
        mode = self.a.mode
        if self.unready_s and time.monotonic() - self.t_start < self.unready_s:
            return web.json_response({"error": {"message": "model still loading"}}, status=503)
        if mode == "echo401":
            return web.json_response(echo, status=401)
        if mode == "status":
            headers = {"Retry-After": str(self.a.retry_after)} if self.a.retry_after is not None else {}
            return web.json_response({"error": {"message": f"status {self.a.status} on purpose"}},
                                     status=self.a.status, headers=headers)
        if self.slots is not None and 0 <= self.a.max_waiting <= self.waiting:
            return web.json_response({"error": {"message": "queue full"}}, status=429, headers={"Retry-After": "1"})
        self.running += 1
        self.shown = self.running
        try:
            if self.slots is not None:
                self.waiting += 1
                try:
                    await self.slots.acquire()
                finally:
                    self.waiting -= 1
                try:
                    resp = await self._stream(request, body, n, echo)
                finally:
                    self.slots.release()
            else:
                resp = await self._stream(request, body, n, echo)
        except (ConnectionResetError, asyncio.CancelledError):
            self.running -= 1
            if self.a.leak_cancelled:
                self.leaked += 1  # the client left mid-stream
            raise
        self.running -= 1
        self.shown = self.running
        return resp

    async def _stream(self, request: web.Request, body: dict[str, Any], n: int,
                      echo: dict[str, Any]) -> web.StreamResponse:
        mode = self.a.mode
        chat = request.path.endswith("/chat/completions")
        if self.a.first_ms:
            await asyncio.sleep(self.a.first_ms / 1e3)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if mode == "echo_event":
            await resp.write(b"data: " + json.dumps(echo).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        max_tokens = int(body.get("max_tokens") or self.a.tokens)
        for i in range(min(max_tokens, self.a.tokens)):
            delta = {"delta": {"content": "tok"}} if chat else {"text": "tok"}
            last = i == min(max_tokens, self.a.tokens) - 1
            ch = {"index": 0, **delta, "finish_reason": "length" if last else None}
            await resp.write(b"data: " + json.dumps({"choices": [ch]}).encode() + b"\n\n")
            if mode == "stall" and i == 0 and self.a.stall_every and n % self.a.stall_every == 0:
                await asyncio.sleep(3600)  # first token sent, then silence with the connection open
            await asyncio.sleep(self.a.itl_ms / 1e3)
        await resp.write(b"data: [DONE]\n\n")
        return resp


async def amain(a: argparse.Namespace) -> None:
    f = Faults(a)
    app = web.Application()
    app.router.add_get("/v1/models", f.models)
    app.router.add_get("/metrics", f.metrics)
    if a.unready_s:
        async def health(_r: web.Request) -> web.Response:  # healthy before ready, on purpose
            return web.Response(text="ok")

        app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", f.completions)
    app.router.add_post("/v1/chat/completions", f.completions)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", a.port).start()
    if a.die_after:
        await asyncio.sleep(a.die_after)
        os._exit(0)  # gone at once, as a killed server is: no graceful close
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="ok", choices=("ok", "echo401", "echo_event", "status", "stall", "die"))
    ap.add_argument("--status", type=int, default=500)
    ap.add_argument("--retry-after", type=float, default=None)
    ap.add_argument("--stall-every", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--itl-ms", type=float, default=2.0)
    ap.add_argument("--die-after", type=float, default=0.0)
    ap.add_argument("--models-status", type=int, default=200)
    ap.add_argument("--metrics-mb", type=float, default=0.0)
    ap.add_argument("--log", default=None)
    ap.add_argument("--slots", type=int, default=0, help="serve at most N requests at once (0: no limit)")
    ap.add_argument("--max-waiting", type=int, default=-1,
                    help="with --slots: answer 429 (Retry-After: 1) to a request that finds this many waiting")
    ap.add_argument("--leak-cancelled", action="store_true",
                    help="count streams whose client left as running for ever (vllm:num_requests_running)")
    ap.add_argument("--stale-gauge", action="store_true",
                    help="vllm:num_requests_running as of the last normal start or end (not moved by aborts)")
    ap.add_argument("--unready-s", type=float, default=0.0,
                    help="/health answers 200 at once, but completions answer 503 for this long after a restart")
    ap.add_argument("--state", default=None, help="with --unready-s: the file that tells a restart from a first start")
    ap.add_argument("--first-ms", type=float, default=0.0, help="time to the first token of a served request")
    # unknown options are ignored: an experiment run by `attach --launch --verify` may add an engine flag
    asyncio.run(amain(ap.parse_known_args(argv)[0]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def fault_server(*args: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Starts this server with ``args`` on a free port; yields (base URL, process)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(Path(__file__)), "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fault server {args} did not start") from None
                time.sleep(0.05)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
