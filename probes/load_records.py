"""A load run's state, and what it writes and counts (probes/load.py has the whole design): the buffered
``requests`` and ``chunks`` records serialised in slices and written by one I/O thread, the health samples,
one record per finished request, the failure accounting that backs off or stops the load, and the probe's
closing status."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypedDict

from diagnose.capture.lengths import LengthDraws
from diagnose.capture.redact import Redactor, excerpt, scrub_text
from diagnose.capture.workload import ReplayRequest, WorkloadSpec
from diagnose.io.writer import StreamWriter, serialize_records
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext
from diagnose.probes.http_client import CLIENT_LIMIT, HttpClient
from diagnose.probes.load_dataset import DatasetLengths
from diagnose.probes.load_monitor import Monitor, RunningStats, StallSummary
from diagnose.probes.load_pacing import SETUP_MS_START
from diagnose.probes.output_hash import output_hashes, prompt_hash
from diagnose.probes.prompts import PromptFactory
from diagnose.probes.sessions import Turn
from diagnose.probes.sse import StreamResult, now_ns

# a replayed request: (its index in the workload file, the loop it belongs to, the recorded request)
ReplayItem = tuple[int, int, ReplayRequest]
# the options every request of the run carries, as negotiated with the server (_RunRequests._negotiate):
# stream_options (a dict of flags), ignore_eos, return_token_ids
RequestOptions = dict[str, bool | dict[str, bool]]


class ChunkRecord(TypedDict):
    """One record of the ``chunks`` stream: a request's content-chunk arrival times and tokens per chunk."""

    rid: str
    t_ns: list[int]
    tok: list[int]


class PreflightRecord(TypedDict):
    """A preflight request (one per option set tried), kept in the status so every request sent is counted."""

    rid: str
    http_status: int | None
    ok: bool
    error: str | None
    output_tokens: int
    request_options: RequestOptions


class DatasetNote(TypedDict):
    source: str
    note: str
    seconds: float


class LoadNotes(TypedDict, total=False):
    """What the run noted for its probe status (beside the request counts): merged into the status's detail."""

    prompt_calibration: str
    prompt_tokens_planned: int
    shared_prefix_tokens: int
    dataset_lengths: DatasetNote
    preflight: str
    preflight_requests: list[PreflightRecord]
    client_stalls: StallSummary
    replay_unsent: int
    retry_after_holds: int
    retry_after_s_last: float | None

CONNECT_ERRORS = ("refused", "connect")
ABORT_AFTER_CONNECT_FAILURES = 50  # in a row, with no success between: the server is gone
# the same answer (HTTP 401, 429, 500, a malformed stream, a timeout...) to this many requests in a row, with no
# success between: every further request would get it too, so the load stops (issue 12, defect 11: an
# all-401 server otherwise took 20 thousand requests in 4 s)
ABORT_AFTER_SAME_FAILURES = 50
MAX_RETRY_AFTER_S = 10.0  # a Retry-After (429/503) pauses new requests this long at most
FLUSH_SLICE = 4  # chunk records serialised per event-loop turn by the periodic flush (~0.1-0.3 ms at 256 tokens)
FLUSH_BACKLOG = 64  # records waiting: above this a turn serialises slices until FLUSH_BUDGET_MS is spent
FLUSH_BUDGET_MS = 0.5


