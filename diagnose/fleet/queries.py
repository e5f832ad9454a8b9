"""PromQL for a fleet, built from the engine maps (diagnose/engines/detect.py) so every engine the single-server
path knows is read the same way across replicas.

Aggregation happens on the server: each query sums (or maxes) by the replica labels (:data:`REPLICA_LABELS`),
rates and increases are computed by Prometheus, histogram quantiles by ``histogram_quantile``. Only the
replicas that matter are later pulled whole (:func:`detail_selector`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from diagnose.engines.detect import MetricRef, metric_map
from diagnose.errors import InputError

#: the labels that tell replicas apart (those a series lacks are simply empty), most general first
REPLICA_LABELS: tuple[str, ...] = ("job", "namespace", "pod", "instance")
BY = ", ".join(REPLICA_LABELS)
_NAME_RE = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*$")
# one escape of a PromQL string: those Go's strconv.Unquote accepts, or (last alternative) anything else
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|[0-7]{3}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[abfnrtv\\'\"]|.?)", re.S)
_GOOD_ESCAPE = re.compile(r"x[0-9a-fA-F]{2}|[0-7]{3}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[abfnrtv\\'\"]")
_MATCHER_RE = re.compile(r"""^\s*[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)\s*("([^"\\]|\\.)*"|'([^'\\]|\\.)*')\s*$""")


def selector_matchers(selector: str | None) -> str:
    """The label matchers inside a selector such as ``{job="vllm"}`` (braces optional), checked for shape;
    "" for none. A malformed one is an :class:`InputError` naming it."""
    s = (selector or "").strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1]
    elif "{" in s or "}" in s:
        raise InputError(f"--selector {selector!r}: expected label matchers in braces, e.g. '{{job=\"vllm\"}}'")
    s = s.strip().rstrip(",")
    if not s:
        return ""
    parts = _split_matchers(s)
    for p in parts:
        m = _MATCHER_RE.match(p)
        if not m:
            raise InputError(f"--selector {selector!r}: {p.strip()!r} is not a label matcher "
                             "(name=\"value\", !=, =~ or !~)")
        bad = next((e.group(0) for e in _ESCAPE.finditer(m.group(2)[1:-1]) if not _GOOD_ESCAPE.fullmatch(e.group(1))),
                   None)
        if bad is not None:
            raise InputError(f"--selector {selector!r}: {p.strip()!r} has the escape {bad}, which a PromQL string "
                             "cannot hold (a backslash is written \\\\)")
        if m.group(1) in ("=~", "!~"):
            _check_regex(selector, p.strip(), m.group(2)[1:-1])
    return ", ".join(p.strip() for p in parts)


def _check_regex(selector: str | None, matcher: str, quoted: str) -> None:
    """A regular-expression matcher's value must compile (Prometheus would refuse the query with a 400)."""
    try:
        re.compile(quoted.encode("latin-1", "backslashreplace").decode("unicode_escape"))
    except (re.error, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"--selector {selector!r}: {matcher!r} is not a valid regular expression ({e})") from None


def _split_matchers(s: str) -> list[str]:
    out, cur, quote, esc = [], "", "", False
    for ch in s:
        if esc:
            cur, esc = cur + ch, False
            continue
        if ch == "\\" and quote:
            cur, esc = cur + ch, True
            continue
        if ch in "\"'" and (not quote or quote == ch):
            quote = "" if quote else ch
        if ch == "," and not quote:
            out.append(cur)
            cur = ""
            continue
        cur += ch
    out.append(cur)
    return out


def _sel(names: Sequence[str], matchers: str, extra: Iterable[tuple[str, str]] = ()) -> str:
    for n in names:
        if not _NAME_RE.match(n):
            raise ValueError(f"not a metric name: {n!r}")
    parts = [f'__name__=~"{"|".join(names)}"'] if len(names) != 1 else []
    parts += [f'{k}=~"{v}"' for k, v in extra]
    if matchers:
        parts.append(matchers)
    body = ", ".join(parts)
    if len(names) == 1:
        return f"{names[0]}{{{body}}}" if body else names[0]
    return f"{{{body}}}"


@dataclass(frozen=True)
class Query:
    """One aggregated query: ``key`` names it in the bundle (stream ``fleet_series`` / ``fleet_totals``)."""

    key: str
    promql: str
    scale: float = 1.0


