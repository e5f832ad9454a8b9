"""Running the `diagnose` command in this process, for tests whose subject is not the process boundary.

A test that runs ``python -m diagnose ...`` in a subprocess pays the interpreter's start and the imports (pandas,
numpy, jinja2) on every call: 1-2 CPU-seconds each, up to 17 s of wall time on a loaded machine (issue 39).
Where the test asserts what the command prints, writes and exits with, :func:`diagnose` runs the same click
command (``diagnose.cli.main.cli``, the entry point's group, with its error handling) through click's
CliRunner and returns what a subprocess would: the exit status, stdout and stderr. An exception the command
does not handle is put into ``stderr`` as its traceback, as the interpreter would print it, so that the tests'
"no Traceback" assertions hold their meaning.

Tests whose subject IS the process keep ``subprocess``: the exit status of the real interpreter, signals
(SIGINT/SIGTERM while writing or capturing), resource limits set before exec (RLIMIT_FSIZE/NOFILE), the
environment a real process inherits, and killing the target under a running capture.
"""

from __future__ import annotations

import signal
import traceback
from dataclasses import dataclass

from click.testing import CliRunner

from diagnose.cli.main import cli


@dataclass
class Ran:
    """What :func:`diagnose` returns: the fields of subprocess.CompletedProcess that the tests read."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def diagnose(*args: str, env: dict[str, str | None] | None = None) -> Ran:
    """``diagnose ARGS...`` in this process; ``env`` overrides (None unsets) variables for the call only.

    The SIGINT/SIGTERM handlers are put back afterwards: a capture's event loop removes its own handlers by
    resetting SIGTERM to the default, which would undo tests/conftest.py's SIGTERM-unwinds-like-Ctrl-C. (The
    event loop policy needs no such care: attach runs a uvloop loop of its own and leaves the process's policy
    alone; tests/test_api.py checks it.)"""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        r = CliRunner().invoke(cli, list(args), prog_name="diagnose", env=env, catch_exceptions=True)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    stderr = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        stderr += "".join(traceback.format_exception(r.exception))  # starts "Traceback (most recent call last)"
    return Ran(list(args), r.exit_code, r.stdout, stderr)
