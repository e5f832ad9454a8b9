"""diagnose experiment: which flag it changes and how, what it refuses to run, and its one-line errors."""

from __future__ import annotations

import http.server
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from diagnose.cli import exits
from diagnose.cli.main import cli
from diagnose.runs.experiment import LaunchError, apply_flag, launch, plan

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"
CMD = ["vllm", "serve", "m", "--port", "8000", "--max-num-seqs", "2", "--enforce-eager"]


def test_apply_flag_replaces_adds_and_removes() -> None:
    assert apply_flag(CMD, "--max-num-seqs", "16") == [*CMD[:6], "16", "--enforce-eager"]
    assert apply_flag(["x", "--max-num-seqs=2"], "--max-num-seqs", "16") == ["x", "--max-num-seqs", "16"]
    assert apply_flag(["x"], "--max-num-batched-tokens", "4096") == ["x", "--max-num-batched-tokens", "4096"]
    assert apply_flag(CMD, "--enforce-eager (remove)", "on") == CMD[:-1]
    assert apply_flag(["x"], "--enable-prefix-caching", "on") == ["x", "--enable-prefix-caching"]
    assert apply_flag(["x", "--enable-prefix-caching"], "--enable-prefix-caching", "off") == ["x"]


def test_plan_changes_the_top_findings_engine_flag() -> None:
    p, why = plan(SAMPLES / "vllm_cpu_queue_bound", CMD)
    assert why == "" and p is not None
    assert (p.finding, p.variable, p.flag, p.value) == ("SCH001", "max_num_seqs", "--max-num-seqs", "16")
    assert p.argv_after == [*CMD[:6], "16", "--enforce-eager"]
    # a chosen flag instead of the finding's variable (to test a variable that is not the cause)
    q, _ = plan(SAMPLES / "vllm_cpu_queue_bound", CMD, override=("--max-num-batched-tokens", "4096"))
    assert q is not None and q.argv_after[-2:] == ["--max-num-batched-tokens", "4096"]


def test_plan_refuses_what_it_cannot_set() -> None:
    p, why = plan(SAMPLES / "vllm_cpu_queue_bound", CMD, finding="TRC001")
    assert p is None and "did not fire" in why
    p2, why2 = plan(SAMPLES / "vllm_cpu_host_contention", CMD)  # its top cause is a deployment change
    assert p2 is None and "does not change for you" in why2, why2


def test_launch_reports_a_command_that_exits(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="exited with status 3"):
        launch([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], "http://127.0.0.1:9",
               tmp_path / "s.log", timeout_s=20)
    with pytest.raises(LaunchError, match="cannot start the server command"):
        launch(["/nonexistent/server"], "http://127.0.0.1:9", tmp_path / "t.log", timeout_s=5)


@pytest.fixture
def busy_port() -> Iterator[int]:
    srv = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()


def test_experiment_never_touches_a_server_it_did_not_start(busy_port: int, tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["experiment", "--launch", "true", "--url", f"http://127.0.0.1:{busy_port}",
                                 "-o", str(tmp_path / "e")])
    assert r.exit_code == exits.ERROR and "already answers" in r.output, r.output
    assert not (tmp_path / "e").exists()


def test_experiment_with_a_failing_server_command_is_one_line(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["experiment", "--launch", f"{sys.executable} -c 'raise SystemExit(4)'",
                                 "--url", "http://127.0.0.1:9", "-o", str(tmp_path / "e"), "--startup-timeout", "20"])
    assert r.exit_code == exits.TARGET and "exited with status 4" in r.output, r.output
    assert "Traceback" not in r.output


def test_plan_refuses_an_invalid_first_run() -> None:
    p, why = plan(SAMPLES / "vllm_cpu_client_bound", CMD)
    assert p is None and why.startswith("the first run is invalid"), why


def test_an_invalid_run_is_repeated_once_and_recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import types

    import diagnose.pipeline as pipeline
    import diagnose.runs.experiment as er

    captures: list[Path] = []
    monkeypatch.setattr(er, "capture", lambda argv, url, out, args, log, t, w: captures.append(out))
    verdicts = iter([False, True, False, False])

    def fake_analyze(path: Path) -> object:
        valid = next(verdicts)
        return types.SimpleNamespace(run_valid=valid, verdict=types.SimpleNamespace(headline="Run invalid: client"))

    monkeypatch.setattr(pipeline, "analyze", fake_analyze)
    logged: list[str] = []
    assert er.valid_capture(["x"], "http://h", tmp_path / "before", [], logged.append, 1) == ["Run invalid: client"]
    assert len(captures) == 2 and "repeating this run once" in logged[0]
    # still invalid after the repeat: kept, both reasons recorded, no third try
    assert er.valid_capture(["x"], "http://h", tmp_path / "after", [], logged.append, 1) == ["Run invalid: client"] * 2
    assert len(captures) == 4


