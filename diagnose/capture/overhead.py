"""What diagnose's probes cost the server they measure, and the budget that bounds it (issue 17).

Every probe measures its own cost and leaves it in its status detail under ``cost``:

``target_ms``
    time the server itself spent on the probe: answering ``/metrics`` (the HTTP exchange on loopback, time
    to first byte plus transfer: an upper bound on the server's time for it, since it includes any wait for
    the server's event loop), or paused by ``py-spy --blocking`` (py-spy's CPU while the process is stopped).
``own_cpu_s``
    CPU diagnose used for the probe: parsing scrapes, py-spy, the OTLP receiver, ``/proc`` reads, NVML calls.
``colocated``
    whether that CPU ran on the server's own host (a local server), where it competes for cores with the engine.
``window_s``
    how long the probe ran.

The cost on the server (``share``) is ``target_ms / 1000 / window_s`` as a share of one core; the capture's
is the sum over its probes (:func:`probe_cost`). ``diagnose attach`` keeps that sum under
``--overhead-budget`` (default 1% of one core): a probe whose cost on the server grows with how often it
samples (the Prometheus scraper; py-spy in blocking mode) measures its cost per sample as it goes and takes a
coarser interval or rate when the budget needs it, and says so (``adapted``). Diagnose's own CPU is measured
and reported beside it (``own_share``), not counted against the budget: on a host with idle cores it takes
nothing from the engine, and on a saturated one the report says how much it used. What no probe can tell
apart at run time is the engine's own work for a probe that it does whether or not diagnose listens: its
OpenTelemetry span export (4-6% of throughput on vLLM's CPU build, benchmarks/results/overhead.md), which
tracing on the engine costs, not the receiver.
"""

from __future__ import annotations

import ipaddress
import math
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from diagnose.errors import InputError
from diagnose.io.manifest import Manifest

DEFAULT_BUDGET = 0.01  # of one core: `attach --overhead-budget 1%`
MIN_FACTOR = 0.1  # an adapting probe samples at least a tenth as often as asked, whatever the budget says
AMORTISE_S = 10.0  # a probe's cost so far is spread over at least this long (its start-up is not its rate)
AIM = 0.8  # of the budget: the first ticks (before any cost is measured) and the closing scrape come regardless
# what `attach` runs with no probe flags: these share the budget. A probe the user adds (py-spy) is held to
# the budget on its own and never makes the default probes coarser: a run whose total is over it is flagged.
DEFAULT_PROBES = frozenset({"prometheus", "slots", "host", "nvml"})
BUDGET_OFF = ("off", "none", "0", "0%")


def parse_budget(text: str | float | None) -> float | None:
    """``--overhead-budget``: "1%", "0.5%" or a fraction such as "0.01"; "off" (or 0) for none. None: no budget."""
    if text is None:
        return None
    s = str(text).strip().lower()
    if s in BUDGET_OFF:
        return None
    try:
        v = float(s[:-1]) / 100.0 if s.endswith("%") else float(s)
    except ValueError:
        raise InputError(f"--overhead-budget {text!r}: give a share of one core such as 1% or 0.005, "
                         "or off") from None
    if not (0 < v <= 1) or not math.isfinite(v):
        raise InputError(f"--overhead-budget {text!r}: must be more than 0% and at most 100% of one core")
    return v


# -- the network's share of an exchange (issue 36, client defect 2) ---------------------------------------
PINGS = 3  # requests timed before a probe's first exchange to learn the network's round trip (the fastest counts)
PING_PATH = "/v1/models"  # a page every OpenAI-compatible server answers at once (any status will do)
RTT_SIGNIFICANT_MS = 2.0  # a round trip over this is a network's (a proxy, a port-forward), not a local handler's


