"""Watchdog for one vLLM server process group: if the Python process that started the server dies
without stopping it (SIGKILL, crash, an unhandled SIGTERM), terminate the whole group.

Started by harness.engine.VllmServer as a child of the owner, in a session of its own::

    python harness/_reaper.py OWNER_PID PGID

It exits on its own once the group is gone. Owner death is seen as a change of this process's parent
(no PID-reuse race). vLLM swallows a SIGTERM that arrives while it is still starting, so the group is
SIGKILLed if it does not exit within the grace period. Zombies do not count as alive: the machine's
init may never reap them.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil

POLL_S = 0.5
GROUP_CHECK_EVERY = 10  # scan /proc for the group every 10 polls (5 s): a scan costs ~20 ms
GRACE_S = 15.0


def group_alive(pgid: int) -> bool:
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: list[str]) -> int:
    owner, pgid = int(argv[0]), int(argv[1])
    polls = 0
    while os.getppid() == owner:
        time.sleep(POLL_S)
        polls += 1
        if polls % GROUP_CHECK_EVERY == 0 and not group_alive(pgid):
            return 0
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return 0
        time.sleep(POLL_S)
        signal_group(pgid, signal.SIGTERM)  # repeated: a SIGTERM during vLLM's startup can be lost
    signal_group(pgid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