class FleetQueries:
    """The PromQL for one engine and selector, given the metric names the fleet actually has."""

    def __init__(self, engine: str, present: Iterable[str], selector: str | None) -> None:
        self.engine = engine
        self.present = set(present)
        self.matchers = selector_matchers(selector)
        self.refs = {r.signal: r for r in metric_map(engine)}

    # -- names ----------------------------------------------------------------------------------------
    def names(self, ref: MetricRef, suffix: str = "") -> list[str]:
        """The wire names of ``ref`` this fleet has (with ``suffix`` for a histogram's series)."""
        cands = []
        for n in ref.names:
            for c in ((n, f"{n}_total") if ref.kind == "counter" and not n.endswith("_total") else (n,)):
                if f"{c}{suffix}" in self.present:
                    cands.append(f"{c}{suffix}")
                    break
        return cands[:1] if ref.combine == "first" else cands

    def selector(self, signal: str, suffix: str = "") -> tuple[str, float] | None:
        """``{__name__=~..., <labels>}`` of one neutral signal and its scale; None when the fleet lacks it."""
        ref = self.refs.get(signal)
        if ref is None:
            return None
        names = self.names(ref, suffix)
        if not names:
            return None
        return _sel(names, self.matchers, ref.labels), ref.scale

    def process_selector(self, name: str) -> str | None:
        return _sel([name], self.matchers) if name in self.present else None

    # -- the aggregated queries ------------------------------------------------------------------------
    def range_queries(self, rate_window_s: float) -> list[Query]:
        """Per-replica series over the window (one point per step)."""
        from diagnose.probes.prometheus_api import fmt_duration

        w = fmt_duration(rate_window_s)
        out = []
        for key, signal, how in (("running", "running_requests", "sum"), ("waiting", "queue_depth", "sum"),
                                 ("kv_usage", "kv_usage_ratio", "max")):
            s = self.selector(signal)
            if s:
                out.append(Query(key, f"{how} by ({BY}) ({s[0]})", s[1]))
        for key, signal in (("request_rate", "finished_requests"), ("output_tps", "generation_tokens")):
            s = self.selector(signal)
            if s:
                out.append(Query(key, f"sum by ({BY}) (rate({s[0]}[{w}]))", s[1]))
        # Little's law on the server: the rate of a latency histogram's _sum is the time-weighted mean number of
        # requests in that stage (the gauges are sampled at scrape instants: vLLM reads 0 running between steps)
        for key, signal in (("in_flight", "e2e_seconds"), ("waiting_littles", "queue_time_seconds")):
            s = self.selector(signal, "_sum")
            if s:
                out.append(Query(key, f"sum by ({BY}) (rate({s[0]}[{w}]))", s[1]))
        return out

    def total_queries(self, range_s: float) -> list[Query]:
        """Per-replica values over the whole window, evaluated once at its end."""
        from diagnose.probes.prometheus_api import fmt_duration

        d = fmt_duration(range_s)
        out = []
        for key, signal in (("requests", "finished_requests"), ("generation_tokens", "generation_tokens"),
                            ("prefix_queries", "prefix_cache_queries_tokens"),
                            ("prefix_hits", "prefix_cache_hits_tokens"), ("preemptions", "preemptions")):
            s = self.selector(signal)
            if s:
                out.append(Query(key, f"sum by ({BY}) (increase({s[0]}[{d}]))", s[1]))
        for key, signal, q in (("ttft_p50_s", "ttft_seconds", 0.5), ("ttft_p99_s", "ttft_seconds", 0.99)):
            s = self.selector(signal, "_bucket")
            if s:
                out.append(Query(key, f"histogram_quantile({q}, sum by ({BY}, le) (increase({s[0]}[{d}])))", s[1]))
        num, den = self.selector("queue_time_seconds", "_sum"), self.selector("queue_time_seconds", "_count")
        if num and den:
            out.append(Query("queue_time_mean_s", f"sum by ({BY}) (increase({num[0]}[{d}])) / "
                                                  f"sum by ({BY}) (increase({den[0]}[{d}]))", num[1]))
        start = self.process_selector("process_start_time_seconds")
        if start:
            out.append(Query("start_time_changes", f"max by ({BY}) (changes({start}[{d}]))"))
        fin = self.selector("finished_requests")
        if fin:
            out.append(Query("counter_resets", f"max by ({BY}) (resets({fin[0]}[{d}]))"))
        load = self.selector("running_requests") or self.selector("queue_depth")
        if load:
            out.append(Query("samples", f"max by ({BY}) (count_over_time({load[0]}[{d}]))"))
        return out

    # -- full resolution -------------------------------------------------------------------------------
    def detail_names(self) -> list[str]:
        """Every wire name the engine map (and the process metrics) reads, as this fleet has them."""
        out: list[str] = []
        for ref in self.refs.values():
            suffixes = ("_bucket", "_sum", "_count") if ref.kind == "histogram" else ("",)
            for suf in suffixes:
                out += [n for n in self.names(ref, suf) if n not in out]
        for extra in ("process_start_time_seconds", "vllm:cache_config_info"):
            if extra in self.present and extra not in out:
                out.append(extra)
        return out

    def counter_renames(self) -> dict[str, str]:
        """Counters stored without ``_total`` (TGI's exporter) -> the ``<family>_total`` sample name the
        scrape parser gives every counter, which the one-server normaliser reads."""
        return {n: f"{n}_total" for ref in self.refs.values() if ref.kind == "counter"
                for n in self.names(ref) if not n.endswith("_total")}

    def ratio_ranges(self, slack: float = 0.0) -> dict[str, tuple[float, float]]:
        """Wire name -> the range of its raw values, for the engine-map metrics that are ratios (0-1 once
        scaled): a KV cache usage of 1e308 is not a measurement."""
        return {n: (0.0, (1.0 + slack) / ref.scale) for ref in self.refs.values() if ref.unit == "ratio"
                and ref.scale > 0 for n in ref.names}

    def detail_selector(self, labels: dict[str, str]) -> str | None:
        """The raw series of one replica (its labels pinned), every engine-map metric."""
        names = self.detail_names()
        if not names:
            return None
        pins = ", ".join(f'{k}="{_escape(v)}"' for k in REPLICA_LABELS if (v := labels.get(k)))
        m = ", ".join(x for x in (self.matchers, pins) if x)
        return f'{{__name__=~"{"|".join(names)}"{", " + m if m else ""}}}'


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


def replica_key(metric: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The replica a result series belongs to: its :data:`REPLICA_LABELS` that are set."""
    return tuple((k, str(metric[k])) for k in REPLICA_LABELS if metric.get(k))


def replica_name(key: tuple[tuple[str, str], ...]) -> str:
    """How findings and the report name a replica: its most specific labels, e.g. ``instance=10.0.0.7:8000``
    or ``namespace=prod,pod=vllm-2``."""
    d = dict(key)
    if d.get("pod"):
        return ",".join(f"{k}={d[k]}" for k in ("namespace", "pod") if d.get(k))
    if d.get("instance"):
        return f"instance={d['instance']}"
    return ",".join(f"{k}={v}" for k, v in key) or "(no labels)"
