"""Capacity and cost from an SLO-edge search (``attach --find-max-goodput`` writes search.json; docs/compare.md,
"Capacity and cost").

Per replica, the capacity within the SLO is the max-goodput level's goodput (requests per second that met every
SLO term), with two sources of uncertainty, both carried through:

* the **measurement's spread** at that level: the bootstrap interval of its output tok/s (the search's own,
  ``output_tps_lo``/``_hi``), applied to its goodput in proportion (goodput and output tok/s are counted over the
  same span, so a resample that draws fewer tokens draws fewer good requests alike);
* the **edge's** position: the search stops between a level that met the SLO and one that did not; the capacity
  may lie anywhere up to the failing level's request rate (its goodput over its goodput ratio), never above it.

So ``goodput_rps_lo`` (the measured level's lower end) is what a replica surely serves, ``goodput_rps_hi`` the
most it could (the failing level's rate, or the measured level's upper end when the search never failed). The
replicas for a target rate are ``ceil(target / capacity)``, with the range from the two ends; the cost per hour
is replicas x price, and the cost per million output tokens is the price over a replica's output tokens in an
hour at its edge load (and at the target, the fleet's price over the target's tokens).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from diagnose.errors import DiagnoseError, InputError

MAX_REPLICAS = 1_000_000
MAX_SEARCH_BYTES = 64 * 1024 * 1024  # a search.json is a few KB: its points and their sources


def _f(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else math.nan


def _fin(v: float) -> float | None:
    return v if math.isfinite(v) else None


def read_search(path: Path) -> dict[str, Any]:
    """search.json (or the folder that holds it) as written by ``attach --find-max-goodput``."""
    from diagnose.io.bundle import read_input

    p = path / "search.json" if path.is_dir() else path
    try:
        data = orjson.loads(read_input(p, MAX_SEARCH_BYTES,
                                       f"larger than {MAX_SEARCH_BYTES >> 20} MiB: not a search.json"))
    except FileNotFoundError:
        raise InputError(f"{p}: no such file (give the search.json of attach --find-max-goodput, or its "
                         "folder)") from None
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
    except orjson.JSONDecodeError as e:
        raise InputError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("points"), list) or "max_goodput" not in data:
        raise InputError(f"{p}: not an SLO-edge search (expected the search.json of attach --find-max-goodput)")
    return data


def recorded_price(data: Mapping[str, Any]) -> float | None:
    """The price per hour the search's captures recorded (attach --cost-per-hour), from the max-goodput level's
    bundle; None when it recorded none or is not at hand."""
    from diagnose.io.bundle import open_bundle
    from diagnose.signals.cost import recorded_price as price_of

    edge = _point(data, data.get("max_goodput"))
    src = edge.get("source") if edge else None
    if not isinstance(src, str):
        return None
    try:
        return price_of(open_bundle(src).meta)
    except (DiagnoseError, OSError):
        return None


def _point(data: Mapping[str, Any], label: Any) -> dict[str, Any] | None:
    if label is None:
        return None
    return next((p for p in data["points"] if isinstance(p, dict) and p.get("label") == label), None)


def _request_rps(p: Mapping[str, Any]) -> float:
    """A level's finished requests per second: its goodput over its goodput ratio (NaN when either is 0)."""
    g, r = _f(p.get("goodput_rps")), _f(p.get("goodput_ratio"))
    return g / r if r > 0 and math.isfinite(g) else math.nan


def _replicas(target: float, per_replica: float) -> int | None:
    if not (per_replica > 0) or not math.isfinite(per_replica):
        return None
    return max(1, math.ceil(target / per_replica - 1e-9))


