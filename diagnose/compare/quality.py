"""The quality guard (docs/compare.md, "Quality"): a speed-up that changes what the model answers is no gain.

Two checks, each optional:

* **Agreement of outputs.** A capture with ``attach --greedy`` keeps, per request, a hash of its prompt and of
  its output (probes/output_hash.py: of its token ids where the server streams them, else of its text; never
  the text itself); two runs are compared where both hashed the same thing. Requests of A and B with the same prompt (the same
  workload seed sends the same prompts) are paired; the share whose outputs are identical is reported with a
  Wilson interval, and for those that differ, how many tokens they still agreed on (the first divergence,
  located to within ``STEP`` tokens). Judged only when both runs sampled greedily: outputs sampled at a
  temperature are not expected to agree.
* **A score.** ``--quality-cmd CMD`` runs the user's evaluation once per run (``{bundle}`` in CMD, and the
  environment variable DIAGNOSE_BUNDLE, name the run's bundle), bounded by ``--quality-timeout``; its score is
  the last number on its last non-empty output line, higher is better.

``judge`` names what fails: agreement whose whole interval lies below ``min_agreement``, or a score that fell
by more than ``max_score_drop`` (relative). verify turns a failure into "refuted: quality".
"""

from __future__ import annotations

import math
import os
import re
import shlex
import statistics
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from diagnose.cli.quality_options import MAX_SCORE_DROP, MIN_AGREEMENT, QUALITY_TIMEOUT_S
from diagnose.compare.records import Agreement, Quality, RunScore, Scores
from diagnose.errors import DiagnoseError, InputError
from diagnose.probes.output_hash import STEP

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def check_options(min_agreement: float, max_score_drop: float, timeout_s: float) -> None:
    if not (math.isfinite(min_agreement) and 0.0 <= min_agreement <= 1.0):
        raise InputError(f"--min-agreement {min_agreement:g}: use a share in [0, 1], e.g. 0.9")
    if not (math.isfinite(max_score_drop) and 0.0 <= max_score_drop < 1.0):
        raise InputError(f"--max-score-drop {max_score_drop:g}: use a share in [0, 1), e.g. 0.02 for 2%")
    if not (math.isfinite(timeout_s) and 0 < timeout_s <= 86400):
        raise InputError(f"--quality-timeout {timeout_s:g}: use seconds in (0, 86400]")


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a share k/n (95% by default)."""
    if n <= 0:
        return (math.nan, math.nan)
    p = k / n
    d = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, mid - half), min(1.0, mid + half))


def _records(source: str) -> tuple[list[Mapping[str, Any]], Mapping[str, Any] | None]:
    """The requests of a bundle that carry an output hash, and the sampling its workload recorded."""
    from diagnose.io.bundle import open_bundle

    try:
        b = open_bundle(Path(source))
    except (DiagnoseError, OSError, ValueError):  # a trace, not a bundle: no outputs to compare
        return [], None
    wl = b.meta.workload
    sampling = dict(wl.sampling) if wl is not None and wl.sampling is not None else None
    if not b.has_stream("requests"):
        return [], sampling
    recs: list[Mapping[str, Any]] = [r for r in b.iter_records("requests")
            if r.get("ok") and isinstance(r.get("prompt_hash"), str) and isinstance(r.get("output_hash"), str)]
    return recs, sampling


def _agreed_tokens(ra: Mapping[str, Any], rb: Mapping[str, Any]) -> int:
    """Tokens two differing outputs still agree on: the last prefix checkpoint both passed with equal hashes
    (0 when they differ at the first, or one has none)."""
    ma = {int(t): h for t, h in _marks(ra)}
    agreed = 0
    for t, h in _marks(rb):
        if int(t) in ma:
            if ma[int(t)] != h:
                break
            agreed = int(t)
    return agreed


def _hashed(r: Mapping[str, Any]) -> str:
    """What a record's output hash is of: "token_ids" or "text" (records from before the kind was kept: text)."""
    return "token_ids" if r.get("output_hash_of") == "token_ids" else "text"


def _marks(r: Mapping[str, Any]) -> Iterable[tuple[Any, Any]]:
    m = r.get("output_prefix_hashes")
    if not isinstance(m, list):
        return []
    return [(x[0], x[1]) for x in m if isinstance(x, list) and len(x) == 2 and isinstance(x[0], int)]