def request_record(rid: str, phase: int, api: str, res: StreamResult, *, warmup: bool, intended_ns: int | None,
                   capped: bool, max_tokens: int, prompt_tokens: int | None, prompt_tokens_source: str | None,
                   trace_id: str | None, span_id: str | None, error: str | None,
                   error_detail: str | None) -> dict[str, Any]:
    """One record of the ``requests`` stream (docs/metrics.md) from a finished request: the load probe's, and
    the readiness checks' (diagnose/readiness/record.py), which pass their own outcome (a request the check
    closed is ``incomplete``)."""
    usage = res.usage or {}
    details = usage.get("prompt_tokens_details")
    end = res.end_ns or now_ns()
    rec: dict[str, Any] = {
        "rid": rid, "phase": phase, "warmup": warmup, "api": api, "intended_ns": intended_ns,
        # a request closed before it went out (cancelled while connecting): sent when it ended
        "capped": capped, "sent_ns": res.sent_ns or end, "headers_ns": res.headers_ns,
        "first_token_ns": res.t_ns[0] if res.t_ns else None, "end_ns": end,
        "ok": error is None, "http_status": res.status, "error": error,
        "error_detail": error_detail, "prompt_tokens": prompt_tokens, "prompt_tokens_source": prompt_tokens_source,
        "prompt_tokens_usage": usage.get("prompt_tokens"), "max_tokens": max_tokens,
        "output_tokens_usage": usage.get("completion_tokens"), "output_tokens_chunks": sum(res.tok),
        "n_chunks": len(res.t_ns), "finish_reason": res.finish_reason, "trace_id": trace_id,
        "span_id": span_id,
        "cached_tokens": details.get("cached_tokens") if isinstance(details, dict) else None,
        "body_bytes": res.body_bytes,
    }
    if res.retry_after_s is not None:  # the server's Retry-After (429/503): how long it asked the client to wait
        rec["retry_after_s"] = res.retry_after_s
    return rec


def chunk_record(rid: str, res: StreamResult) -> ChunkRecord:
    """The ``chunks`` record of a request that received content: its chunks' arrival times and tokens."""
    return {"rid": rid, "t_ns": res.t_ns, "tok": res.tok}