def test_sigterm_stops_the_server_it_started(tmp_path: Path) -> None:
    """`diagnose experiment` killed with SIGTERM mid-capture stops the server it launched (no orphan)."""
    import os
    import signal
    import subprocess
    import time

    import psutil

    from tests.servers.truth import free_port

    port = free_port()
    server = Path(__file__).resolve().parent / "servers" / "truth_server.py"
    cmd = f"{sys.executable} {server} --port {port} --no-uvloop"
    p = subprocess.Popen([sys.executable, "-m", "diagnose", "experiment", "--launch", cmd, "--url",
                          f"http://127.0.0.1:{port}", "-o", str(tmp_path / "e"), "--", "--concurrency", "1",
                          "--duration", "60s", "--no-nvml"], stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    pid = None
    deadline = time.monotonic() + 60
    while pid is None and time.monotonic() < deadline:
        line = p.stderr.readline()
        if "started:" in line and "(pid " in line:
            pid = int(line.split("(pid ")[1].split(",")[0])
    assert pid is not None and psutil.pid_exists(pid)
    time.sleep(3)  # the capture is running against it
    os.kill(p.pid, signal.SIGTERM)
    assert p.wait(60) == exits.INTERRUPTED
    gone = time.monotonic() + 40
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < gone:
        time.sleep(0.2)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_warmup_args_keep_the_load_shape_and_nothing_else() -> None:
    import diagnose.runs.experiment as er

    args = ["--concurrency", "8", "--duration", "12s", "--input-tokens=128", "--output-tokens", "32", "--realtime",
            "--pyspy", "--profile-iterations", "5", "-n", "40", "--slo", "ttft_p99<500ms", "--no-ignore-eos"]
    w = er.warmup_args(args, 10)
    assert w == ["--concurrency", "8", "--input-tokens=128", "--output-tokens", "32", "--realtime", "--no-ignore-eos",
                 "--duration", "10s", "--baseline", "0", "--warmup", "0", "--no-nvml"]


def test_capture_warms_the_fresh_server_before_measuring(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The warm-up run goes to <out>-warmup, against the same server, before the measured one; the server is
    stopped once, after both."""
    import subprocess
    import types

    import diagnose.runs.experiment as er

    events: list[str] = []
    server = types.SimpleNamespace(stop=lambda: events.append("stop"))
    monkeypatch.setattr(er, "launch", lambda *a, **k: events.append("launch") or server)

    def fake_run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        events.append(Path(argv[argv.index("-o") + 1]).name + (" 5s" if "5s" in argv else ""))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(er.subprocess, "run", fake_run)
    logged: list[str] = []
    er.capture(["srv"], "http://h", tmp_path / "before", ["-c", "4"], logged.append, 1, warmup_s=5)
    assert events == ["launch", "before-warmup 5s", "before", "stop"]
    assert "warm-up: 5 s" in logged[0]
    events.clear()
    er.capture(["srv"], "http://h", tmp_path / "after", ["-c", "4"], logged.append, 1, warmup_s=0)
    assert events == ["launch", "after", "stop"]


# -- attach --launch [--verify] ------------------------------------------------------------------------------
def test_attach_launch_starts_captures_and_stops_its_own_server(tmp_path: Path) -> None:
    import shlex
    import socket
    import subprocess

    from tests.servers.faults import free_port

    port = free_port()
    cmd = shlex.join([sys.executable, str(Path(__file__).parent / "servers" / "faults.py"), "--port", str(port),
                      "--tokens", "8"])
    p = subprocess.run([sys.executable, "-m", "diagnose", "attach", "--launch", cmd, "--url",
                        f"http://127.0.0.1:{port}", "-c", "2", "-n", "12", "--baseline", "2", "--no-nvml",
                        "-o", str(tmp_path / "b"), "--report", str(tmp_path / "r.html")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "started: " in p.stderr and (tmp_path / "b" / "manifest.json").is_file() and (tmp_path / "r.html").is_file()
    assert (tmp_path / "b-server.log").is_file()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass  # stopped with the capture: nothing answers any more


def test_attach_verify_needs_launch_and_never_touches_a_running_server(busy_port: int, tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["attach", "--url", "http://127.0.0.1:9", "--verify", "-o", str(tmp_path / "v")])
    assert r.exit_code == exits.USAGE and "--verify needs --launch" in r.output, r.output
    for extra in ([], ["--verify"]):
        r = CliRunner().invoke(cli, ["attach", "--launch", "true", "--url", f"http://127.0.0.1:{busy_port}",
                                     *extra, "-o", str(tmp_path / "e")])
        assert r.exit_code == exits.ERROR and "already answers" in r.output, r.output
        assert not (tmp_path / "e").exists()


def test_attach_launch_verify_runs_the_experiment_flow(tmp_path: Path) -> None:
    """--launch --verify is `diagnose experiment`: the first run captured on the server it started, the top
    finding's experiment planned from it and recorded, then run (this test server ignores an engine flag
    added to its command line) or, for a variable that is no engine flag, 'inconclusive: not run' (exit 8).
    Which finding leads depends on the host (CI: LAT001, --max-num-seqs; here once: host contention)."""
    import shlex
    import subprocess

    from tests.servers.faults import free_port

    port = free_port()
    cmd = shlex.join([sys.executable, str(Path(__file__).parent / "servers" / "faults.py"), "--port", str(port),
                      "--tokens", "8", "--slots", "1", "--first-ms", "30"])
    p = subprocess.run([sys.executable, "-m", "diagnose", "attach", "--launch", cmd, "--url",
                        f"http://127.0.0.1:{port}", "--verify", "-c", "4", "-n", "16", "--baseline", "2", "--no-nvml",
                        "-o", str(tmp_path / "x")], capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, exits.REFUTED, exits.INCONCLUSIVE), p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    from tests.json_docs import check_document

    rec = check_document("experiment", tmp_path / "x" / "experiment.json")  # docs/json-schemas.md
    assert rec["launch"] == shlex.split(cmd) and rec["attach_args"][:2] == ["--concurrency", "4"], rec
    assert (tmp_path / "x" / "before" / "manifest.json").is_file()
    if "not_run" in rec:
        assert p.returncode == exits.INCONCLUSIVE and p.stdout.startswith("inconclusive: not run: "), p.stdout
    else:  # the one flag changed, the same workload captured again, and verified
        assert rec["launch_after"] != rec["launch"] and (tmp_path / "x" / "after" / "manifest.json").is_file()
        ver = check_document("verification", tmp_path / "x" / "verify.json")
        assert ver["outcome"] in ("confirmed", "refuted", "inconclusive") and ver["finding"] == rec["finding"]