def agreement(a_source: str, b_source: str) -> Agreement | None:
    """Share of identical outputs among A's and B's requests with the same prompt; None when neither run kept
    output hashes."""
    ra, sa = _records(a_source)
    rb, sb = _records(b_source)
    if not ra and not rb:
        return None
    out: Agreement = {"sampling_a": sa, "sampling_b": sb, "step_tokens": STEP}
    if not ra or not rb:
        which = "A" if not ra else "B"
        out.update({"pairs": 0, "note": f"run {which} kept no output hashes (capture it with attach --greedy)"})
        return out
    by_a: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in ra:
        by_a[r["prompt_hash"]].append(r)
    used: dict[str, int] = defaultdict(int)
    pairs: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = []
    for r in rb:  # the n-th B request with a prompt pairs with the n-th A request with it
        key = r["prompt_hash"]
        i = used[key]
        if i < len(by_a.get(key, ())):
            pairs.append((by_a[key][i], r))
            used[key] = i + 1
    # token-id hashes pair only with token-id hashes, text with text (a record from before the kind was kept
    # hashed text); a pair of one of each is left out and counted
    kinds = {_hashed(x) for x, _ in pairs} | {_hashed(y) for _, y in pairs}
    mixed = sum(1 for x, y in pairs if _hashed(x) != _hashed(y))
    pairs = [(x, y) for x, y in pairs if _hashed(x) == _hashed(y)]
    out["hashed"] = "token ids" if kinds == {"token_ids"} else "text" if kinds == {"text"} else "token ids and text"
    n = len(pairs)
    same = sum(1 for x, y in pairs if x["output_hash"] == y["output_hash"])
    lo, hi = wilson(same, n)
    agreed = [_agreed_tokens(x, y) for x, y in pairs if x["output_hash"] != y["output_hash"]]
    greedy = bool(sa and sa.get("greedy")) and bool(sb and sb.get("greedy"))
    out.update({"pairs": n, "identical": same, "share": same / n if n else None, "share_lo": lo if n else None,
                "share_hi": hi if n else None, "diverged": n - same, "greedy": greedy,
                "agreed_tokens_min": min(agreed) if agreed else None,
                "agreed_tokens_p50": float(statistics.median(agreed)) if agreed else None,
                "diverged_first_step": sum(1 for t in agreed if t == 0)})
    if mixed:
        out["kind_mismatched"] = mixed
    if not n and mixed:
        out["note"] = (f"not compared: of the {mixed} requests paired by prompt, one run hashed the outputs' token "
                       "ids and the other their text (a server that streams token ids beside one that does not)")
    elif not n:
        out["note"] = ("no request of B has a prompt of A's: capture both with the same --seed and workload; the "
                       "prompts also follow the server's /tokenize calibration (the manifests' prompt_calibration "
                       "must match)")
    elif not greedy:
        out["note"] = ("not judged: a run sampled at a temperature above 0 (its outputs are not expected to agree; "
                       "capture both with attach --greedy)")
    return out


def run_score(cmd: str, bundle: str, timeout_s: float = QUALITY_TIMEOUT_S) -> RunScore:
    """Runs the user's evaluation for one run: ``{"score": float}`` or ``{"error": one line}``."""
    line = cmd.replace("{bundle}", shlex.quote(str(bundle)))
    env = {**os.environ, "DIAGNOSE_BUNDLE": str(bundle)}
    try:
        p = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, timeout=timeout_s, env=env,
                           stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"--quality-cmd ran past {timeout_s:g} s and was stopped"}
    except OSError as e:
        return {"error": f"--quality-cmd could not start: {e}"}
    if p.returncode != 0:
        last_err = next((ln.strip() for ln in reversed(p.stderr.splitlines()) if ln.strip()), "")
        return {"error": f"--quality-cmd exited with status {p.returncode}" + (f": {last_err[:200]}" if last_err
                                                                               else "")}
    last = next((ln.strip() for ln in reversed(p.stdout.splitlines()) if ln.strip()), "")
    nums = _NUMBER.findall(last)
    if not nums:
        return {"error": f"--quality-cmd printed no score: its last line {last[:80]!r} has no number"}
    v = float(nums[-1])
    if not math.isfinite(v):
        return {"error": f"--quality-cmd's score {nums[-1]} is not a finite number"}
    return {"score": v}


