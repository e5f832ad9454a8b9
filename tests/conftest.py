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

import json
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


# -- test tiers (issue 39) ----------------------------------------------------------------------------------
# The README's command (`python -m pytest -q`) runs the unit tier; pyproject's addopts leave out `slow`,
# `timing`, `engine` and `gpu`, which .ci/run runs after it. Timing-sensitive tests measure time or CPU use
# or need an idle CPU: they go red on a busy machine, so they run in their own tier, whose failures
# tests/hostload.py puts beside the machine's load ("load check"). `slow`: tests/tiers.json (tools/tiers.py:
# every test of 0.5 s or more on 2 idle cores) and the rest of the fuzz corpus (tests/test_fuzz_read.py).
TIMING = (
    "tests/test_probe_cost.py::test_a_slow_metrics_page_is_scraped_less_often_within_the_budget",
    "tests/test_probe_cost.py::test_a_capture_records_its_budget_and_the_report_states_its_cost",
    "tests/test_probe_cost.py::test_the_proc_counters_cost_the_server_nothing_and_keep_their_interval",
    "tests/test_probe_cost.py::test_blocking_pyspy_lowers_its_rate_within_a_tiny_budget",
    "tests/test_probe_cost.py::test_nonblocking_pyspy_never_pauses_the_server",
    "tests/test_client_stall.py::test_full_gc_deferred_during_capture_and_recorded_as_stall_cause",
    "tests/test_client_stall.py::test_off_cpu_stall_says_why_the_thread_did_not_run",
    "tests/test_client_stall.py::test_stall_in_a_blocking_call_is_off_cpu_even_in_a_busy_sample",
    "tests/test_client_stall.py::test_stall_waiting_for_pages_read_back_from_disk_is_a_page_fault",
    "tests/test_client_stall.py::test_stall_behind_another_task_on_the_cpu_is_preempted",
    "tests/test_prometheus_probe.py::test_a_parser_starved_of_cpu_does_not_stop_the_scraping",
    "tests/test_prometheus_probe.py::test_a_starved_parser_delays_the_writing_not_the_sampling",
    "tests/test_prometheus_probe.py::test_the_backlog_of_unparsed_scrapes_is_bounded",
    "tests/test_prometheus_probe.py::test_a_parse_that_costs_too_much_cpu_stops_the_scraping",
    "tests/test_prometheus_probe.py::test_the_worker_ends_a_parse_at_its_cpu_limit",
    "tests/test_pyspy_probe.py::test_discovers_pid_from_listening_port",
    "tests/test_goodput.py::test_find_max_goodput_finds_the_servers_capacity",
    "tests/test_realtime.py::test_attach_realtime_is_recorded_in_the_bundle",
    # a healthy server must draw no finding; on a busy machine the host probe rightly sees other processes on
    # the (in-process) server's cores and HST005 fires: a finding about the machine's load, not the code
    "tests/test_cli.py::test_attach_then_analyze_end_to_end",
    # the page's render time and the loopback round trip are measured: a loaded machine stretches both
    "tests/test_prometheus_rtt.py::test_a_proxys_round_trip_is_not_charged_to_the_server",
    "tests/test_prometheus_rtt.py::test_on_loopback_nothing_is_taken_out",
    # the busy child must be among the machine's three busiest processes: on a loaded machine (or beside the
    # slow tier's other worker) other processes outrun it (failed so here, before and after the change)
    "tests/test_host_foreign.py::test_scan_names_a_busy_process_outside_the_engine",
)
TIERS_FILE = Path(__file__).resolve().parent / "tiers.json"


def _slow_listed() -> set[str]:
    try:
        return set(json.loads(TIERS_FILE.read_text())["slow"])
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = _slow_listed()
    for item in items:
        base = item.nodeid.split("[", 1)[0]
        if base in TIMING:
            item.add_marker(pytest.mark.timing)
        elif item.nodeid in slow:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def engine_built() -> None:
    """The engine venv and tiny model exist (built on first use; a build failure fails the test)."""
    ensure_engine()


# Every test server runs eager (no torch.compile): ready in 39 s instead of 57 s on 2 idle cores (measured
# here, harness.engine.VllmServer, three starts), over the ~20 starts of the engine tier. Nothing the tests
# assert depends on compilation; the experiment tests ran eager already.
EAGER = "--enforce-eager"


def with_eager(extra_args: list[str] | None) -> list[str]:
    args = list(extra_args or [])
    return args if EAGER in args else [*args, EAGER]


@pytest.fixture(scope="session")
def vllm_server(engine_built: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    port_env = os.environ.get("DIAGNOSE_TEST_ENGINE_PORT")
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    server = VllmServer(port=int(port_env) if port_env else None, log_path=log_path, extra_args=with_eager(None))
    with server:
        yield server


@pytest.fixture
def start_vllm(engine_built: None, tmp_path: Path) -> Iterator[Callable[..., VllmServer]]:
    started: list[VllmServer] = []

    def start(**kwargs: Any) -> VllmServer:
        kwargs.setdefault("log_path", tmp_path / f"server-{len(started)}.log")
        kwargs["extra_args"] = with_eager(kwargs.get("extra_args"))
        server = VllmServer(**kwargs)
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()
