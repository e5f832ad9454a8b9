"""Shared pytest setup: the repo root on sys.path (so tests can ``import harness``) and real-engine fixtures.

Fixtures for tests marked ``engine`` (deselected by default through pyproject's addopts; run them with
``python -m pytest -m engine``):

- ``vllm_server`` (session): one started :class:`harness.engine.VllmServer` shared by the session,
  stopped at the end. Builds the engine venv and tiny model first when missing.
- ``start_vllm`` (function): a factory ``start_vllm(**VllmServer kwargs) -> VllmServer`` for tests that
  need their own flags (profiler, OTLP, --max-num-seqs...); every server it started is stopped when the
  test ends, pass or fail.

Server startup timeout: ``DIAGNOSE_ENGINE_STARTUP_TIMEOUT`` (default 600 s under pytest).
A SIGTERM to pytest is turned into KeyboardInterrupt so these fixtures still stop their servers.
``DIAGNOSE_TEST_ENGINE_PORT`` pins the session server's port (default: a free loopback port).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from harness.engine import VllmServer, ensure_engine  # noqa: E402
from tests.hostload import (  # noqa: E402, F401 - hooks: the host-load report of engine and timing tests
    pytest_runtest_call,
    pytest_runtest_makereport,
    pytest_terminal_summary,
)


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (e.g. from `timeout` in .ci/run) unwinds like Ctrl-C, so fixtures stop their vLLM servers
    # (which run in their own process groups and would not get the signal themselves).
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    # Startup takes 30-70 s on an idle 2-core machine but several minutes when it is shared.
    os.environ.setdefault("DIAGNOSE_ENGINE_STARTUP_TIMEOUT", "600")


@pytest.fixture(scope="session")
def engine_built() -> None:
    """The engine venv and tiny model exist (built on first use; a build failure fails the test)."""
    ensure_engine()


@pytest.fixture(scope="session")
def vllm_server(engine_built: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    port_env = os.environ.get("DIAGNOSE_TEST_ENGINE_PORT")
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    server = VllmServer(port=int(port_env) if port_env else None, log_path=log_path)
    with server:
        yield server


@pytest.fixture
def start_vllm(engine_built: None, tmp_path: Path) -> Iterator[Callable[..., VllmServer]]:
    started: list[VllmServer] = []

    def start(**kwargs: Any) -> VllmServer:
        kwargs.setdefault("log_path", tmp_path / f"server-{len(started)}.log")
        server = VllmServer(**kwargs)
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()