def scores(cmd: str, a: str, b: str, timeout_s: float = QUALITY_TIMEOUT_S) -> Scores:
    sa, sb = run_score(cmd, a, timeout_s), run_score(cmd, b, timeout_s)
    out: Scores = {"cmd": cmd, "a": sa.get("score"), "b": sb.get("score")}
    errors = [f"{side}: {r['error']}" for side, r in (("A", sa), ("B", sb)) if "error" in r]
    if errors:
        out["error"] = "; ".join(errors)
        return out
    a_v, b_v = sa["score"], sb["score"]  # neither failed: each printed its score
    if a_v:
        out["rel"] = b_v / a_v - 1.0 if a_v > 0 else (b_v - a_v) / abs(a_v)
    else:
        out["rel"] = 0.0 if b_v == a_v else (math.inf if b_v > 0 else -math.inf)
    return out


def judge(q: Mapping[str, Any], min_agreement: float = MIN_AGREEMENT,
          max_score_drop: float = MAX_SCORE_DROP) -> tuple[list[str], list[str]]:
    """(failed, unmeasured): what refutes the change on quality, and what could not be measured (a quality
    command that failed)."""
    failed: list[str] = []
    unmeasured: list[str] = []
    ag = q.get("agreement")
    if isinstance(ag, Mapping) and ag.get("greedy") and ag.get("pairs"):
        hi = ag.get("share_hi")
        if isinstance(hi, float) and hi < min_agreement:
            where = (f"; the differing outputs agreed on their first {ag['agreed_tokens_p50']:.0f} tokens (median, "
                     f"to within {ag['step_tokens']})" if ag.get("agreed_tokens_p50") is not None else "")
            failed.append(f"{ag['identical']} of {ag['pairs']} greedy outputs identical ({ag['share']:.0%}, 95% CI "
                          f"{ag['share_lo']:.0%} to {ag['share_hi']:.0%}; needed {min_agreement:.0%}){where}")
    sc = q.get("score")
    if isinstance(sc, Mapping):
        if sc.get("error"):
            unmeasured.append(str(sc["error"]))
        elif isinstance(sc.get("rel"), float) and sc["rel"] < -max_score_drop:
            failed.append(f"quality score {sc['a']:.4g} -> {sc['b']:.4g} ({sc['rel']:+.1%}; allowed "
                          f"-{max_score_drop:.0%})")
    return failed, unmeasured


def quality(a_source: str, b_source: str, cmd: str | None = None, timeout_s: float = QUALITY_TIMEOUT_S,
            min_agreement: float = MIN_AGREEMENT, max_score_drop: float = MAX_SCORE_DROP) -> Quality | None:
    """Both checks and their judgement (``failed``, ``unmeasured``); None when neither applies."""
    ag = agreement(a_source, b_source)
    sc = scores(cmd, a_source, b_source, timeout_s) if cmd else None
    if ag is None and sc is None:
        return None
    q: Quality = {"agreement": ag, "score": sc, "min_agreement": min_agreement, "max_score_drop": max_score_drop,
                  "failed": [], "unmeasured": []}
    q["failed"], q["unmeasured"] = judge(q, min_agreement, max_score_drop)
    return q


def lines(q: Mapping[str, Any] | None) -> list[str]:
    """The text output's quality lines."""
    if not q:
        return []
    out: list[str] = []
    ag = q.get("agreement")
    if isinstance(ag, Mapping):
        if ag.get("pairs"):
            s = (f"  quality: {ag['identical']} of {ag['pairs']} outputs identical for the same prompt "
                 f"({ag['share']:.0%}, 95% CI {ag['share_lo']:.0%} to {ag['share_hi']:.0%}; hashes of their "
                 f"{ag.get('hashed', 'text')})")
            if ag.get("agreed_tokens_p50") is not None:
                s += (f"; the {ag['diverged']} that differ first part after {ag['agreed_tokens_p50']:.0f} tokens "
                      f"(median; min {ag['agreed_tokens_min']}, to within {ag['step_tokens']})")
            out.append(s)
        if ag.get("kind_mismatched") and ag.get("pairs"):
            out.append(f"  quality: {ag['kind_mismatched']} more pairs not compared: one run hashed token ids, the "
                       "other text")
        if ag.get("note"):
            out.append(f"  quality: {ag['note']}")
    sc = q.get("score")
    if isinstance(sc, Mapping):
        if sc.get("error"):
            out.append(f"  quality score: not measured: {sc['error']}")
        else:
            out.append(f"  quality score: {sc['a']:.4g} -> {sc['b']:.4g} ({sc['rel']:+.1%})")
    out += [f"  quality check failed: {f}" for f in q.get("failed") or []]
    return out

