"""``attach --realtime``: run the capture's event loop (the load client) at real-time scheduling priority.

On a small machine a CPU-bound engine (vLLM's CPU backend, or anything saturating every core) starves the
load client: its event loop wakes late, chunks are stamped late, and the client's self-check rightly
declares the run invalid. SCHED_RR priority 1 puts the client ahead of every normal process while it has
work, and it needs little CPU (about a tenth of a core), so it takes little from the engine. It is set on the
calling thread before the capture's event loop starts, so threads the capture starts later (executor
threads) inherit it, exactly like ``chrt -r 1 diagnose attach``: a helper thread left at normal priority could
hold the GIL while preempted and stall the loop. Child processes of probes (the metrics parser, py-spy) go
back to normal priority (:func:`child_argv`, their command line): they share no GIL with the loop,
and at real-time priority every CPU-millisecond they use would be taken straight from the engine.

Setting it needs root, CAP_SYS_NICE or an RLIMIT_RTPRIO of at least 1. When it is not permitted the capture
goes on at normal priority and the bundle says so (``options.realtime``, and the load probe's status). The
previous policy is restored when the capture ends.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

POLICY = "SCHED_RR"
PRIORITY = 1
NOT_PERMITTED = "realtime requested but not permitted"


class RealtimePriority:
    """Holds the real-time policy on the calling thread between :meth:`apply` and :meth:`restore`.

    ``info`` is what the bundle records: ``{requested, applied, policy, priority, reason}``.
    """

    def __init__(self, priority: int = PRIORITY) -> None:
        self.priority = priority
        self.info: dict[str, Any] = {"requested": True, "applied": False, "policy": POLICY, "priority": priority,
                                     "reason": ""}
        self._old: tuple[int, Any] | None = None

    def apply(self) -> dict[str, Any]:
        try:
            old = os.sched_getscheduler(0), os.sched_getparam(0)
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(self.priority))
        except AttributeError:
            self.info["reason"] = f"{NOT_PERMITTED}: real-time scheduling is not available on this platform"
        except PermissionError as e:
            self.info["reason"] = (f"{NOT_PERMITTED}: {e.strerror or e} (needs root, CAP_SYS_NICE or an "
                                   f"RLIMIT_RTPRIO of at least {self.priority}; running at normal priority)")
        except OSError as e:
            self.info["reason"] = f"{NOT_PERMITTED}: {e.strerror or e} (running at normal priority)"
        else:
            self._old = old
            self.info["applied"] = True
        return self.info

    def restore(self) -> None:
        """Back to the policy the thread had before :meth:`apply` (idempotent)."""
        if self._old is None:
            return
        old, self._old = self._old, None
        try:
            os.sched_setscheduler(0, old[0], old[1])
        except OSError as e:  # pragma: no cover - lowering one's own priority is always permitted on Linux
            self.info["restore_error"] = str(e.strerror or e)

    def __enter__(self) -> RealtimePriority:
        self.apply()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


# Run by a child's own interpreter before it becomes the real program: normal scheduling, then exec.
_TRAMPOLINE = ("import os, sys\n"
               "try:\n    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))\nexcept OSError:\n    pass\n"
               "os.execvp(sys.argv[1], sys.argv[1:])")


def child_argv(argv: Sequence[str]) -> list[str]:
    """The command line that starts a probe's child process (the metrics parser, py-spy) at normal priority.

    At normal priority: ``argv`` as it is. On a thread that holds a real-time policy (``attach --realtime``,
    inherited by every thread of the capture): ``argv`` behind a few lines of Python that leave the policy for
    the normal one and exec it (the same process), so the child never takes the engine's CPU at real-time
    priority past its interpreter's start (~15 ms).

    It is a command line, not a ``preexec_fn``, on purpose: any ``preexec_fn`` makes Python fork the whole
    capture process with the GIL held and run every fork handler (gRPC's, behind --otlp), instead of a vfork
    that runs none. Measured beside a gRPC server with 600 MB resident, a thread spawning a child every 50 ms:
    the event loop's lag P99 16-17 ms and max 29-33 ms with a ``preexec_fn``, 0.35-0.38 ms and 2.4-3.5 ms
    without (benchmarks/fork_stall.py); and a child so forked once died of SIGABRT in gRPC's poller
    (``epoll_wait error: Bad file descriptor``) before it could exec."""
    try:
        rt = os.sched_getscheduler(0) in (os.SCHED_RR, os.SCHED_FIFO)
    except (AttributeError, OSError):
        rt = False
    return [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, *argv] if rt else list(argv)
