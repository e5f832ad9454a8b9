"""Host CPU counters without py-spy: the engine's per-thread CPU time and run-queue wait, the machine's steal,
and the busiest processes outside the engine (what ``--pyspy`` records besides stacks).

It reads only ``/proc`` (``/proc/<pid>/task/<tid>/{stat,schedstat}``, ``/proc/stat``, ``/proc/<pid>/stat``):
no ptrace, no Python target, about 1-2 ms of CPU per second. So it runs by default whenever the server is a
local process (``--pid``, or the process listening on the target's port); ``--no-host`` turns it off, and with
``--pyspy`` the py-spy probe records the same counters itself, so this one stands aside. Remote servers:
unavailable, with the reason. Records: the ``host_samples`` stream of probes/pyspy.py (kinds ``process``,
``thread_cpu``, ``system_cpu``, ``foreign_scan``, ``foreign_cpu``, ``exit``), so analysis reads both alike.
"""

from __future__ import annotations

from diagnose.probes.base import Options, ProbeOption, ProbeSetup, ProbeSpec
from diagnose.probes.pyspy import HOST_NAME, PySpyProbe


def _build(o: Options, setup: ProbeSetup) -> PySpyProbe:
    return PySpyProbe(pid=o["pid"], stacks=False)


SPEC = ProbeSpec(
    name=HOST_NAME, title="Host CPU counters (/proc)",
    enabled=lambda o: bool(o["host"]) and not o["pyspy"], build=_build,
    options=(
        ProbeOption("--host/--no-host", flag=True, default=True, show_default=True,
                    help="Read the engine threads' CPU and run-queue wait from /proc (a local server only; "
                         "--pyspy records them too)."),
    ),
)
