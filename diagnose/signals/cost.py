"""What a run cost: the price of an hour of the deployment turned into cost per million output tokens, per
successful request and per request within the SLO (goodput).

One definition, used by the report (the derived signals ``cost_per_mtok``, ``cost_per_request`` and
``cost_per_good_request``, from the price ``attach --cost-per-hour`` recorded or ``analyze --cost-per-hour``
gives) and by ``compare`` (its cost metrics, with intervals): price per hour / (the rate x 3600) x scale.
"""

from __future__ import annotations

import math

from diagnose.errors import InputError
from diagnose.io.manifest import Manifest

# cost metric -> (the throughput it divides the price by, the scale: per million tokens, per request)
COST_BASE: dict[str, tuple[str, float]] = {"cost_per_mtok": ("output_tps", 1e6),
                                           "cost_per_request": ("request_rps", 1.0),
                                           "cost_per_good_request": ("goodput_rps", 1.0)}
MAX_DEVICES = 100_000


def per_unit(price_per_hour: float, rate: float, scale: float) -> float:
    """The price of one unit (a request, a million tokens) at ``rate`` units per second; NaN without a rate."""
    if not (rate > 0) or not math.isfinite(rate):
        return math.nan
    return price_per_hour / (rate * 3600.0) * scale


def parse_price(spec: str, option: str = "--cost-per-hour") -> float:
    """``2.5`` (the deployment's price per hour) or ``4.1x8`` (per device-hour x devices) -> price per hour.
    A bad value is a one-line InputError naming the option."""
    text = spec.strip().lower()
    price_s, sep, devices_s = text.partition("x")
    try:
        price = float(price_s)
        devices = int(devices_s) if sep else 1
    except ValueError:
        raise InputError(f"{option} {spec!r}: use PRICE (per hour) or PRICExDEVICES (per device-hour), "
                         "e.g. 2.5 or 4.1x8") from None
    if not (math.isfinite(price) and price > 0) or not 1 <= devices <= MAX_DEVICES:
        raise InputError(f"{option} {spec!r}: the price must be a positive number and the devices 1-{MAX_DEVICES}")
    return price * devices


def recorded_price(manifest: Manifest) -> float | None:
    """The price per hour a bundle's capture recorded (``options.cost_per_hour``), when it is a usable one."""
    v = manifest.options.cost_per_hour
    return float(v) if v is not None and v > 0 else None