def capacity(data: Mapping[str, Any], target_rate: float | None = None,
             price_per_hour: float | None = None) -> dict[str, Any]:
    """The per-replica capacity within the SLO, the replicas for ``target_rate`` (req/s) and their cost."""
    if target_rate is not None and not (math.isfinite(target_rate) and target_rate > 0):
        raise InputError(f"--target-rate {target_rate:g}: use a positive rate in requests per second")
    edge = _point(data, data.get("max_goodput"))
    failing = _point(data, data.get("first_failing"))
    out: dict[str, Any] = {"slo": data.get("slo"), "kind": data.get("kind"), "edge": data.get("edge"),
                           "price_per_hour": price_per_hour, "target_rate": target_rate}
    if edge is None:
        out["note"] = f"no level met the SLO ({data.get('edge') or 'nothing measured'}): no capacity within it"
        return out
    c, tps = _f(edge.get("goodput_rps")), _f(edge.get("output_tps"))
    if not (c > 0 and tps > 0):
        out["note"] = f"the max-goodput level {edge.get('label')} has no goodput or throughput"
        return out
    tlo, thi = _f(edge.get("output_tps_lo")), _f(edge.get("output_tps_hi"))
    c_lo = c * tlo / tps if tlo > 0 else c
    c_hi = c * thi / tps if thi > 0 else c
    fail_rps = _request_rps(failing) if failing is not None else math.nan
    if math.isfinite(fail_rps):  # the SLO broke at the failing level: the edge lies below its rate
        c_hi = max(c, fail_rps)
    c_lo = min(c_lo, c)
    tok_per_req = tps / _request_rps(edge) if _request_rps(edge) > 0 else math.nan
    out["per_replica"] = {
        "level": edge.get("label"), "goodput_rps": c, "goodput_rps_lo": c_lo, "goodput_rps_hi": c_hi,
        "output_tps": tps, "output_tps_lo": _fin(tlo), "output_tps_hi": _fin(thi),
        "first_failing": failing.get("label") if failing else None, "first_failing_rps": _fin(fail_rps),
        "output_tokens_per_request": _fin(tok_per_req)}
    if price_per_hour is not None:
        mt = 1e6 / 3600.0
        out["per_replica"]["cost_per_mtok"] = price_per_hour / tps * mt
        out["per_replica"]["cost_per_mtok_lo"] = price_per_hour / thi * mt if thi > 0 else None
        out["per_replica"]["cost_per_mtok_hi"] = price_per_hour / tlo * mt if tlo > 0 else None
    if target_rate is not None:
        n, n_lo, n_hi = (_replicas(target_rate, x) for x in (c, c_hi, c_lo))
        if n is None or n_lo is None or n_hi is None or n_hi > MAX_REPLICAS:
            raise InputError(f"--target-rate {target_rate:g}: more than {MAX_REPLICAS} replicas of {c:.3g} req/s")
        t: dict[str, Any] = {"rate": target_rate, "replicas": n, "replicas_lo": n_lo, "replicas_hi": n_hi,
                             "load_per_replica": target_rate / n}
        if price_per_hour is not None:
            t.update(cost_per_hour=n * price_per_hour, cost_per_hour_lo=n_lo * price_per_hour,
                     cost_per_hour_hi=n_hi * price_per_hour)
            if math.isfinite(tok_per_req) and tok_per_req > 0:
                per = 1e6 / (target_rate * tok_per_req * 3600.0)
                t.update(cost_per_mtok=n * price_per_hour * per, cost_per_mtok_lo=n_lo * price_per_hour * per,
                         cost_per_mtok_hi=n_hi * price_per_hour * per)
        out["target"] = t
    return out


def lines(cap: Mapping[str, Any]) -> list[str]:
    if "per_replica" not in cap:
        return [f"capacity: {cap.get('note')}"]
    r = cap["per_replica"]
    unit = "" if cap.get("kind") == "concurrency" else " req/s"
    out = [f"per replica: {r['goodput_rps']:.3g} req/s within the SLO at {r['level']}{unit} "
           f"(range {r['goodput_rps_lo']:.3g} to {r['goodput_rps_hi']:.3g}: the throughput's interval at that "
           "level" + (f" and the edge below {r['first_failing']}{unit}, which failed at "
                      f"{r['first_failing_rps']:.3g} req/s" if r.get("first_failing_rps") is not None else "")
           + f"), {r['output_tps']:.4g} output tok/s"]
    if "cost_per_mtok" in r:
        iv = (f" ({r['cost_per_mtok_lo']:.3g} to {r['cost_per_mtok_hi']:.3g})"
              if r.get("cost_per_mtok_lo") is not None and r.get("cost_per_mtok_hi") is not None else "")
        out.append(f"  cost per million output tokens at that load: ${r['cost_per_mtok']:.3g}{iv} at "
                   f"${cap['price_per_hour']:.3g}/h a replica")
    t = cap.get("target")
    if t:
        rng = f" (range {t['replicas_lo']} to {t['replicas_hi']})" if t["replicas_lo"] != t["replicas_hi"] else ""
        out.append(f"target {t['rate']:g} req/s: {t['replicas']} replica(s){rng}, {t['load_per_replica']:.3g} req/s "
                   "each")
        if "cost_per_hour" in t:
            out.append(f"  cost: ${t['cost_per_hour']:.4g}/h (${t['cost_per_hour_lo']:.4g} to "
                       f"${t['cost_per_hour_hi']:.4g})" + (
                           f", ${t['cost_per_mtok']:.3g} per million output tokens (${t['cost_per_mtok_lo']:.3g} "
                           f"to ${t['cost_per_mtok_hi']:.3g})" if "cost_per_mtok" in t else ""))
    return out