async def round_trip_ms(session: Any, url: str, headers: dict[str, str], timeout_s: float) -> float | None:
    """The network's round trip to the server, ms: the fastest of ``PINGS`` answers (headers received) to a
    request every server answers at once (``PING_PATH``), on the probe's kept connection (the first also
    connects). None when the server does not answer (the probe's first exchange then says why). Behind a proxy
    adding 80 ms, every exchange took 80 ms and more of which the server spent a few: charged whole, a 1%
    budget stretched the Prometheus and /slots intervals from 1 s to 10 s."""
    import asyncio
    import time

    import aiohttp

    best: float | None = None
    for _ in range(PINGS):
        t0 = time.monotonic_ns()
        try:
            async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                ms = (time.monotonic_ns() - t0) / 1e6
                await r.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return best
        best = ms if best is None else min(best, ms)
    return best


def server_ms(t0_ns: int, headers_ns: int, end_ns: int, rtt_ms: float | None) -> float:
    """The server's time for one exchange (sent, headers received, body read), ms: the whole exchange on a
    short round trip (loopback: the transfer is the server writing); over ``RTT_SIGNIFICANT_MS``, the time to
    first byte less the round trip (the transfer is the network's)."""
    if rtt_ms is not None and rtt_ms > RTT_SIGNIFICANT_MS:
        return max(0.0, (headers_ns - t0_ns) / 1e6 - rtt_ms)
    return (end_ns - t0_ns) / 1e6


def network_basis(rtt_ms: float | None, what: str, local: str) -> str:
    """The ``basis`` of a probe's server cost: ``local`` on a short round trip, else how the network's was
    taken out."""
    if rtt_ms is not None and rtt_ms > RTT_SIGNIFICANT_MS:
        return (f"server: each {what} exchange's time to first byte less the network's {rtt_ms:.3g} ms round "
                "trip (the transfer is the network's)")
    return local


def is_local(url: str) -> bool:
    """Whether the server at ``url`` runs on this host (loopback, or one of this host's own addresses)."""
    host = urlsplit(url).hostname
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.gethostbyname(host))
        except (OSError, ValueError):
            return False
    if ip.is_loopback or ip.is_unspecified:
        return True
    try:
        import psutil

        return any(a.address == str(ip) for addrs in psutil.net_if_addrs().values() for a in addrs)
    except Exception:  # noqa: BLE001 - no interface list: not known to be local
        return False


def cost(target_ms: float, own_cpu_s: float, window_s: float, colocated: bool, basis: str,
         **extra: Any) -> dict[str, Any]:
    """A probe's ``cost`` entry (see the module docstring)."""
    out: dict[str, Any] = {"target_ms": round(float(target_ms), 3), "own_cpu_s": round(float(own_cpu_s), 4),
                           "window_s": round(float(window_s), 3), "colocated": bool(colocated), "basis": basis}
    out["share"] = round(share_of(out), 6)
    out["own_share"] = round(share_of(out, "own_cpu_s"), 6)
    out.update({k: v for k, v in extra.items() if v is not None})
    return out


def share_of(c: dict[str, Any], key: str = "target_ms") -> float:
    """One probe's cost on the server (``target_ms``) or its own CPU (``own_cpu_s``) as a share of one core
    (0 when its window is unknown)."""
    try:
        window = float(c.get("window_s") or 0.0)
        spent = float(c.get(key) or 0.0) / (1e3 if key == "target_ms" else 1.0)
    except (TypeError, ValueError):
        return 0.0
    return spent / window if window > 0 and math.isfinite(spent) else 0.0


@dataclass
class OverheadBudget:
    """The capture's budget (``ctx.shared["overhead"]``, made by :func:`budget_of`).

    A probe whose cost on the server grows with how often it samples states what it would cost at the
    interval or rate asked (``want``: its measured cost per sample times the asked rate) and samples
    ``factor(name)`` times as often as asked. For the default probes (``DEFAULT_PROBES``) that is 1 while
    their wants fit in ``AIM`` of the budget, else the same fraction for each; a probe the user added is held
    to the budget on its own. Never under ``MIN_FACTOR`` (a run over the budget even then is flagged). The
    other probes cost the server nothing measurable (their CPU is diagnose's own) and take no part."""

    share: float
    wants: dict[str, float] = field(default_factory=dict)

    def want(self, probe: str, share: float) -> None:
        self.wants[probe] = max(0.0, float(share))

    def factor(self, probe: str) -> float:
        free = self.share * AIM
        if probe in DEFAULT_PROBES:
            need = sum(v for k, v in self.wants.items() if k in DEFAULT_PROBES)
        else:
            need = self.wants.get(probe, 0.0)
        if need <= free:
            return 1.0
        return max(MIN_FACTOR, free / need)


