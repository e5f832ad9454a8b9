"""How the load probe paces requests onto the event loop (probes/load.py has the whole design): the send
budget per loop turn, closed-loop workers started a batch per turn, open-loop and replay requests spawned
as tasks, a phase's warm-up and measured quota, and the open loop's arrival gaps."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Collection, Coroutine
from typing import Any

from diagnose.capture.workload import WorkloadSpec

SEND_BATCH = 16  # requests set up and sent per event-loop turn at most (the rest wait a turn: _send_gate)
SEND_BUDGET_MS = 1.0  # ... and fewer when their measured set-up time would take longer than this in one turn
SETUP_MS_START = 0.5  # a request's set-up time assumed until one is measured (a new connection's is ~0.3-0.9 ms)


def _spawn(tasks: set[asyncio.Task[Any]], coro: Coroutine[Any, Any, Any]) -> None:
    """Start one request of an open loop or replay; ``tasks`` holds it while it runs."""
    task = asyncio.ensure_future(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


async def _run_workers(worker: Callable[[], Coroutine[Any, Any, None]], n: int) -> None:
    """Runs ``n`` closed-loop workers to their end, started ``SEND_BATCH`` per loop turn: every worker's first
    step in one turn (256 at a phase's start) held the loop for 10 ms and more before any request was sent."""
    tasks: list[asyncio.Task[None]] = []
    try:
        for i in range(n):
            tasks.append(asyncio.ensure_future(worker()))
            if i % SEND_BATCH == SEND_BATCH - 1:
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
    except BaseException:
        await _cancel_all(tasks)
        raise


async def _cancel_all(tasks: Collection[asyncio.Task[Any]]) -> None:
    """End the tasks still running (an open loop's or replay's requests, a closed loop's workers: a stop, an
    error) and wait for them."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclasses.dataclass
class _Quota:
    """A closed-loop phase's warm-up and measured sends (requests; tasks with --turns), shared by its workers."""

    warm_left: int
    measured_left: int | None  # None: as many as the phase's duration allows

    def take(self) -> bool | None:
        """True: send a warm-up one; False: a measured one; None: the phase has sent all it should."""
        if self.warm_left > 0:
            self.warm_left -= 1
            return True
        if self.measured_left is None:
            return False
        if self.measured_left > 0:
            self.measured_left -= 1
            return False
        return None


def _gap_fn(spec: WorkloadSpec, rate: float, rng: random.Random) -> Any:
    if spec.arrival == "constant":
        return lambda: 1.0 / rate
    if spec.arrival == "gamma" and spec.burstiness != 1.0:
        k = max(1e-3, spec.burstiness)
        return lambda: rng.gammavariate(k, 1.0 / (rate * k))
    return lambda: rng.expovariate(rate)
