"""What load to send: the workload spec shared by the CLI, the load probe and the manifest."""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from diagnose.capture.datasets import Dataset
from diagnose.capture.lengths import LengthDist
from diagnose.errors import InputError

Mode = Literal["concurrency", "rate", "observe", "replay"]
Arrival = Literal["poisson", "gamma", "constant"]


@dataclass(frozen=True)
class Phase:
    """One level of a sweep (or the only level of a plain run)."""

    index: int
    name: str
    concurrency: int | None = None  # closed loop: requests kept in flight
    rate: float | None = None  # open loop: requests per second
    max_concurrency: int | None = None  # open loop cap on in-flight requests (None = unbounded)
    # Per-phase overrides (None: use the WorkloadSpec's duration_s / num_requests). The load probe honours them.
    num_requests: int | None = None
    duration_s: float | None = None
    # "baseline": a short low-load reference (e.g. sequential requests at concurrency 1) that rules compare
    # the measured phases against; "measure": a normal phase. Baseline phases come first.
    role: str = "measure"
    # which run of its level this is (``--repeat N``: 1..N, the levels interleaved: c=1 r1, c=8 r1, c=1 r2, ...)
    repeat: int = 1


@dataclass(frozen=True)
class ReplayRequest:
    """One request of a replayed workload file (docs/workload.md): when to send it and how big it is."""

    offset_s: float  # arrival offset from the start of the trace (before --speed)
    input_tokens: int
    output_tokens: int
    session: str | None = None
    turn: int | None = None
    prefix: tuple[str, ...] = ()  # hashes of the leading blocks (block_tokens each) shared with other requests

    def structure(self) -> dict[str, Any]:
        """Its session, turn and prefix hashes, those it has (a workload file's row and a replayed request's
        record carry the same fields)."""
        d: dict[str, Any] = {}
        if self.session is not None:
            d["session"] = self.session
        if self.turn is not None:
            d["turn"] = self.turn
        if self.prefix:
            d["prefix"] = list(self.prefix)
        return d


@dataclass(frozen=True)
class Replay:
    """A workload file to replay (``attach --workload``) and how: time scaled by ``speed``, ``loop`` times."""

    file: str  # as given (the manifest records it)
    format: str  # diagnose | mooncake | azure
    block_tokens: int
    requests: Sequence[ReplayRequest]  # sorted by offset (a tuple, or diagnose.io.workload_store's compact store)
    speed: float = 1.0
    loop: int = 1
    skipped: int = 0  # records of the file that could not be read
    note: str = ""  # the warning about skipped records (file:line of the first), "" when none

    def period_s(self) -> float:
        """One pass of the trace in trace time: the last offset plus one mean gap (so a loop's first request
        does not land on the previous loop's last)."""
        if not self.requests:
            return 0.0
        first, last = self.requests[0].offset_s, self.requests[-1].offset_s
        n = len(self.requests)
        gap = (last - first) / (n - 1) if n > 1 else 1.0
        return max(last + gap, 1e-3)

    def summary(self) -> dict[str, Any]:
        """What the manifest keeps of it (never the per-request rows: the bundle's requests have them)."""
        reqs = self.requests
        return {"file": self.file, "format": self.format, "block_tokens": self.block_tokens,
                "requests": len(reqs), "skipped": self.skipped, "speed": self.speed, "loop": self.loop,
                "span_s": (reqs[-1].offset_s - reqs[0].offset_s) if reqs else 0.0,
                "prefix_share": prefix_share(reqs, self.block_tokens),
                "sessions": len({r.session for r in reqs if r.session is not None})}


def prefix_share(reqs: Sequence[ReplayRequest], block_tokens: int) -> float | None:
    """Share of all input tokens that lie in prefix blocks an earlier request already sent (in arrival order):
    what a prefix cache large enough to keep everything could hit. None without input tokens."""
    seen: set[int] = set()
    hit = 0
    total = 0
    for r in reqs:
        total += r.input_tokens
        key = 0
        shared = 0
        for j, h in enumerate(r.prefix):
            key = hash((key, h))
            if key in seen:
                shared = j + 1
            seen.add(key)
        hit += min(shared * block_tokens, r.input_tokens)
    return hit / total if total else None


@dataclass(frozen=True)
class WorkloadSpec:
    mode: Mode = "concurrency"
    phases: tuple[Phase, ...] = ()
    duration_s: float | None = 30.0  # per phase; None when num_requests bounds it
    num_requests: int | None = None  # per phase
    warmup_requests: int = 0  # per phase, excluded from statistics
    arrival: Arrival = "poisson"
    burstiness: float = 1.0  # gamma shape; 1.0 = Poisson, < 1 burstier
    input_tokens: int = 128
    output_tokens: int = 64
    ignore_eos: bool = True
    api: Literal["completions", "chat"] = "completions"
    shared_prefix_fraction: float = 0.0  # fraction of each prompt that is a prefix shared by all requests
    seed: int = 0
    request_timeout_s: float = 60.0
    model: str | None = None  # None: first model of /v1/models
    store_text: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    replay: Replay | None = None  # mode "replay": the file's requests replace arrivals and lengths
    session_wait: bool = True  # replay: a session's turn waits for the previous turn's answer
    # tasks (probes/sessions.py): requests a task, the pause between an answer and the next turn, retries a turn
    turns: int = 1
    think_time_s: float = 0.0
    retries: int = 0
    # length distributions (diagnose/capture/lengths.py; None: every request input_tokens / output_tokens long).
    # With one, input_tokens / output_tokens are its nominal length (the median of its draws): the baseline
    # phase's requests and the prompt calibration use it
    input_dist: LengthDist | None = None
    output_dist: LengthDist | None = None
    # a dataset (diagnose/capture/datasets.py): its records' prompts instead of synthetic ones
    dataset: Dataset | None = None

    def to_json(self) -> dict[str, Any]:
        own = ("replay", "input_dist", "output_dist", "dataset")
        d = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name not in own}
        d["phases"] = [asdict(p) for p in self.phases]
        if self.dataset is not None:
            d["dataset"] = self.dataset.summary()
        for key, dist in (("input_lengths", self.input_dist), ("output_lengths", self.output_dist)):
            if dist is not None:
                d[key] = dist.to_json()
        if self.replay is not None:
            d["replay"] = self.replay.summary()
        return d


