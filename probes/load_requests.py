"""The requests a load run sends (probes/load.py has the whole design): the server's options negotiated
once, and each streamed request set up through the send gate (a few per loop turn), stamped and handed to
the records; a Retry-After pause."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from typing import Any

import orjson

from diagnose.probes.http_client import RequestFailed
from diagnose.probes.load_pacing import SEND_BATCH, SEND_BUDGET_MS
from diagnose.probes.load_records import ReplayItem, _RunRecords
from diagnose.probes.sessions import Turn
from diagnose.probes.sse import StreamResult, now_ns


class _RunRequests(_RunRecords):
    """The sending side of a load run: request bodies, the send gate, one streamed request, set-up."""

    # -- request ------------------------------------------------------------------------------------
    def _body(self, text: str, max_tokens: int | None = None,
              messages: tuple[dict[str, str], ...] = ()) -> bytes:
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens or self.spec.output_tokens,
                                "stream": True, **self.options}
        sampling = self.spec.extra.get("sampling")
        if sampling:  # --greedy / --temperature / --sampling-seed (the quality guard)
            body["temperature"] = sampling["temperature"]
            body["seed"] = sampling["seed"]
        top = self.spec.extra.get("logprobs")
        if self.spec.api == "chat":
            body["messages"] = list(messages) or [{"role": "user", "content": text}]
            if top is not None:  # --logprobs N (OpenAI chat: a flag and the alternatives a token)
                body["logprobs"] = True
                body["top_logprobs"] = top
        else:
            body["prompt"] = text
            if top is not None:  # --logprobs N (OpenAI completions: the alternatives a token)
                body["logprobs"] = top
        return orjson.dumps(body)

    def _turn_quota(self) -> int:
        """Requests that may be set up in one loop turn: as many as fit ``SEND_BUDGET_MS`` at the measured
        set-up time, at least one, at most ``SEND_BATCH``."""
        return max(1, min(SEND_BATCH, int(SEND_BUDGET_MS / max(1e-3, self.setup_ms))))

    def _send_gate(self) -> asyncio.Future[None] | None:
        """None when this request may be set up and sent in this loop turn, else a future that a later turn
        resolves (FIFO, :meth:`_turn_quota` per turn).

        A closed loop's wave (hundreds of requests ending in one read, each worker sending its next at once)
        or a phase's start (every worker, each with a new connection) set up hundreds of requests in one
        turn: 10-30 ms during which no socket is polled, so every chunk arriving meanwhile is stamped late.
        A few per turn leave the polls in between; a deferred request waits a turn or two (under a
        millisecond), which its schedule lag shows. How many fit a turn follows the measured set-up time:
        16 set-ups opening new connections at a phase's start took 6-14 ms in one turn (c=256, timed per
        callback on the standard event loop)."""
        if self._turn_sends < self._turn_quota() and not self._gate_waiters:
            self._turn_sends += 1
            self._arm_turn()
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._gate_waiters.append(fut)
        self._arm_turn()
        return fut

    def _setup_done(self, passed_ns: int, sent_ns: int) -> None:
        """A request's set-up time (gate passed -> request written; a new connection's connect included, at
        most 5 ms counted) into the moving average the gate sizes its turns by."""
        if sent_ns >= passed_ns:
            self.setup_ms += 0.1 * (min(5.0, (sent_ns - passed_ns) / 1e6) - self.setup_ms)

    def _arm_turn(self) -> None:
        if not self._turn_armed:
            self._turn_armed = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._turn_armed = False
        self._turn_sends = 0
        waiters = self._gate_waiters
        quota = self._turn_quota()
        while waiters and self._turn_sends < quota:
            fut = waiters.popleft()
            if not fut.done():  # a cancelled request no longer waits
                self._turn_sends += 1
                fut.set_result(None)
        if waiters or self._turn_sends:
            self._arm_turn()

    async def _one(self, phase: int, warmup: bool, intended_ns: int | None, capped: bool = False,
                   item: ReplayItem | None = None, turn: Turn | None = None) -> StreamResult:
        gate = self._send_gate()
        if gate is not None:
            await gate
        passed_ns = now_ns()
        seq = self.seq
        self.seq += 1
        rid = f"{self.token}-{seq}"
        max_tokens = self.spec.output_tokens
        if item is not None and self.spec.replay is not None:
            req = item[2]
            prompt = self.prompts.make_replay(seq, req.input_tokens, req.prefix, self.spec.replay.block_tokens)
            max_tokens = req.output_tokens
        elif turn is not None:  # a task's turn: the conversation so far (probes/sessions.py)
            prompt = turn.prompt
            max_tokens = turn.max_tokens or self.next_output() or max_tokens
        elif phase in self.baseline_phases:  # the run's low-load reference: the nominal lengths
            prompt = self.prompts.make(seq)
        else:
            drawn = self.next_input()
            prompt = self.prompts.make(seq) if drawn is None else self.prompts.make_sized(seq, drawn)
            max_tokens = self.next_output() or max_tokens
        # ids come from the OS, not the seeded workload RNG: two captures with the same --seed must not
        # send the same trace ids into a user's collector (--otlp-export)
        trace_id = secrets.token_hex(16)
        span_id = secrets.token_hex(8)
        headers = {"x-request-id": rid, "traceparent": f"00-{trace_id}-{span_id}-01"}
        res = StreamResult()
        try:
            await self.client.stream(self.path, self._body(prompt.text, max_tokens,
                                                           turn.messages if turn is not None else ()), res, headers)
        except asyncio.CancelledError:
            res.error = "incomplete"
            res.error_detail = self.cut_reason or "capture stopped while the request was in flight"
            res.end_ns = now_ns()
            if not res.sent_ns:
                res.sent_ns = res.end_ns
            raise
        finally:
            if res.headers_ns is not None or res.t_ns:  # it was sent (a failed connect measured nothing)
                self._setup_done(passed_ns, res.sent_ns)
            self._record(rid, phase, warmup, intended_ns, capped, prompt.text, prompt.tokens, prompt.source,
                         trace_id, span_id, res, max_tokens, item, turn)
        return res

    async def _hold(self) -> bool:
        """Waits out a Retry-After pause (until ``hold_until_ns`` or the capture stops); True if it waited."""
        delay = (self.hold_until_ns - now_ns()) / 1e9
        if delay <= 0 or self.stopping:
            return False
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.ctx.stop.wait(), delay)
        return True

    # -- set-up ---------------------------------------------------------------------------------
    async def _resolve_model(self) -> str | None:
        model = self.spec.model or self.ctx.target.model
        if model:
            return model
        with contextlib.suppress(RequestFailed, orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            status, body = await self.client.request("GET", "/v1/models")
            if status == 200:
                return str(orjson.loads(body)["data"][0]["id"])
        return None

    async def _negotiate(self) -> StreamResult:
        """One small request per option set until the server accepts one (400 = option rejected)."""
        usage_opts: list[dict[str, bool]] = [{"include_usage": True, "continuous_usage_stats": True},
                                            {"include_usage": True}, {}]
        eos = [True, False] if self.spec.ignore_eos else [False]
        # the quality guard hashes the output's token ids where the server streams them (vLLM); a server that
        # rejects the option (400) is asked again without it, and its outputs are hashed by their text
        ids = [True, False] if self.hash_outputs else [False]
        res = StreamResult()
        for want_ids, ign, so in ((w, i, o) for w in ids for i in eos for o in usage_opts):
            self.options = (({"stream_options": so} if so else {}) | ({"ignore_eos": True} if ign else {})
                            | ({"return_token_ids": True} if want_ids else {}))
            self.client.continuous_usage = bool(so.get("continuous_usage_stats"))
            res = StreamResult()
            await self.client.stream(self.path, self._body(" hello world", 2), res,
                                     {"x-request-id": f"{self.token}-preflight"})
            # the server counts it: the status keeps it, so the bundle accounts for every request sent
            self.notes.setdefault("preflight_requests", []).append({
                "rid": f"{self.token}-preflight", "http_status": res.status, "ok": res.error is None,
                "error": res.error, "output_tokens": sum(res.tok), "request_options": dict(self.options)})
            if res.status != 400:
                if res.error_detail:
                    res.error_detail = self._clean_detail(res.error_detail, " hello world", 2)
                return res
        return res