class _RunRecords:
    """A load run's state (all of it, set here), its buffered records and its accounting."""

    def __init__(self, spec: WorkloadSpec, ctx: CaptureContext, progress: bool | None) -> None:
        self.spec = spec
        self.ctx = ctx
        self.client = HttpClient(ctx.target.url, headers=ctx.target.headers(),
                                 request_timeout_s=spec.request_timeout_s)
        # the output's text is collected (never stored without --store-text) when its hash is kept (--greedy)
        self.hash_outputs = bool(spec.extra.get("output_hash"))
        self.client.store_text = spec.store_text or self.hash_outputs
        self.path = "/v1/chat/completions" if spec.api == "chat" else "/v1/completions"
        self.prompts = PromptFactory(spec.input_tokens, shared_prefix_fraction=spec.shared_prefix_fraction,
                                     seed=spec.seed, api=spec.api)
        # drawn lengths (--input-tokens/--output-tokens distributions): the measured phases' requests take draw
        # n_in / n_out of their stream in the order they are set up; the baseline phase keeps the nominal length
        self.in_draws = LengthDraws(spec.input_dist, spec.seed, "input") if spec.input_dist else None
        self.out_draws = LengthDraws(spec.output_dist, spec.seed, "output") if spec.output_dist else None
        self.n_in = 0
        self.n_out = 0
        self.baseline_phases = {p.index for p in spec.phases if p.role == "baseline"}
        # a dataset (--dataset): each turn's lengths, measured before the first phase; conversations sent so far
        self.dataset = DatasetLengths(spec.dataset, spec.api == "chat") if spec.dataset is not None else None
        self.n_conv = 0
        self.token = os.urandom(4).hex()
        self.seq = 0
        self.stats = RunningStats()
        self.stopping = False
        self.abort_reason = ""
        self.consecutive_connect_failures = 0
        self.same_failures = 0  # failures in a row with one answer (fail_kind), no success between
        self.fail_kind = ""
        self.answers: Counter[str] = Counter()  # failures by what the server answered ("HTTP 401", "timeout")
        self.last_failure = ""
        self.hold_until_ns = 0  # no new request before this (the server's Retry-After)
        self.redactor = Redactor(ctx.target.secrets())
        self.counts: Counter[str] = Counter()
        self.options: RequestOptions = {}
        self.model: str | None = None
        self._req_buf: list[dict[str, Any]] = []
        self._chunk_buf: list[ChunkRecord] = []
        self.w_requests = ctx.bundle.stream("requests", "one record per finished request (load probe)")
        self.w_chunks = ctx.bundle.stream("chunks", "content-chunk arrival times and tokens per request")
        self.w_phases = ctx.bundle.stream("phases", "one record per workload phase (sweep level)")
        self.w_health = ctx.bundle.stream("client_health", "load client self-check samples every 0.1 s")
        self.monitor = Monitor(self.stats, self.client.in_flight, self._write_health, self._tick, progress)
        self._flush_scheduled = False
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diagnose-load-io")
        self._io_last: Future[None] | None = None
        self._gc_deferred = False  # automatic oldest-generation collections are off (the capture runs)
        self._turn_sends = 0  # requests sent in this loop turn (_send_gate)
        self._turn_armed = False
        self._gate_waiters: deque[asyncio.Future[None]] = deque()
        self.setup_ms = SETUP_MS_START  # moving average of a request's set-up time on the loop (_send_gate)
        self.notes: LoadNotes = {}
        self.cut_reason = ""  # why in-flight requests are being cancelled, when not an outside stop
        # a replayed session's turns in the file: its requests' planned "turns", so a conversation replayed
        # is measured as a task (diagnose/normalize/tasks.py) as a synthetic one is
        self.session_turns: Counter[str] = Counter()
        self.turn_of: dict[int, int] = {}  # file index -> its turn in its session (file order), where not given
        for i, r in enumerate(spec.replay.requests if spec.replay else ()):
            if r.session is not None:
                self.turn_of[i] = r.turn if r.turn is not None else self.session_turns[r.session]
                self.session_turns[r.session] += 1

    def next_input(self) -> int | None:
        """The next drawn input length (None: fixed lengths)."""
        if self.in_draws is None:
            return None
        self.n_in += 1
        return self.in_draws(self.n_in - 1)

    def next_output(self) -> int | None:
        """The next drawn output length (None: fixed lengths)."""
        if self.out_draws is None:
            return None
        self.n_out += 1
        return self.out_draws(self.n_out - 1)

    # -- bookkeeping ---------------------------------------------------------------------------------
    def flush(self) -> None:
        """Writes every buffered record now and waits until it is on disk, blocking the loop (the last resort:
        a cancelled drain; :meth:`drain` is the normal way)."""
        for buf, w in ((self._req_buf, self.w_requests), (self._chunk_buf, self.w_chunks)):
            if buf:
                self._write(w, buf[:])
                buf.clear()
        if self._io_last is not None:
            self._io_last.result()  # a write error (disk full) surfaces here
            self._io_last = None

    async def drain(self, wait_io: bool = False) -> None:
        """Serialises every buffered record in budgeted slices, one per loop turn (end of a phase), and with
        ``wait_io`` waits (without blocking the loop) until the I/O thread has written them (end of the run).
        Cancelled meanwhile, it falls back to :meth:`flush` so no record is lost."""
        try:
            while self._req_buf or self._chunk_buf:
                self._slices(force_budget=True)
                await asyncio.sleep(0)
            if wait_io and self._io_last is not None:
                fut, self._io_last = self._io_last, None
                await asyncio.wrap_future(fut)  # a write error (disk full) surfaces here
        except asyncio.CancelledError:
            self.flush()
            raise

    def _tick(self) -> None:
        """Every health tick (0.1 s): the periodic flush, and during a phase what survived the tick is frozen,
        so the collector's young generations only ever scan what the last tick allocated. Unfrozen, they
        scanned every in-flight request's objects again and again: 0.2-4 ms pauses, ~150 a minute at
        c=256 (benchmarks/results/client_stall.md); frozen, ~30 a minute of at most 0.7 ms. Requests mostly
        die by reference count, frozen or not; a cycle that becomes garbage after its tick waits for the
        phase's end, where everything is unfrozen and collected (_phase_end)."""
        if self._gc_deferred:
            gc.freeze()
        self.flush_soon()

    def flush_soon(self) -> None:
        """The periodic flush: serialised in slices of ``FLUSH_SLICE`` records per event-loop turn, written
        by an I/O thread.

        Requests that finish together (a closed-loop wave) leave hundreds of chunk records whose
        serialisation takes 5-10 ms at concurrency 256; done in one go, that stall delays every chunk
        arriving meanwhile and was the TTFT error P99 (benchmarks/results/client_bench.md). Between slices
        the loop polls the sockets, so no stamp waits for more than one slice; the file write itself (which
        can block for ms when the kernel throttles writers) runs on the I/O thread and releases the GIL.
        When records come faster than a slice per turn (thousands of requests per second, e.g. a server
        that fails every request at once) a turn takes slices until ``FLUSH_BUDGET_MS`` is spent, so the
        backlog stays bounded instead of piling up for one long flush at the end of the phase."""
        if not self._flush_scheduled and (self._req_buf or self._chunk_buf):
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_slice)

    def _flush_slice(self) -> None:
        self._flush_scheduled = False
        self._slices(force_budget=False)
        self.flush_soon()

    def _slices(self, force_budget: bool) -> None:
        """One turn's share of the buffered records: one slice, or slices until the budget is spent when a
        backlog built up (or ``force_budget``: the end-of-phase drain)."""
        t0 = time.perf_counter_ns()
        budget = force_budget or len(self._chunk_buf) + len(self._req_buf) > FLUSH_BACKLOG
        deadline = t0 + int(FLUSH_BUDGET_MS * 1e6)
        n = 0
        while True:
            for buf, w, k in ((self._chunk_buf, self.w_chunks, FLUSH_SLICE),
                              (self._req_buf, self.w_requests, FLUSH_SLICE * 4)):
                if buf:
                    part = buf[:k]
                    del buf[:k]
                    self._write(w, part)
                    n += len(part)
            if not budget or not (self._chunk_buf or self._req_buf) or time.perf_counter_ns() >= deadline:
                break
        if n:
            self.monitor.note("flush", (time.perf_counter_ns() - t0) / 1e6, n)

    def _write(self, w: StreamWriter, records: Sequence[Mapping[str, object]]) -> None:
        """Serialises here (orjson holds the GIL: on another thread it would stall this loop anyway) and
        queues the bytes for the single I/O thread, which keeps them in order."""
        self._io_last = self._io.submit(w.write_serialized, serialize_records(records), len(records))

    def _write_health(self, record: Mapping[str, object]) -> None:
        """A health sample: queued for the I/O thread like every other write, so a disk that blocks a write()
        never stalls the loop the sample measures."""
        self._write(self.w_health, [record])

    def _status(self, interrupted: bool) -> ProbeStatus:
        ok, failed = self.counts["ok"], sum(v for k, v in self.counts.items() if k not in ("ok", "incomplete"))
        errors = {k: v for k, v in sorted(self.counts.items()) if k != "ok"}
        detail: dict[str, Any] = {"requests_ok": ok, "requests_failed": failed,
                                  "requests_incomplete": self.counts["incomplete"], "errors_by_category": errors,
                                  "model": self.model, "api": self.spec.api, "request_options": self.options,
                                  **self.notes}
        if interrupted:
            detail["interrupted"] = True
        if self.abort_reason:
            return ProbeStatus("load", "failed", self.abort_reason, detail)
        if ok == 0:
            what = ", ".join(f"{v} {k}" for k, v in errors.items()) or "no requests were sent"
            if self.answers:  # what the server answered, as the last stderr line and the report say it
                what += ": " + ", ".join(f"{v} {'answered ' if k.startswith('HTTP') else ''}{k}"
                                         for k, v in self.answers.most_common())
                what += f"; last: {self.last_failure}" if self.last_failure else ""
                if self.notes.get("retry_after_holds"):
                    what += f"; Retry-After honoured {self.notes['retry_after_holds']} time(s)"
            return ProbeStatus("load", "failed", f"no request succeeded ({what})", detail)
        reason = f"{ok} ok, {failed} failed" + (" (stopped early)" if interrupted else "")
        return ProbeStatus("load", "ok", reason, detail)

    # -- per-request records and failures -----------------------------------------------------------
    def _clean_detail(self, detail: str, prompt: str, min_words: int = 3) -> str:
        """A server's error text as it may be stored: secrets redacted, the request's own prompt removed
        (unless --store-text), one bounded line (issue 12, defect 1)."""
        d = self.redactor.text(detail)
        if not self.spec.store_text:
            d = scrub_text(d, (prompt,), min_words)
        return excerpt(d)

    def _record(self, rid: str, phase: int, warmup: bool, intended_ns: int | None, capped: bool, text: str,
                ptok: int, psource: str, trace_id: str, span_id: str, res: StreamResult, max_tokens: int,
                item: ReplayItem | None = None, turn: Turn | None = None) -> None:
        if res.error_detail:
            res.error_detail = self._clean_detail(res.error_detail, text)
        rec = request_record(rid, phase, self.spec.api, res, warmup=warmup, intended_ns=intended_ns, capped=capped,
                             max_tokens=max_tokens, prompt_tokens=ptok, prompt_tokens_source=psource,
                             trace_id=trace_id, span_id=span_id, error=res.error, error_detail=res.error_detail)
        if item is not None:  # what `diagnose workload` needs to write the request back (no text)
            index, loop, req = item
            rec["replay_index"] = index
            rec["replay_loop"] = loop
            rec.update(req.structure())
            if req.session is not None:
                # a session replayed per loop: one task a loop, its turns those of the file
                rec["session"] = f"{req.session}" if loop == 0 else f"{req.session}#{loop}"
                rec["turn"] = self.turn_of[index]
                rec["turns"] = self.session_turns[req.session]
        if turn is not None:  # its task, turn, planned turns and attempt (probes/sessions.py)
            rec.update(turn.structure())
        if self.hash_outputs:  # the quality guard (attach --greedy): hashes, not text
            rec["prompt_hash"] = prompt_hash(text, max_tokens)
            if res.error is None:
                rec.update(output_hashes(res.text or [], res.tok, res.token_ids))
        if self.spec.store_text:
            rec["prompt_text"] = text
            rec["output_text"] = "".join(res.text or [])
        self._req_buf.append(rec)
        if res.t_ns:
            self._chunk_buf.append(chunk_record(rid, res))
        cat = res.error or "ok"
        self.counts[cat] += 1
        st = self.stats
        st.done += 1
        if res.error is None:
            self.consecutive_connect_failures = 0
            self.same_failures = 0
            if res.t_ns:
                st.ttft_ms.append((res.t_ns[0] - res.sent_ns) / 1e6)
                if len(res.t_ns) > 1:
                    st.itl_ms.append((res.t_ns[-1] - res.t_ns[0]) / 1e6 / (len(res.t_ns) - 1))
        elif cat != "incomplete":
            st.errors += 1
            self._note_failure(res)
            if cat in CONNECT_ERRORS:
                self.consecutive_connect_failures += 1
                if self.consecutive_connect_failures >= ABORT_AFTER_CONNECT_FAILURES and not self.abort_reason:
                    self.abort_reason = (f"server stopped accepting connections ({res.error_detail}); "
                                         f"stopped after {ABORT_AFTER_CONNECT_FAILURES} failures in a row")
                    self.stopping = True

    def _note_failure(self, res: StreamResult) -> None:
        """Back-off: a Retry-After pauses new requests; the same answer to ABORT_AFTER_SAME_FAILURES requests
        in a row stops the load, saying what the server answered; the client's own file limit stops it at once."""
        detail = res.error_detail or ""
        if detail.startswith(CLIENT_LIMIT) and not self.abort_reason:
            self.abort_reason = f"{detail}; stopped sending"
            self.stopping = True
            return
        if res.retry_after_s is not None and res.retry_after_s > 0:
            hold = now_ns() + int(min(res.retry_after_s, MAX_RETRY_AFTER_S) * 1e9)
            self.hold_until_ns = max(self.hold_until_ns, hold)
            self.notes["retry_after_holds"] = int(self.notes.get("retry_after_holds", 0)) + 1
            self.notes["retry_after_s_last"] = res.retry_after_s
        kind = f"HTTP {res.status}" if res.status and res.status != 200 else str(res.error)
        self.answers[kind] += 1
        self.last_failure = detail
        if res.error in CONNECT_ERRORS:
            return  # counted by consecutive_connect_failures
        if kind == self.fail_kind:
            self.same_failures += 1
        else:
            self.fail_kind, self.same_failures = kind, 1
        if self.same_failures >= ABORT_AFTER_SAME_FAILURES and not self.abort_reason:
            what = f"answered {kind}" if kind.startswith("HTTP") else f"failed with {kind}"
            self.abort_reason = (f"the server {what} to {self.same_failures} requests in a row, none succeeding"
                                 f" (last: {detail or kind}); stopped sending")
            self.stopping = True
