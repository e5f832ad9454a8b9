"""The load probe: streams requests at a workload and records what the client saw of each one.

Closed loop (``concurrency``): C workers, each sending its next request when the previous one ends.
Open loop (``rate``): arrivals at R/s with Poisson, gamma (``burstiness`` = shape; < 1 is burstier) or constant
gaps, optionally capped at ``max_concurrency`` in flight. Each level of a sweep is one phase. The first
``warmup_requests`` of each phase are marked ``warmup`` (kept on disk, left out of statistics).

Streams written (docs/ARCHITECTURE.md, fields in docs/metrics.md): ``requests`` and ``chunks`` (one record
each per finished request, flushed every 0.1 s and on cancellation; in-flight requests are recorded as
``error="incomplete"``), ``phases``, ``client_health``. Server options are negotiated once before the run:
``stream_options.include_usage`` (+ ``continuous_usage_stats``, exact tokens per chunk) and ``ignore_eos`` are
dropped one by one when the server answers 400.

Loop stalls (issue 18; benchmarks/results/client_stall.md): nothing on the event loop waits for the disk
during a capture. Every stream write (health samples and phase records too) is queued for one I/O thread
(a write() can block for hundreds of ms when the kernel throttles writers or the journal commits), records
are serialised on the loop a few per turn, more per turn (up to ``FLUSH_BUDGET_MS``) only when a backlog
builds, and a phase's end drains the rest the same way instead of in one go. At most ``SEND_BATCH``
requests are set up per turn, fewer when their measured set-up time would exceed ``SEND_BUDGET_MS`` (a closed
loop's wave or a phase's start otherwise sets up hundreds in one).
The collector's oldest generation never runs automatically during the capture (set-up objects are frozen
first, and what survives each 0.1 s health tick after them); it runs at phase boundaries, when no request is
in flight. The health stream names the cause of any stall it sees
(probes/load_monitor.py).

Layout (issue 32 item 5): one run is ``_LoadRun``, built in layers, each module using only those below it:
probes/load_pacing.py (send budget per loop turn, closed-loop workers, arrival gaps, quotas),
probes/load_records.py (the run's state, buffered records and their I/O thread, per-request records,
failure accounting, the status), probes/load_requests.py (negotiation, the send gate, one streamed request),
probes/load_phases.py (closed loop, tasks, open loop, replay, phase start/stop/end), and here the probe, the
run's main sequence and the ``SPEC`` with attach's load options. The names callers used are re-exported here.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

from diagnose.capture.workload import WorkloadSpec
from diagnose.errors import InputError
from diagnose.model import ProbeStatus
from diagnose.probes.base import CaptureContext, Options, ProbeOption, ProbeSetup, ProbeSpec
from diagnose.probes.load_options import workload_from_options
from diagnose.probes.load_pacing import SEND_BATCH, SEND_BUDGET_MS, SETUP_MS_START, _gap_fn, _run_workers
from diagnose.probes.load_phases import STOP_GRACE_S, _RunPhases
from diagnose.probes.load_records import (
    ABORT_AFTER_CONNECT_FAILURES,
    ABORT_AFTER_SAME_FAILURES,
    CONNECT_ERRORS,
    FLUSH_BACKLOG,
    FLUSH_BUDGET_MS,
    FLUSH_SLICE,
    MAX_RETRY_AFTER_S,
    ReplayItem,
)

# what callers, tests and benchmarks import from here (the module was one file before issue 32 item 5)
__all__ = [
    "ABORT_AFTER_CONNECT_FAILURES", "ABORT_AFTER_SAME_FAILURES", "CONNECT_ERRORS", "FLUSH_BACKLOG",
    "FLUSH_BUDGET_MS", "FLUSH_SLICE", "MAX_RETRY_AFTER_S", "SEND_BATCH", "SEND_BUDGET_MS", "SETUP_MS_START",
    "SPEC", "STOP_GRACE_S", "LoadProbe", "ReplayItem", "_LoadRun", "_gap_fn", "_run_workers",
    "workload_from_options",
]


class LoadProbe:
    name = "load"

    def __init__(self, spec: WorkloadSpec, *, progress: bool | None = None) -> None:
        self.spec = spec
        self.progress = progress

    def available(self, ctx: CaptureContext) -> tuple[bool, str]:
        if not self.spec.phases:
            return False, "workload has no phases"
        return True, ""

    async def run(self, ctx: CaptureContext) -> ProbeStatus:
        return await _LoadRun(self.spec, ctx, self.progress).run()


class _LoadRun(_RunPhases):
    """One load probe run: set up, every phase in order, then the last records written and the status."""

    # -- main -----------------------------------------------------------------------------------
    async def run(self) -> ProbeStatus:
        interrupted = False
        gc_thresholds: tuple[int, int, int] | None = None
        try:
            self.model = await self._resolve_model()
            self.notes["prompt_calibration"] = await self.prompts.calibrate(self.client, self.model,
                                                                              self.ctx.target.engine)
            self.notes["prompt_tokens_planned"] = self.prompts.planned_tokens()
            self.notes["shared_prefix_tokens"] = self.prompts.shared_prefix_tokens()
            if self.dataset is not None:  # every turn measured by the server's tokenizer (or estimated) first
                t0 = time.monotonic()
                note = await self.dataset.measure(self.client, self.ctx.target.engine, self.model)
                self.notes["dataset_lengths"] = {"source": self.dataset.source, "note": note,
                                                 "seconds": round(time.monotonic() - t0, 3)}
            pre = await self._negotiate()
            if pre.error in CONNECT_ERRORS:
                self.counts[pre.error or "?"] += 1
                self.abort_reason = f"cannot reach {self.ctx.target.safe_url}: {pre.error_detail}"
                return self._status(False)
            self.notes["preflight"] = "ok" if pre.ok else f"{pre.error}: {pre.error_detail}"
            gc.collect()
            gc.freeze()  # set-up objects never need scanning again: shorter GC pauses while streaming
            # Full (oldest-generation) collections scan every live object and stall the loop for several
            # ms at high concurrency, which shows up as late first-chunk stamps (TTFT error P99 12.5 ms vs
            # 6 ms with the collector off, benchmarks/results/client_bench_summary.md). Young generations
            # still collect short-lived cycles; the old generation is collected at phase boundaries
            # (_phase_end) and when the run ends.
            gc_thresholds = gc.get_threshold()
            gc.set_threshold(gc_thresholds[0], gc_thresholds[1], 1_000_000)
            self._gc_deferred = True
            self.monitor.start()
            for ph in self.spec.phases:
                if self.stopping:
                    break
                if not await self._run_phase(ph):
                    interrupted = True
                    break
            await self.monitor.stop()
            self.notes["client_stalls"] = self.monitor.summary()
            return self._status(interrupted)
        finally:
            await self.monitor.stop()
            try:
                await self.drain(wait_io=True)
                self.flush()  # nothing left to write by now; raises a write error the drain did not see
            finally:
                self._io.shutdown(wait=True)
            self._gc_deferred = False
            gc.unfreeze()
            if gc_thresholds is not None:
                gc.set_threshold(*gc_thresholds)
            await self.client.close()
            self.ctx.stop.set()


def _enabled(o: Options) -> bool:
    """Load is sent unless ``--observe``, which refuses a load level given with it."""
    if o["observe"] and (o["concurrency"] or o["rate"] or o.get("workload") or o.get("dataset")):
        raise InputError("--observe sends no requests: drop --concurrency/--rate/--workload/--dataset")
    return not o["observe"]


def _build(o: Options, setup: ProbeSetup) -> LoadProbe:
    return LoadProbe(setup.workload if setup.workload is not None else workload_from_options(o),
                     progress=o["progress"])


SPEC = ProbeSpec(
    name="load", title="Load (the requests sent; none with --observe)",
    enabled=_enabled, build=_build,
    options=(
        ProbeOption("--api", choices=("completions", "chat"), default="completions", show_default=True),
        ProbeOption("--concurrency", short="-c",
                    help="Closed loop: requests kept in flight; a list or ladder sweeps (1,4,16 or 1:64:x2)."),
        ProbeOption("--rate", short="-r", help="Open loop: requests per second; a list or ladder sweeps (2,4,8)."),
        ProbeOption("--arrival", choices=("poisson", "gamma", "constant"), default="poisson", show_default=True),
        ProbeOption("--burstiness", type=float, default=1.0, show_default=True,
                    help="Gamma shape (1 = Poisson, <1 burstier)."),
        ProbeOption("--max-concurrency", type=int, help="Open loop or replay: cap on requests in flight."),
        ProbeOption("--workload", type=Path, metavar="FILE",
                    help="Replay this workload file (diagnose JSONL, Mooncake JSONL or Azure trace CSV; "
                         "docs/workload.md): each request at its recorded offset with its recorded lengths."),
        ProbeOption("--dataset", type=Path, metavar="FILE",
                    help="Send this file's prompts (with -c or -r): ShareGPT-style conversations (JSON or JSONL; "
                         "each conversation a session, a turn sent after the previous answer) or prompts JSONL "
                         "({\"prompt\": ...}); lengths measured by the server's /tokenize (docs/workload.md)."),
        ProbeOption("--dataset-format", choices=("sharegpt", "prompts"),
                    help="With --dataset: how to read it (default: from its first record)."),
        ProbeOption("--speed", type=float, default=1.0, show_default=True,
                    help="With --workload: time scale (2 = twice as fast)."),
        ProbeOption("--loop", type=int, default=1, show_default=True,
                    help="With --workload: replay the file this many times."),
        ProbeOption("--session-wait/--no-session-wait", flag=True, default=True, show_default=True,
                    help="With --workload: a session's turn waits for the previous turn's answer (a "
                         "conversation), then its recorded offset; --no-session-wait sends every request at "
                         "its offset."),
        ProbeOption("--num-requests", short="-n", type=int, help="Per load level, instead of a duration."),
        ProbeOption("--repeat", type=int, default=1, show_default=True,
                    help="Run each load level this many times, interleaved (c=1 r1, c=8 r1, c=1 r2, ...): "
                         "compare resamples the repeats and reports their spread."),
        ProbeOption("--warmup", type=int, default=2, show_default=True,
                    help="Warm-up requests per level, excluded from statistics."),
        ProbeOption("--baseline", type=int, default=8, show_default=True,
                    help="Sequential requests at concurrency 1 first, as the run's own reference (0: none)."),
        ProbeOption("--turns", type=int, default=1, show_default=True,
                    help="Requests a task: each closed-loop worker runs tasks of N turns, a turn sent when the "
                         "previous answer arrived (plus --think-time), its prompt the conversation so far "
                         "(multi-turn chat, agent chains; docs/workload.md). Task latency is reported beside "
                         "the requests'."),
        ProbeOption("--think-time", metavar="DURATION",
                    help="With --turns: pause between an answer and the next turn (a user reading, a tool call)."),
        ProbeOption("--retries", type=int, default=0, show_default=True,
                    help="With --turns: send a failed turn again up to N times before the task is abandoned."),
        ProbeOption("--input-tokens", default="128", show_default=True, metavar="N|DIST",
                    help="Prompt length in tokens, or a distribution drawn per request with --seed: "
                         "uniform:min=A,max=B, normal:mean=M,stdev=S[,min=A,max=B], "
                         "lognormal:mean=M,stdev=S[,min=A,max=B], histogram:FILE (docs/workload.md)."),
        ProbeOption("--output-tokens", default="64", show_default=True, metavar="N|DIST",
                    help="Output length in tokens (max_tokens), or a distribution as for --input-tokens."),
        ProbeOption("--ignore-eos/--no-ignore-eos", flag=True, default=True, show_default=True,
                    help="Ask the engine to generate exactly --output-tokens (where it supports it)."),
        ProbeOption("--shared-prefix", type=float, default=0.0, show_default=True,
                    help="Fraction of each prompt shared by all requests (prompts are otherwise unique)."),
        ProbeOption("--seed", type=int, default=0, show_default=True,
                    help="Seeds the prompts' text, the arrival gaps and the drawn lengths."),
        ProbeOption("--greedy", flag=True,
                    help="Greedy sampling (temperature 0, the sampling seed --seed), recorded in the manifest; each "
                         "output's hash is kept (never its text), so compare and verify report how many outputs "
                         "of two runs agree (the quality guard, docs/compare.md)."),
        ProbeOption("--temperature", type=float, metavar="T",
                    help="Sampling temperature sent with every request (with --sampling-seed; output hashes kept "
                         "as with --greedy)."),
        ProbeOption("--sampling-seed", type=int, metavar="N",
                    help="The engine's sampling seed sent with every request (default with --greedy or "
                         "--temperature: --seed)."),
        ProbeOption("--logprobs", type=int, metavar="N",
                    help="Ask every request for its output tokens' log-probabilities with the N most likely "
                         "alternatives of each (completions logprobs: N; chat logprobs: true, top_logprobs: N; "
                         "llama.cpp reads both as n_probs), recorded in the manifest. The engine computes and "
                         "the server serialises them for every token (rule SCH014)."),
        ProbeOption("--timeout", default="60s", show_default=True, help="Per-request timeout."),
        ProbeOption("--progress/--no-progress", flag=True, help="Live progress line (default: only on a terminal)."),
    ),
)
