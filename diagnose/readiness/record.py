"""The readiness run's output folder as a capture bundle (docs/bundle-format.md), written as the checks go.

Every request a check sends (they all go through :meth:`diagnose.readiness.target.Target.stream`) becomes one
record of the ``requests`` stream, in the load probe's schema (probes/load_records.py: send, headers, first
token and end times, tokens, status, error), and its content chunks one record of ``chunks``; each check, each
part of the overload check and each step of its ramp is a phase of the ``phases`` stream, with a name that says
which (``cancellation``, ``overload ramp 1.5x``...) and the check it belongs to (``check``). Records are
appended and written through as each request ends, so a run killed part way keeps every request that finished.
No prompt or output text is stored: error details are scrubbed of the request's prompt, as the load probe's.

A recorder without a bundle (``Recorder(None)``: a check run on its own, in a test) records nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from diagnose.capture.redact import excerpt, scrub_text
from diagnose.io.writer import BundleWriter, StreamWriter
from diagnose.model import ProbeStatus
from diagnose.probes.load_monitor import Monitor, RunningStats
from diagnose.probes.load_records import chunk_record, request_record
from diagnose.probes.sse import StreamResult, now_ns

STREAMS = ("requests", "chunks", "phases", "client_health")
CUT = "closed by the readiness check while in flight"  # the error detail of a request the check closed


class Recorder:
    """Writes the bundle's streams; the manifest's load probe is ``running`` from the start (what a run killed
    part way leaves) and :meth:`status` is its final status (``bundle`` None: nothing is written)."""

    def __init__(self, bundle: BundleWriter | None) -> None:
        self.bundle = bundle
        self.current: int | None = None  # the phase a request sent now belongs to (None: none)
        self.cut_reason = CUT  # why requests cancelled now were closed (the check sets it before it closes them)
        self.counts: Counter[str] = Counter()  # requests by outcome: ok, or the error category
        self._phases: dict[int, dict[str, Any]] = {}
        self._next = 0
        self._seq = 0
        self._token = os.urandom(4).hex()
        self._w: dict[str, StreamWriter] = {}
        self.open = 0  # requests sent and not yet ended (Target.stream)
        self._monitor: Monitor | None = None
        if bundle is not None:
            self._w = {"requests": bundle.stream("requests", "one record per request a readiness check sent"),
                       "chunks": bundle.stream("chunks", "content-chunk arrival times and tokens per request"),
                       "phases": bundle.stream("phases", "one record per readiness check, overload part and "
                                                         "ramp step")}
            bundle.set_probe_status(ProbeStatus("load", "running", "the readiness checks' requests"))

    # -- phases --------------------------------------------------------------------------------------
    def begin(self, name: str, check: str, *, role: str = "measure", concurrency: int | None = None,
              rate: float | None = None, max_concurrency: int | None = None, start_ns: int | None = None,
              **extra: Any) -> int:
        """A new phase, current from now on, starting now (or at ``start_ns``); its index. Its record is written
        when it ends (:meth:`end`)."""
        idx = self._next
        self._next += 1
        self._phases[idx] = {"phase": idx, "name": name, "check": check, "role": role,
                             "mode": "rate" if rate is not None else "concurrency", "concurrency": concurrency,
                             "rate": rate, "max_concurrency": max_concurrency, "repeat": 1,
                             "arrival": "constant" if rate is not None else None, "burstiness": None,
                             "warmup_requests": 0, "start_ns": now_ns() if start_ns is None else start_ns, "end_ns": None, "requests": 0, **extra}
        self.current = idx
        return idx

    def end(self, idx: int | None, *, interrupted: bool = False, end_ns: int | None = None) -> None:
        """Phase ``idx`` is over: its record is written (with ``interrupted`` when the run stopped in it)."""
        rec = self._phases.pop(idx, None) if idx is not None else None
        if rec is None:
            return
        rec["end_ns"] = end_ns if end_ns is not None else now_ns()
        rec["interrupted"] = interrupted
        if self.current == idx:
            self.current = None
        if "phases" in self._w:
            self._w["phases"].write(rec)

    @contextlib.contextmanager
    def phase(self, name: str, check: str, **kw: Any) -> Iterator[int]:
        """:meth:`begin` and :meth:`end` around a block (interrupted when it raised)."""
        idx = self.begin(name, check, **kw)
        ok = False
        try:
            yield idx
            ok = True
        finally:
            self.end(idx, interrupted=not ok)

    # -- requests ------------------------------------------------------------------------------------
    def sent(self, phase: int | None) -> None:
        """A request of ``phase`` is being sent (its record's ``requests``: sent in the phase, whenever they end)."""
        ph = self._phases.get(phase) if phase is not None else None
        if ph is not None:
            ph["requests"] += 1

    def request(self, phase: int | None, prompt: str, max_tokens: int, res: StreamResult, *, cut: bool,
                intended_ns: int | None = None, tags: Mapping[str, Any] | None = None) -> None:
        """One request's record (``cut``: the check closed it before it ended: ``incomplete``, as the load probe
        records a request a stopped capture closed). ``res`` is left as the check reads it."""
        if self.bundle is None:
            return
        error = "incomplete" if cut else res.error
        detail = self.cut_reason if cut else res.error_detail
        if detail:
            detail = excerpt(scrub_text(self.bundle.redactor.text(detail), (prompt,), 3))
        pu = (res.usage or {}).get("prompt_tokens")
        self._seq += 1
        rid = f"{self._token}-{self._seq}"
        rec = request_record(rid, phase if phase is not None else -1, "completions", res, warmup=False,
                             intended_ns=intended_ns, capped=False, max_tokens=max_tokens,
                             prompt_tokens=pu if isinstance(pu, int) else None,
                             prompt_tokens_source="usage" if isinstance(pu, int) else None, trace_id=None,
                             span_id=None, error=error, error_detail=detail)
        rec.update(tags or {})
        self._w["requests"].write(rec)
        if res.t_ns:
            self._w["chunks"].write(chunk_record(rid, res))
        self.counts[error or "ok"] += 1

    # -- the manifest --------------------------------------------------------------------------------
    def status(self, model: str | None, options: Mapping[str, Any]) -> ProbeStatus:
        """The load probe's status: what the requests of every check came to (the manifest's probes.load)."""
        ok = self.counts["ok"]
        failed = sum(v for k, v in self.counts.items() if k not in ("ok", "incomplete"))
        detail = {"requests_ok": ok, "requests_failed": failed, "requests_incomplete": self.counts["incomplete"],
                  "errors_by_category": {k: v for k, v in sorted(self.counts.items()) if k != "ok"},
                  "model": model, "api": "completions", "request_options": dict(options),
                  "sent_by": "diagnose readiness"}
        return ProbeStatus("load", "ok", f"{ok} ok, {failed} failed (the readiness checks' requests)", detail)

    # -- the client's self-check ---------------------------------------------------------------------
    def start_monitor(self) -> None:
        """The load client's self-check (probes/load_monitor.py: event-loop lag, CPU, requests open every 0.1 s)
        into ``client_health``, as attach records it: the analysis then judges late sends on the client's own
        evidence (VAL001), not on the lateness alone. Call on the checks' event loop."""
        if self.bundle is None or self._monitor is not None:
            return
        w = self.bundle.stream("client_health", "load client self-check samples every 0.1 s")
        self._w["client_health"] = w
        self._monitor = Monitor(RunningStats(), lambda: self.open, w.write, lambda: None, progress=False)
        self._monitor.start()

    async def stop_monitor(self) -> None:
        if self._monitor is not None:
            await self._monitor.stop()
            self._monitor = None

    def close_phases(self) -> None:
        """Every phase still open ends, interrupted (the run stopped in it)."""
        for idx in list(self._phases):
            self.end(idx, interrupted=True)


def open_bundle(out: Path, *, url: str, engine: str, model: str | None, source: str | None,
                workload: Mapping[str, Any], options: Mapping[str, Any], force: bool) -> BundleWriter:
    """The bundle in the readiness folder ``out`` (which may already hold the launched server's log). With
    ``force`` the streams an earlier run left there are removed first (appended to, they would mix two runs)."""
    if force:
        for name in STREAMS:
            for suffix in (".jsonl", ".jsonl.gz"):
                with contextlib.suppress(FileNotFoundError):
                    (out / f"{name}{suffix}").unlink()
    target = {"url": url, "engine": engine, "engine_version": None, "model": model,
              "models": [model] if model else [], "engine_evidence": [f"in-flight state read from {source}"]
              if source else [], "in_flight_source": source}
    return BundleWriter(out, target=target, workload=dict(workload), options=dict(options), keep=True)
