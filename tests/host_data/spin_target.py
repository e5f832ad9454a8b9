"""A small real Python server-like process for the py-spy probe tests.

Threads: ``spinner`` busy-waits in ``SpinCondition.wait``, a loop around a function named ``sched_yield``, as
vLLM's shm_broadcast does (the loop lives inside the wait, so every sample of the thread has that frame: with
the loop in a plain ``spin`` frame, a loaded CI host caught 4 of 32 samples between two calls and the share
the test asserts measured the host, not the categorisation),
``cruncher`` does arithmetic in ``forward`` with short sleeps, the main thread listens on a loopback port
(printed on stdout) and sleeps. Exits after ``--exit-after`` seconds (default 60).
"""

import argparse
import os
import socket
import threading
import time


def sched_yield() -> None:
    os.sched_yield()


class SpinCondition:
    def wait(self) -> None:
        while True:
            sched_yield()


def spin() -> None:
    SpinCondition().wait()


def forward() -> int:
    x = 0
    for i in range(200_000):
        x += i * i
    return x


def crunch() -> None:
    while True:
        forward()
        time.sleep(0.005)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--exit-after", type=float, default=60.0)
    args = ap.parse_args()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    threading.Thread(target=spin, name="spinner", daemon=True).start()
    threading.Thread(target=crunch, name="cruncher", daemon=True).start()
    print(srv.getsockname()[1], flush=True)  # once the threads run: no sample catches one starting
    time.sleep(args.exit_after)


if __name__ == "__main__":
    main()