_DUR = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|min|h)?\s*$")


def parse_duration(text: str) -> float:
    """'30s', '2m', '500ms', '1.5h', '45' (seconds) -> seconds."""
    m = _DUR.match(text or "")
    if not m:
        raise InputError(f"bad duration {text!r}: use a number with ms, s, m or h (for example 30s)")
    val = float(m.group(1))
    unit = m.group(2) or "s"
    return val * {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}[unit]


def parse_levels(text: str, kind: str) -> list[float]:
    """'1,4,16' or '1:16:x2' (geometric ladder) or '2:10:+2' (arithmetic) -> list of levels."""
    text = text.strip()
    try:
        if ":" in text:
            start_s, stop_s, step_s = text.split(":")
            start, stop = float(start_s), float(stop_s)
            out: list[float] = []
            v = start
            if step_s.startswith("x"):
                f = float(step_s[1:])
                if f <= 1:
                    raise ValueError
                while v <= stop * (1 + 1e-9):
                    out.append(v)
                    v *= f
            else:
                d = float(step_s.lstrip("+"))
                if d <= 0:
                    raise ValueError
                while v <= stop * (1 + 1e-9):
                    out.append(v)
                    v += d
            levels = out
        else:
            levels = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise InputError(f"bad {kind} list {text!r}: use '1,4,16', '1:64:x2' or '2:10:+2'") from e
    if not levels or any(v <= 0 for v in levels):
        raise InputError(f"bad {kind} list {text!r}: levels must be positive")
    return levels


def repeat_phases(phases: Sequence[Phase], repeat: int) -> tuple[Phase, ...]:
    """Each level run ``repeat`` times, interleaved (every level once, then every level again, ...), so a
    drift of the host over the capture lands on all levels alike and shows as run-to-run spread. Names get
    `` r2``, `` r3``...; indices are renumbered in order. ``repeat`` 1 gives the phases unchanged."""
    if repeat < 1:
        raise InputError(f"--repeat {repeat}: use 1 or more")
    if repeat == 1:
        return tuple(phases)
    out: list[Phase] = []
    for r in range(1, repeat + 1):
        for p in phases:
            out.append(replace(p, index=len(out), name=f"{p.name} r{r}", repeat=r))
    return tuple(out)


def build_phases(concurrency: str | None, rate: str | None, max_concurrency: int | None = None) -> tuple[Mode, tuple[Phase, ...]]:
    if concurrency and rate:
        raise InputError("give --concurrency or --rate, not both")
    if rate:
        levels = parse_levels(rate, "rate")
        return "rate", tuple(
            Phase(index=i, name=f"rate={v:g}/s", rate=v, max_concurrency=max_concurrency) for i, v in enumerate(levels)
        )
    levels = parse_levels(concurrency or "1", "concurrency")
    if any(v != int(v) for v in levels):
        raise InputError(f"bad concurrency list {concurrency!r}: concurrency must be whole numbers")
    return "concurrency", tuple(Phase(index=i, name=f"c={int(v)}", concurrency=int(v)) for i, v in enumerate(levels))


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft_p99=500ms,itl_p99=50ms,e2e_p95=2s' -> {'ttft_p99_ms': 500.0, ...} (all in milliseconds)."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise InputError(f"bad SLO term {part!r}: use metric_pNN=VALUE, for example ttft_p99=500ms")
        key, val = (s.strip() for s in part.split("=", 1))
        m = re.match(r"^(ttft|itl|tpot|e2e)_(p50|p90|p95|p99|max)$", key)
        if not m:
            raise InputError(
                f"bad SLO metric {key!r}: use ttft, itl, tpot or e2e with p50, p90, p95, p99 or max (e.g. ttft_p99)"
            )
        out[f"{key}_ms"] = _slo_ms(key, val)
    return out


_SLO_VAL = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|m|min|h)?\s*$")


def _slo_ms(key: str, val: str) -> float:
    """One SLO term's value in milliseconds. The unit is required: a bare number is milliseconds to some tools
    (``vllm bench serve --goodput ttft:500``) and seconds to others, so guessing would judge a run against an
    objective 1000 times off."""
    m = _SLO_VAL.match(val)
    if not m:
        raise InputError(f"bad SLO value {key}={val}: use a positive time with ms, s, m or h (e.g. {key}=500ms)")
    num = float(m.group(1))
    if m.group(2) is None:
        secs = num / 1000.0
        raise InputError(f"--slo {key}={val} has no unit: write {val}ms or {secs:g}s")
    ms = num * {"ms": 1.0, "s": 1e3, "m": 6e4, "min": 6e4, "h": 3.6e6}[m.group(2)]
    if not 0 < ms < 1e12:
        raise InputError(f"bad SLO value {key}={val}: must be a positive time (e.g. {key}=500ms)")
    return ms
