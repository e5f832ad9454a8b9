"""A small real Python server-like process for the py-spy probe tests.

Threads: ``spinner`` busy-waits through a function named ``sched_yield`` (as vLLM's shm_broadcast does),
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


def spin() -> None:
    while True:
        sched_yield()


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
    print(srv.getsockname()[1], flush=True)
    threading.Thread(target=spin, name="spinner", daemon=True).start()
    threading.Thread(target=crunch, name="cruncher", daemon=True).start()
    time.sleep(args.exit_after)


if __name__ == "__main__":
    main()
