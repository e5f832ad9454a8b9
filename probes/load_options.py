"""The load probe's workload from attach's options, every option checked before anything connects.

Each bad value is a one-line error (exit status 2), never a default put in its place: ``--speed 0``,
``--loop 0``, ``--max-concurrency 0`` and ``-d 0s`` used to be replaced by 1, 1, no cap and 30 s; a speed
of 1e-12 planned a replay of millennia; NaN and infinity are refused like any other value out of range.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any

from diagnose.capture.datasets import Dataset
from diagnose.capture.lengths import LengthDist, LengthDraws, parse_lengths
from diagnose.capture.workload import (
    Mode,
    Phase,
    Replay,
    WorkloadSpec,
    build_phases,
    parse_duration,
    repeat_phases,
)
from diagnose.errors import InputError
from diagnose.probes.base import Options

MAX_DURATION_S = 7 * 86400.0  # --duration: a week (the longest replay is as long)
MAX_CONCURRENCY = 100_000
MAX_LOGPROBS = 100_000  # --logprobs: alternatives a token (vLLM caps it at its --max-logprobs, 20 by default)


def check_duration(text: str | None) -> float | None:
    """``--duration`` in seconds (None when not given): positive and at most ``MAX_DURATION_S``."""
    if text is None:
        return None
    d = parse_duration(text)
    if not (math.isfinite(d) and 0 < d <= MAX_DURATION_S):
        raise InputError(f"--duration {text}: must be more than 0 and at most 7 days (for example 30s or 5m)")
    return d


def check_options(o: Options) -> None:
    """The values of the options this module owns, checked before anything is set up (attach calls it
    first, for every way it runs: one server, --launch, --find-max-goodput)."""
    from diagnose.capture.workload import parse_slo
    from diagnose.io.workload_file import MAX_LOOP, MAX_SPEED, MIN_SPEED

    check_duration(o.get("duration"))
    parse_slo(o.get("slo"))
    _length_dists(o)
    speed, loop, cap = o.get("speed"), o.get("loop"), o.get("max_concurrency")
    if speed is not None and not (math.isfinite(speed) and MIN_SPEED <= speed <= MAX_SPEED):
        raise InputError(f"--speed {speed:g}: must be a positive factor from {MIN_SPEED:g} to {MAX_SPEED:g} "
                         "(2 = twice as fast)")
    if loop is not None and not 1 <= loop <= MAX_LOOP:
        raise InputError(f"--loop {loop}: must be 1 to {MAX_LOOP}")
    if cap is not None and not 1 <= cap <= MAX_CONCURRENCY:
        raise InputError(f"--max-concurrency {cap}: must be 1 to {MAX_CONCURRENCY} (leave it out for no cap)")


def workload_from_options(o: Options) -> WorkloadSpec:
    """The workload these options ask for (``--duration``, ``--model``, ``--store-text`` are attach's own)."""
    check_options(o)
    replay = _replay_from_options(o)
    if replay is not None:
        mode: Mode = "replay"
        phases: tuple[Phase, ...] = (Phase(index=0, name=f"replay {Path(replay.file).name}" + (
            f" x{replay.speed:g}" if replay.speed != 1 else ""), max_concurrency=o["max_concurrency"]),)
    else:
        mode, phases = build_phases(o["concurrency"], o["rate"], o["max_concurrency"])
    phases = repeat_phases(phases, int(o.get("repeat") or 1))
    num_requests, baseline = o["num_requests"], o["baseline"]
    if num_requests is not None and num_requests <= 0:
        raise InputError("--num-requests must be positive")
    if not 0.0 <= o["shared_prefix"] < 1.0:
        raise InputError("--shared-prefix must be a fraction in [0, 1)")
    in_dist, out_dist = _length_dists(o)
    if replay is not None and (in_dist or out_dist):
        raise InputError("--workload replays the file's own lengths: drop the --input-tokens/--output-tokens "
                         "distribution")
    if not o["burstiness"] > 0 or not math.isfinite(o["burstiness"]):
        raise InputError("--burstiness must be positive (1 = Poisson, < 1 burstier)")
    dataset = _dataset_from_options(o, replay is not None, in_dist is not None, len(phases))
    dur = check_duration(o["duration"]) if o["duration"] else (None if num_requests or replay else 30.0)
    input_tokens, output_tokens = _nominal(o["input_tokens"], in_dist, o, "input"), \
        _nominal(o["output_tokens"], out_dist, o, "output")
    if replay is not None:  # the baseline phase (if any) sends requests of the trace's median size
        lengths = getattr(replay.requests, "lengths", None)
        ins, outs = lengths() if lengths is not None else (
            [r.input_tokens for r in replay.requests], [r.output_tokens for r in replay.requests])
        input_tokens, output_tokens = int(statistics.median_low(ins)), int(statistics.median_low(outs))
    if dataset is not None:  # the baseline phase sends synthetic prompts of the records' median estimated size
        input_tokens = int(statistics.median_low(dataset.estimate(c.prompt(0)) for c in dataset.conversations))
    if baseline > 0:
        base = Phase(index=0, name="baseline c=1", concurrency=1, num_requests=baseline, role="baseline")
        phases = (base, *(dataclasses.replace(p, index=p.index + 1) for p in phases))
    return WorkloadSpec(
        mode=mode, phases=phases, duration_s=dur, num_requests=num_requests, warmup_requests=o["warmup"],
        arrival=o["arrival"], burstiness=o["burstiness"], input_tokens=input_tokens,
        output_tokens=output_tokens, ignore_eos=o["ignore_eos"], api=o["api"],
        shared_prefix_fraction=0.0 if replay else o["shared_prefix"], seed=o["seed"],
        request_timeout_s=parse_duration(o["timeout"]), model=o["model"], store_text=o["store_text"], replay=replay,
        session_wait=bool(o.get("session_wait", True)), input_dist=in_dist, output_dist=out_dist, dataset=dataset,
        **_tasks_from_options(o, mode), extra=sampling_from_options(o) | logprobs_from_options(o),
    )


def sampling_from_options(o: Options) -> dict[str, Any]:
    """``--greedy``, ``--temperature``, ``--sampling-seed``: the sampling every request asks for and whether
    each output's hash is kept (the quality guard, diagnose/compare/quality.py); {} when none is given (the
    engine's defaults, no hashes)."""
    greedy, temp, sseed = bool(o.get("greedy")), o.get("temperature"), o.get("sampling_seed")
    if not greedy and temp is None and sseed is None:
        return {}
    if not greedy and temp is None:
        raise InputError("--sampling-seed seeds sampling: give --greedy or --temperature T with it")
    if greedy and temp not in (None, 0, 0.0):
        raise InputError(f"--greedy samples at temperature 0: drop --temperature {temp:g}")
    if temp is not None and not (math.isfinite(temp) and 0.0 <= temp <= 100.0):
        raise InputError(f"--temperature {temp}: must be 0 to 100")
    seed = int(sseed) if sseed is not None else int(o.get("seed") or 0)
    if not 0 <= seed < 2**63:
        raise InputError(f"--sampling-seed {seed}: must be 0 to 2^63 - 1")
    return {"sampling": {"temperature": 0.0 if greedy or temp is None else float(temp), "seed": seed,
                         "greedy": greedy or temp == 0.0},
            "output_hash": True}


def logprobs_from_options(o: Options) -> dict[str, Any]:
    """``--logprobs N``: every request asks for the log-probabilities of its output tokens with the N most
    likely alternatives of each (completions ``logprobs: N``; chat ``logprobs: true, top_logprobs: N``),
    recorded in the manifest's workload (``extra.logprobs``) for the rules; {} when not given (none asked)."""
    n = o.get("logprobs")
    if n is None:
        return {}
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_LOGPROBS:
        raise InputError(f"--logprobs {n}: must be 0 to {MAX_LOGPROBS} (the most likely alternatives returned with "
                         "each output token; 0: the sampled token's own)")
    return {"logprobs": n}


def _dataset_from_options(o: Options, replay: bool, input_dist: bool, levels: int) -> Dataset | None:
    """``--dataset FILE`` read (its first records, as many as the run can send; bad records skipped with one
    warning on stderr), or None."""
    from diagnose.capture.datasets import KEEP, read_dataset

    if not o.get("dataset"):
        if o.get("dataset_format"):
            raise InputError("--dataset-format says how to read --dataset FILE: give --dataset")
        return None
    if replay:
        raise InputError("--workload replays the file's own requests: drop --dataset")
    if input_dist:
        raise InputError("--dataset sends its own prompts: drop the --input-tokens distribution")
    if int(o.get("turns") or 1) > 1:
        raise InputError("--dataset's conversations have their own turns: drop --turns")
    if float(o.get("shared_prefix") or 0.0) > 0:
        raise InputError("--dataset sends its own prompts: drop --shared-prefix")
    n = o.get("num_requests")
    keep = KEEP if not n else (int(n) + int(o.get("warmup") or 0)) * max(1, levels)
    ds = read_dataset(Path(o["dataset"]), o.get("dataset_format"), keep)
    if ds.note:
        import click

        click.echo(f"warning: {ds.note}", err=True)
    return ds


def _length_dists(o: Options) -> tuple[LengthDist | None, LengthDist | None]:
    """``--input-tokens`` and ``--output-tokens`` parsed (diagnose/capture/lengths.py): None for a fixed length
    (a plain integer, as before), else the distribution."""
    out: list[LengthDist | None] = []
    for key, option in (("input_tokens", "--input-tokens"), ("output_tokens", "--output-tokens")):
        v = o.get(key)
        if v is None:
            out.append(None)
            continue
        dist = parse_lengths(v, option)
        out.append(None if dist.fixed else dist)
    return out[0], out[1]


def _nominal(given: Any, dist: LengthDist | None, o: Options, stream: str) -> int:
    """The length of a fixed option, else its distribution's nominal length (the median of its draws)."""
    if dist is None:
        return parse_lengths(given, f"--{stream}-tokens").value
    return LengthDraws(dist, int(o.get("seed") or 0), stream).nominal()


def _tasks_from_options(o: Options, mode: str) -> dict[str, Any]:
    """``--turns``, ``--think-time``, ``--retries``: tasks of several requests (probes/sessions.py)."""
    turns = int(o["turns"]) if o.get("turns") is not None else 1
    retries = int(o["retries"]) if o.get("retries") is not None else 0
    think = parse_duration(o["think_time"]) if o.get("think_time") else 0.0
    if turns < 1 or turns > 10_000:
        raise InputError(f"--turns {turns}: use 1 to 10000 requests a task")
    if retries < 0 or retries > 100:
        raise InputError(f"--retries {retries}: use 0 to 100")
    if turns == 1 and (think or retries):
        raise InputError("--think-time and --retries shape tasks of several turns: give --turns N (N > 1)")
    if turns > 1 and mode != "concurrency":
        raise InputError("--turns runs a closed loop of tasks: use --concurrency (not --rate or --workload)")
    return {"turns": turns, "think_time_s": think, "retries": retries}


def _replay_from_options(o: Options) -> Replay | None:
    """``--workload FILE`` read (format detected; bad records skipped with a warning on stderr), or None."""
    speed, loop = o.get("speed"), o.get("loop")
    if not o.get("workload"):
        if speed not in (None, 1.0) or loop not in (None, 1):
            raise InputError("--speed and --loop scale and repeat a replay: give --workload FILE")
        return None
    if o["concurrency"] or o["rate"]:
        raise InputError("--workload replays the file's own arrivals: drop --concurrency/--rate")
    from diagnose.io.workload_file import read_workload

    replay = read_workload(Path(o["workload"]), speed=1.0 if speed is None else float(speed),
                           loop=1 if loop is None else int(loop), bounded=bool(o["duration"] or o["num_requests"]))
    if replay.note:
        import click

        click.echo(f"warning: {replay.note}", err=True)
    return replay
