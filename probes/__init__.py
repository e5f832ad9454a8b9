"""Probes gather evidence from a running engine. Each writes its own streams into the capture bundle.

Probes know nothing of rules or reports. Heavy or hardware imports (torch, pynvml, py-spy) happen inside
the probe that needs them, so analysis runs anywhere.

Each probe module ends with its ``SPEC`` (a :class:`diagnose.probes.base.ProbeSpec`): the options it adds to
``diagnose attach``, when it runs, and how it is built from them. ``PROBE_MODULES`` is the one list of them,
in the order the capture starts the probes; ``attach`` imports them only when it needs its options (so
``diagnose --help`` stays light). A probe from elsewhere joins with ``register(spec)``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diagnose.probes.base import ProbeSpec

PROBE_MODULES: tuple[str, ...] = (
    "diagnose.probes.load",
    "diagnose.probes.prometheus",
    "diagnose.probes.slots",
    "diagnose.probes.otel",
    "diagnose.probes.pyspy",
    "diagnose.probes.host_cpu",
    "diagnose.probes.nvml",
    "diagnose.probes.profiler",
    "diagnose.probes.pyinstrument_probe",
    "diagnose.probes.otel_export",
)

_registered: list[ProbeSpec] = []


def register(spec: ProbeSpec) -> None:
    """Add a probe that is not in ``PROBE_MODULES`` (it runs after those)."""
    if any(s.name == spec.name for s in probe_specs()):
        raise ValueError(f"a probe named {spec.name!r} is already registered")
    _registered.append(spec)


def unregister(name: str) -> None:
    """Remove a probe added with ``register`` (tests, plugins that unload)."""
    _registered[:] = [s for s in _registered if s.name != name]


def probe_specs() -> tuple[ProbeSpec, ...]:
    """Every probe ``attach`` knows, built-in first."""
    return (*(importlib.import_module(m).SPEC for m in PROBE_MODULES), *_registered)