def rate_of(spent_s: float, elapsed_s: float) -> float:
    """A probe's cost so far as a share of one core, its start-up spread over at least ``AMORTISE_S``."""
    return spent_s / max(AMORTISE_S, elapsed_s)


def budget_of(shared: MutableMapping[str, object], options: Mapping[str, object]) -> OverheadBudget | None:
    """The capture's budget (None when the capture runs without one: ``--overhead-budget off``, or a probe
    run on its own)."""
    b = shared.get("overhead")
    if isinstance(b, OverheadBudget):
        return b
    share = options.get("overhead_budget")
    if not isinstance(share, (int, float)) or not share > 0:
        return None
    b = OverheadBudget(float(share))
    shared["overhead"] = b
    return b


# -- analysis side: the capture's total, from the manifest ---------------------------------------------------
PROBE_TITLES = {"prometheus": "Prometheus", "pyspy": "py-spy", "host": "/proc counters", "otel": "OTLP receiver",
                "nvml": "NVML", "profiler": "engine profiler", "pyinstrument": "pyinstrument"}


def probe_cost(manifest: Manifest) -> dict[str, Any] | None:
    """The capture's probe cost on the server from the probes' statuses: ``{share, budget, over_budget,
    own_share, probes: [{name, share, own_share, target_ms, own_cpu_s, colocated, adapted}], adapted: [lines],
    line}``; None for a bundle whose probes recorded no cost (older bundles, traces)."""
    rows: list[dict[str, Any]] = []
    for st in sorted(manifest.probes, key=lambda p: p.name):
        name, c = st.name, st.detail.get("cost")
        if not isinstance(c, dict):
            continue
        rows.append({"name": str(name), "share": share_of(c), "own_share": share_of(c, "own_cpu_s"),
                     "target_ms": c.get("target_ms"),
                     "own_cpu_s": c.get("own_cpu_s"), "colocated": bool(c.get("colocated")),
                     "basis": str(c.get("basis") or ""), "adapted": str(c.get("adapted") or "")})
    if not rows:
        return None
    budget = manifest.options.overhead_budget
    budget = float(budget) if budget is not None and budget > 0 else None
    total = sum(r["share"] for r in rows)
    over = budget is not None and total > budget
    parts = ", ".join(f"{PROBE_TITLES.get(r['name'], r['name'])} {_pct(r['share'])}"
                      for r in sorted(rows, key=lambda r: -r["share"]) if r["share"] > 0)
    line = f"diagnose cost the server about {_pct(total)} of a core" + (f" ({parts})" if parts else "")
    if budget is not None:
        line += f"; {'over' if over else 'within'} the {_pct(budget)} budget"
    else:
        line += "; no budget set"
    own = sum(r["own_share"] for r in rows)
    own_parts = ", ".join(f"{PROBE_TITLES.get(r['name'], r['name'])} {_pct(r['own_share'])}"
                          for r in sorted(rows, key=lambda r: -r["own_share"]) if r["own_share"] > 0)
    where = ("on the server's host" if any(r["colocated"] for r in rows) else
             "on another host than the server's")
    line += f"; diagnose's own CPU {where}: {_pct(own)} of a core" + (f" ({own_parts})" if own_parts else "")
    return {"share": total, "own_share": own, "budget": budget, "over_budget": over, "probes": rows, "line": line,
            "adapted": [f"{PROBE_TITLES.get(r['name'], r['name'])}: {r['adapted']}" for r in rows if r["adapted"]]}


def _pct(x: float) -> str:
    return f"{100 * x:.2g}%" if x < 0.1 else f"{100 * x:.0f}%"
