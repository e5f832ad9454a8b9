"""Issue 33, item 6: `diagnose experiment --launch CMD` / `attach --launch CMD` with server commands that
misbehave, and bad launch options.

The launched "server" (tests/servers/faults.py behind a wrapper written here) starts children that leave its
process group and session (setsid), ignore SIGTERM, or double-fork into a daemon. Once diagnose stops the
server, psutil must find none of them alive. An unbalanced quote in CMD, a startup timeout that is not a
positive number and a malformed --set are usage errors (exit 2, one line), before anything starts.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner, Result

from diagnose.cli.main import cli

FAULTS = Path(__file__).parent / "servers" / "faults.py"

pytestmark = pytest.mark.timeout(180)  # only to catch a hang

# The wrapper: starts the children named on its command line, waits until each has written its PID to the PID
# file (so every one exists before the server answers), then becomes the server (exec). ``term`` makes the
# server itself ignore SIGTERM.
WRAPPER = textwrap.dedent('''
    import os, signal, subprocess, sys, time
    pidfile, kinds, server = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
    CHILD = {
        # leaves the process group and the session
        "setsid": "import os, time; os.setsid(); open(PF, 'a').write(f'{os.getpid()}\\\\n'); time.sleep(600)",
        # stays in the group, ignores SIGTERM
        "ignore": "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "open(PF, 'a').write(f'{os.getpid()}\\\\n'); time.sleep(600)",
        # double fork + setsid + SIGTERM ignored: a daemon whose parent is gone
        "daemon": "import os, signal, time\\n"
                  "if os.fork(): os._exit(0)\\n"
                  "os.setsid()\\n"
                  "if os.fork(): os._exit(0)\\n"
                  "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
                  "open(PF, 'a').write(f'{os.getpid()}\\\\n')\\n"
                  "time.sleep(600)",
        # the same daemon, minding SIGTERM
        "detached": "import os, time\\n"
                    "if os.fork(): os._exit(0)\\n"
                    "os.setsid()\\n"
                    "if os.fork(): os._exit(0)\\n"
                    "open(PF, 'a').write(f'{os.getpid()}\\\\n')\\n"
                    "time.sleep(600)",
    }
    want = 0
    for k in kinds:
        if k in CHILD:
            subprocess.Popen([sys.executable, "-c", f"PF = {pidfile!r}\\n" + CHILD[k]])
            want += 1
    while True:
        try:
            if len(open(pidfile).read().split()) >= want:
                break
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    open(pidfile, "a").write(f"{os.getpid()}\\n")
    if "term" in kinds:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # an ignored signal stays ignored across exec
        os.environ["IGNORE_SIGTERM"] = "1"
    os.execv(sys.executable, [sys.executable, "-c",
             "import os, runpy, signal, sys\\n"
             "if os.environ.get('IGNORE_SIGTERM'): signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
             f"sys.argv = {server!r}\\n"
             f"runpy.run_path({server[0]!r}, run_name='__main__')"])
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command(tmp_path: Path, kinds: str, port: int) -> tuple[str, Path]:
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    pidfile = tmp_path / "pids"
    cmd = shlex.join([sys.executable, str(wrapper), str(pidfile), kinds, str(FAULTS), "--port", str(port),
                      "--tokens", "4"])
    return cmd, pidfile


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill_leftovers(pids: list[int]) -> None:
    for pid in pids:  # only the test's own processes, by PID, should a check fail
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


@pytest.mark.parametrize("kinds", ["setsid,ignore,daemon", "setsid,ignore,daemon,term"])
def test_stop_leaves_no_process_of_the_server(kinds: str, tmp_path: Path) -> None:
    from diagnose.runs.experiment import launch

    port = _free_port()
    cmd, pidfile = _command(tmp_path, kinds, port)
    server = launch(shlex.split(cmd), f"http://127.0.0.1:{port}", tmp_path / "server.log", timeout_s=60)
    pids = [int(x) for x in pidfile.read_text().split()]
    try:
        assert len(pids) == 4 and all(_alive(p) for p in pids)
        left = server.stop(grace_s=2)
        assert [p for p in pids if _alive(p)] == []
        assert not left  # stop() found them gone too
        assert server.proc.poll() is not None
    finally:
        _kill_leftovers(pids)


def test_a_command_that_exits_leaving_a_daemon_behind_is_cleaned_up(tmp_path: Path) -> None:
    """The command starts a daemon and exits before answering: the launch fails, and the daemon is stopped."""
    from diagnose.runs.experiment import LaunchError, launch

    pidfile = tmp_path / "pids"
    code = ("import os, time\n"
            "if os.fork(): os._exit(0)\n"
            "os.setsid()\n"
            "if os.fork(): os._exit(0)\n"
            f"open({str(pidfile)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
            "time.sleep(600)\n")
    starter = tmp_path / "starter.py"
    starter.write_text("import subprocess, sys, time, os\n"
                       f"subprocess.Popen([sys.executable, '-c', {code!r}]).wait()\n"
                       f"while not os.path.exists({str(pidfile)!r}): time.sleep(0.05)\n"
                       "sys.exit(5)\n")
    with pytest.raises(LaunchError, match="exited with status 5"):
        launch([sys.executable, str(starter)], f"http://127.0.0.1:{_free_port()}", tmp_path / "s.log", timeout_s=60)
    pids = [int(x) for x in pidfile.read_text().split()]
    try:
        assert pids and not any(_alive(p) for p in pids)
    finally:
        _kill_leftovers(pids)


def test_attach_launch_stops_children_that_left_the_group_and_session(tmp_path: Path) -> None:
    port = _free_port()
    cmd, pidfile = _command(tmp_path, "setsid,detached", port)
    p = subprocess.run([sys.executable, "-m", "diagnose", "attach", "--launch", cmd, "--url",
                        f"http://127.0.0.1:{port}", "-c", "1", "-n", "4", "--baseline", "0", "--no-nvml",
                        "-o", str(tmp_path / "b")], capture_output=True, text=True, timeout=150)
    pids = [int(x) for x in pidfile.read_text().split()] if pidfile.exists() else []
    try:
        assert p.returncode == 0, p.stdout + p.stderr
        assert len(pids) == 3 and [x for x in pids if _alive(x)] == []
    finally:
        _kill_leftovers(pids)


# -- bad options ----------------------------------------------------------------------------------------------
def _one_line(r: Result) -> str:
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("diagnose: error:"), r.stderr
    return lines[0]


def _experiment(tmp_path: Path, *args: str, launch: str = "sleep 600") -> Result:
    return CliRunner().invoke(cli, ["experiment", "--launch", launch, "--url", f"http://127.0.0.1:{_free_port()}",
                                    "-o", str(tmp_path / "e"), *args])


def test_an_unbalanced_quote_in_the_launch_command_is_a_usage_error(tmp_path: Path) -> None:
    r = _experiment(tmp_path, launch="vllm serve 'my model --port 8000")
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert "--launch" in _one_line(r) and "unbalanced quote" in r.stderr
    r = CliRunner().invoke(cli, ["attach", "--launch", 'vllm serve "x', "--url", "http://127.0.0.1:9",
                                 "-o", str(tmp_path / "a")])
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert "unbalanced quote" in _one_line(r)
    assert not (tmp_path / "e").exists() and not (tmp_path / "a").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_a_startup_timeout_that_is_not_positive_seconds_is_a_usage_error(value: str, tmp_path: Path) -> None:
    r = _experiment(tmp_path, "--startup-timeout", value)
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert "--startup-timeout" in _one_line(r) and "expected seconds above 0" in r.stderr
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("value", ["max-num-seqs=4", "--max-num-seqs", "=4", "--=4", "--max num seqs=4"])
def test_a_malformed_set_is_a_usage_error(value: str, tmp_path: Path) -> None:
    r = _experiment(tmp_path, "--set", value)
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert "--set" in _one_line(r) and "--flag=VALUE" in r.stderr
    assert not (tmp_path / "e").exists()
