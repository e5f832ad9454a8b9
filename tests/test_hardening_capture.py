"""Issue 12, the capture side: attach against servers that misbehave (tests/servers/faults.py, the truth server)
and a disk that fills up. Each test names the defect it keeps out; docs/robustness.md (part 2) lists them."""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from diagnose.cli import exits
from diagnose.io.bundle import MANIFEST, open_bundle
from diagnose.io.writer import BundleWriter
from tests.cli_inproc import Ran, diagnose
from tests.servers.faults import fault_server, free_port
from tests.servers.truth import truth_server

DIAG = [sys.executable, "-m", "diagnose"]
KEY = "sk-PLANTEDkey0123456789abcdef"
URL_PASSWORD = "sk-URLPASSWORD987654321"
QUERY_SECRET = "sk-QUERYSECRET1357924680"
RESERVE = ".diagnose-reserve"  # diagnose.io.bundle.RESERVE (spelled out: the test also runs against older code)


def run(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
        preexec: Any = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}  # only a planted key
    full_env.update(env or {})
    return subprocess.run([*DIAG, *args], capture_output=True, text=True, timeout=timeout, env=full_env,
                          preexec_fn=preexec)


def no_traceback(p: subprocess.CompletedProcess[str] | Ran) -> None:
    assert "Traceback" not in p.stderr and "Exception in callback" not in p.stderr, p.stderr


def attach(url: str, out: Path, *extra: str, timeout: float = 120, env: dict[str, str] | None = None,
           preexec: Any = None) -> subprocess.CompletedProcess[str]:
    return run("attach", "--url", url, "--no-nvml", "-o", str(out), *extra, timeout=timeout, env=env,
               preexec=preexec)


def analyze(bundle: Path, tmp: Path) -> tuple[Ran, dict[str, Any]]:
    p = diagnose("analyze", str(bundle), "-o", str(tmp / "r.html"), "--json", str(tmp / "f.json"))
    no_traceback(p)
    assert p.returncode in (exits.OK, exits.INVALID_RUN), p.stderr
    return p, json.loads((tmp / "f.json").read_text())


def bundle_text(d: Path) -> Iterable[tuple[Path, str]]:
    for f in sorted(d.rglob("*")):
        if f.is_file():
            yield f, f.read_bytes().decode("utf-8", "replace")


def prompt_windows(log: Path, words: int = 4) -> set[str]:
    """Every run of ``words`` consecutive words of every prompt the server received (what must not be stored)."""
    out: set[str] = set()
    for line in log.read_text().splitlines():
        ws = json.loads(line)["prompt"].split()
        out.update(" ".join(ws[i:i + words]) for i in range(0, max(0, len(ws) - words + 1)))
    return out


def count_leaks(texts: Iterable[tuple[str, str]], secrets: Iterable[str], windows: set[str]) -> dict[str, int]:
    leaks: dict[str, int] = {}
    for name, text in texts:
        flat = " ".join(re.findall(r"[^\W_]+", text))  # an echo survives JSON escaping: compare words
        n = sum(text.count(s) for s in secrets) + sum(1 for w in windows if w in flat)
        if n:
            leaks[name] = n
    return leaks


# -- defect 1: echoed secrets and prompts --------------------------------------------------------------
@pytest.mark.parametrize("mode", ["echo401", "echo_event"])
def test_planted_key_and_prompt_echoed_by_the_server_reach_no_file(tmp_path: Path, mode: str) -> None:
    log = tmp_path / "prompts.jsonl"
    with fault_server("--mode", mode, "--log", str(log)) as (url, _):
        p = attach(url, tmp_path / "b", "-c", "4", "-d", "3s", "--baseline", "2", "--report", str(tmp_path / "a.html"),
                   env={"OPENAI_API_KEY": KEY})
    no_traceback(p)
    assert p.returncode == exits.ERROR, p.stderr  # every request failed
    pa, data = analyze(tmp_path / "b", tmp_path)
    windows = prompt_windows(log)
    assert len(windows) > 50  # the server saw (and echoed) real prompts
    texts = [(str(f), t) for f, t in bundle_text(tmp_path / "b")]
    texts += [("stderr", p.stderr + p.stdout + pa.stderr + pa.stdout), ("json", (tmp_path / "f.json").read_text()),
              ("html", (tmp_path / "r.html").read_text()), ("attach html", (tmp_path / "a.html").read_text())]
    assert count_leaks(texts, [KEY], windows) == {}
    # what the server said is still there, redacted and bounded
    reqs = open_bundle(tmp_path / "b").records("requests")
    assert reqs and all("[redacted]" in r["error_detail"] and len(r["error_detail"]) <= 300 for r in reqs)
    assert any("[prompt text]" in r["error_detail"] for r in reqs)
    assert data["probes"]


# -- defect 2: a key in the URL -------------------------------------------------------------------------
def test_credentials_in_the_url_are_used_but_never_stored(tmp_path: Path) -> None:
    log = tmp_path / "seen.jsonl"
    with fault_server("--mode", "ok", "--log", str(log)) as (url, _):
        host = url.removeprefix("http://")
        given = f"http://user:{URL_PASSWORD}@{host}/?api_key={QUERY_SECRET}&region=eu"
        p = attach(given, tmp_path / "b", "-c", "2", "-d", "2s", "--baseline", "2")
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    b = open_bundle(tmp_path / "b")
    assert b.manifest["target"]["url"] == f"http://{host}?api_key=[redacted]&region=eu"
    reqs = b.records("requests")
    assert len(reqs) > 5 and all(r["ok"] for r in reqs)  # the query did not mangle the endpoint path
    seen = [json.loads(x) for x in log.read_text().splitlines()]
    assert seen and all(s["query"] == {"api_key": QUERY_SECRET, "region": "eu"} for s in seen)
    assert all(s["path"] == "/v1/completions" for s in seen)
    assert all(s["auth"].startswith("Basic ") for s in seen)  # userinfo became basic auth
    texts = [(str(f), t) for f, t in bundle_text(tmp_path / "b")] + [("stderr", p.stderr)]
    assert count_leaks(texts, [URL_PASSWORD, QUERY_SECRET, "user:"], set()) == {}


def test_redactor_units() -> None:
    from diagnose.capture.redact import Redactor, excerpt, join_url, safe_url, scrub_text

    r = Redactor([KEY])
    s = r.text(f'Authorization: Bearer {KEY} x-api-key=abc123 {{"password": "hunter22"}} http://a:b@h/ sk-otherkey99')
    assert KEY not in s and "abc123" not in s and "hunter22" not in s and "a:b@" not in s and "otherkey99" not in s
    assert join_url("http://h:1/base?k=v", "/v1/models") == "http://h:1/base/v1/models?k=v"
    assert safe_url("http://u:p@h:1/?token=t&a=1") == "http://h:1/?token=[redacted]&a=1"
    prompt = "the of and to in is that for it as with was on be"
    assert scrub_text(f'bad request "{prompt[:30]}', [prompt]) == 'bad request "[prompt text]'
    assert scrub_text("the model is not loaded", [prompt]) == "the model is not loaded"  # no 3-word run
    assert len(excerpt("x" * 5000)) == 300


# -- defect 3: disk full ------------------------------------------------------------------------------------
def _enospc_after(limit: int) -> Any:
    real = os.write
    state = {"n": 0}

    def write(fd: int, data: Any) -> int:
        state["n"] += len(data)
        if state["n"] > limit:
            raise OSError(28, "No space left on device")
        return real(fd, data)

    return write


def test_enospc_at_the_write_layer_keeps_whole_records_and_marks_the_capture_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import diagnose.io.bundle as bundle_mod

    bw = BundleWriter(tmp_path / "b")
    errors: list[str] = []
    bw.on_write_error = errors.append
    sw = bw.stream("requests")
    sw.write_many([{"rid": i, "pad": "x" * 100} for i in range(10)])
    monkeypatch.setattr(bundle_mod.os, "write", _enospc_after(500))
    for i in range(10, 40):
        sw.write({"rid": i, "pad": "x" * 100})  # the disk fills: never raises
    bw.set_probe_status(bundle_mod.ProbeStatus("load", "ok"))  # a manifest write that fails: noted, not raised
    monkeypatch.undo()
    bw.finish()
    assert len(errors) == 1 and "No space left on device" in errors[0] and str(tmp_path / "b") in errors[0]
    b = open_bundle(tmp_path / "b")
    recs = b.records("requests")
    assert [r["rid"] for r in recs] == list(range(len(recs))) and len(recs) >= 10  # whole records only
    assert b.manifest["streams"]["requests"]["records"] == len(recs)
    assert not b.warnings[1:]  # no torn line (only the partial-capture note)
    cap = b.manifest["capture"]
    assert cap["complete"] is False and "capture failed" in cap["interrupted"] and "No space" in cap["error"]
    assert sorted(x.name for x in (tmp_path / "b").iterdir()) == ["artifacts", MANIFEST, "requests.jsonl"]


def _mount_tmpfs(d: Path, size: str) -> bool:
    d.mkdir()
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                          capture_output=True).returncode == 0


def test_disk_full_during_attach_one_line_and_a_failed_manifest(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "2m"):
        pytest.skip("cannot mount a tmpfs here (not root): the ENOSPC injection test covers the write layer")
    try:
        with truth_server(ttft_ms=1, itl_ms=0.2) as (url, _):
            p = attach(url, disk / "b", "-c", "8", "-d", "60s", "--output-tokens", "512", "--baseline", "0",
                       timeout=120)
        no_traceback(p)
        assert p.returncode == exits.ERROR, p.stderr
        lines = [ln for ln in p.stderr.splitlines() if "No space left on device" in ln]
        assert len(lines) == 1 and str(disk / "b") in lines[0], p.stderr
        b = open_bundle(disk / "b")
        cap = b.manifest["capture"]
        assert cap["complete"] is False and "No space left on device" in cap["interrupted"]
        assert b.manifest["probes"]["load"]["state"] != "running"
        names = {x.name for x in (disk / "b").iterdir()}
        assert not [n for n in names if n.endswith(".tmp") or n == RESERVE], names
        for name in ("requests", "chunks"):
            assert b.manifest["streams"][name]["records"] == len(b.records(name)) > 0
        assert not [w for w in b.warnings if "unreadable" in w]
        analyze(disk / "b", tmp_path)
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


# -- defect 11: every request fails ---------------------------------------------------------------------
@pytest.mark.parametrize(("status", "retry_after"), [(401, None), (429, "1"), (500, None)])
def test_every_request_failing_stops_the_load_and_the_verdict_names_the_server(
        tmp_path: Path, status: int, retry_after: str | None) -> None:
    log = tmp_path / "seen.jsonl"
    extra = ["--retry-after", retry_after] if retry_after else []
    with fault_server("--mode", "status", "--status", str(status), "--log", str(log), *extra) as (url, _):
        p = attach(url, tmp_path / "b", "-c", "8", "-d", "4s", "--baseline", "0", "--warmup", "0")
    no_traceback(p)
    assert p.returncode == exits.ERROR, p.stderr
    sent = len(log.read_text().splitlines())
    assert sent <= 80, sent  # was 17-26 thousand in 4 s
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("capture failed: load:") and f"HTTP {status}" in last, p.stderr
    b = open_bundle(tmp_path / "b")
    load = b.manifest["probes"]["load"]
    assert load["state"] == "failed" and f"HTTP {status}" in load["reason"]
    if retry_after:
        assert load["detail"]["retry_after_holds"] > 0 and sent < 50  # 8 in flight, then a 1 s pause each
    _, data = analyze(tmp_path / "b", tmp_path)
    assert data["verdict"].startswith("Run invalid: the server answered every request with an error"), data["verdict"]
    assert "client was the bottleneck" not in data["verdict"]


# -- defect 12: the client's own file-descriptor limit ---------------------------------------------------------
def _nofile(soft: int, hard: int) -> Any:
    def f() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return f


def test_fd_limit_below_the_concurrency_is_the_clients_own_and_caught_before_starting(tmp_path: Path) -> None:
    with truth_server() as (url, _):
        p = attach(url, tmp_path / "b", "-c", "1024", "-d", "2s", preexec=_nofile(256, 256))
    no_traceback(p)
    assert p.returncode == exits.USAGE, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert "open files" in line and "ulimit -n" in line and "not the server's" in line, p.stderr
    assert not (tmp_path / "b").exists()


def test_fd_soft_limit_is_raised_when_the_hard_limit_allows(tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"hard open-file limit {hard} here")
    with truth_server() as (url, _):
        p = attach(url, tmp_path / "b", "-c", "300", "-d", "2s", "--baseline", "0", "--output-tokens", "4",
                   "--no-metrics", preexec=_nofile(128, 1024 if hard == resource.RLIM_INFINITY else hard))
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    assert "raised this process's open-file limit from 128" in p.stderr
    reqs = open_bundle(tmp_path / "b").records("requests")
    assert reqs and not [r for r in reqs if not r["ok"]]


def test_emfile_is_named_as_the_clients_limit() -> None:
    from diagnose.probes.http_client import CLIENT_LIMIT, client_fd_limit_detail

    d = client_fd_limit_detail(OSError(24, "Too many open files"))
    assert d.startswith(CLIENT_LIMIT) and "ulimit -n" in d and "not the server's" in d


# -- defect 13: py-spy on the right processes ------------------------------------------------------------------
def _ctx(tmp_path: Path) -> Any:
    import asyncio

    from diagnose.probes.base import CaptureContext, Target

    return CaptureContext(bundle=BundleWriter(tmp_path / "b"), target=Target(url="http://127.0.0.1:9"),
                          stop=asyncio.Event())


def test_pyspy_on_a_native_server_records_the_proc_counters_and_says_so(tmp_path: Path) -> None:
    """A native server (llama.cpp's llama-server; here `sleep`): py-spy samples Python only, so the probe records
    the threads' CPU and run-queue wait from /proc instead of stacks, and its reason says so."""
    from diagnose.probes.pyspy import PySpyProbe

    sleeper = subprocess.Popen(["sleep", "30"])
    ctx = _ctx(tmp_path)
    probe = PySpyProbe(pid=sleeper.pid, cpu_interval_s=0.2)

    async def go() -> Any:
        ok, why = probe.available(ctx)
        assert ok, why
        task = asyncio.create_task(probe.run(ctx))
        await asyncio.sleep(1.0)
        ctx.stop.set()
        return await task

    try:
        st = asyncio.run(go())
    finally:
        sleeper.kill()
        sleeper.wait()
    ctx.bundle.finish()
    assert st.state == "ok" and st.reason.startswith(f"py-spy does not apply: PID {sleeper.pid} is a native process "
                                                     "(sleep)"), st.reason
    assert st.detail["native"] and not st.detail["stacks"]
    recs = [json.loads(line) for line in (tmp_path / "b" / "host_samples.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in recs} >= {"process", "thread_cpu"}
    assert not list((tmp_path / "b").glob("artifacts/pyspy_*"))


def test_engine_tree_never_holds_diagnose_itself() -> None:
    # a Python "server" whose child is the capturing process: the tree from the server must leave it out
    code = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
            "'import json, os; from diagnose.probes.host_procs import engine_tree; "
            "print(json.dumps([os.getpid(), [p.pid for p in engine_tree(os.getppid())]]))'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    me, tree = json.loads(out.stdout)
    assert tree and me not in tree


def test_pyspy_reason_is_its_error_line_not_a_backtrace_fragment() -> None:
    from diagnose.probes.pyspy import PTRACE_FIX, _explain

    err = ("Error: Failed to find python version from target process\n\nStack backtrace:\n"
           "   0: anyhow::error::<impl anyhow::Error>::msg\n   6: std::sys::thread::unix::Thread::new::thread_start\n")
    why = _explain(err)
    assert why == "py-spy failed: Failed to find python version from target process"
    assert PTRACE_FIX not in _explain("Error: cannot ptrace-attach: no such process (os error 3)")


# -- defect 14: a huge /metrics --------------------------------------------------------------------------
def test_huge_metrics_is_cut_at_the_scrape_limit_with_the_reason(tmp_path: Path) -> None:
    with fault_server("--mode", "ok", "--metrics-mb", "12") as (url, _):
        p = attach(url, tmp_path / "b", "-c", "2", "-d", "3s", "--baseline", "0", timeout=90)
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    st = open_bundle(tmp_path / "b").manifest["probes"]["prometheus"]
    assert st["state"] == "unavailable" and "scrape limit" in st["reason"], st
    assert "interrupted" not in st["reason"]


# -- defect 15: --observe and a dying server --------------------------------------------------------------
def _wait_lines(path: Path, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"{path}: fewer than {n} records after {timeout} s")


def test_observe_notices_the_server_dying(tmp_path: Path) -> None:
    with fault_server("--mode", "ok") as (url, server):
        proc = subprocess.Popen([*DIAG, "attach", "--url", url, "--no-nvml", "-o", str(tmp_path / "b"), "--observe",
                                 "-d", "60s", "--metrics-interval", "0.25s"], stderr=subprocess.PIPE, text=True)
        _wait_lines(tmp_path / "b" / "metrics.jsonl", 3)
        server.kill()  # gone at once, as a crashed server is
        t_kill = time.time_ns()
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err
    assert proc.returncode == exits.ERROR, err
    assert "stopped answering" in err.strip().splitlines()[-1], err
    b = open_bundle(tmp_path / "b")
    assert "stopped answering" in b.manifest["capture"]["interrupted"]
    st = b.manifest["probes"]["prometheus"]
    assert st["state"] == "failed" and st["detail"]["server_gone"] and st["detail"]["scrapes_ok"] >= 3
    assert b.manifest["capture"]["ended_unix_ns"] - t_kill < 30e9  # ended when the server went, not after 60 s
    p2, _ = analyze(tmp_path / "b", tmp_path)
    assert "stopped answering" in p2.stdout + p2.stderr


# -- defect 16: a dead OTLP collector ------------------------------------------------------------------------
def test_dead_otlp_collector_is_one_line_and_a_failed_probe(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"
    with truth_server() as (url, _):
        p = attach(url, tmp_path / "b", "-c", "2", "-d", "2s", "--baseline", "0", "--otlp-export", dead)
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    mentions = [ln for ln in p.stderr.splitlines() if "127.0.0.1" in ln and "v1/traces" in ln]
    assert len(mentions) == 1 and "unreachable" in mentions[0], p.stderr
    assert not [ln for ln in p.stderr.splitlines() if "Transient error" in ln or "Failed to export" in ln]
    st = open_bundle(tmp_path / "b").manifest["probes"]["otel_export"]
    assert st["state"] == "failed" and "unreachable" in st["reason"] and st["detail"]["exported"] == 0


# -- defect 18: /v1/models answering 500 --------------------------------------------------------------------------
def test_models_endpoint_error_is_reported_as_its_status(tmp_path: Path) -> None:
    with fault_server("--models-status", "500") as (url, _):
        p = attach(url, tmp_path / "b", "-c", "2", "-d", "2s")
    no_traceback(p)
    assert p.returncode == exits.TARGET, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert "answered HTTP 500" in line and "lists no model" not in line, p.stderr


# -- defect 20: a stalled stream cannot hang the capture ------------------------------------------------------
def test_stalled_streams_time_out_and_in_flight_is_counted_right(tmp_path: Path) -> None:
    with fault_server("--mode", "stall", "--stall-every", "4", "--tokens", "6", "--itl-ms", "20") as (url, _):
        # the capture hung for ~115 s here before the fix: the subprocess timeout fails it
        p = attach(url, tmp_path / "b", "-c", "8", "-d", "6s", "--timeout", "2s", "--baseline", "0",
                   "--no-metrics", timeout=60)
    no_traceback(p)
    assert p.returncode == 0, p.stderr
    b = open_bundle(tmp_path / "b")
    reqs = b.records("requests")
    timed_out = [r for r in reqs if r["error"] == "timeout"]
    assert len(timed_out) >= 8
    assert all((r["end_ns"] - r["sent_ns"]) / 1e9 < 10 for r in timed_out)  # 2 s timeout, not minutes
    inflight = sorted(h["in_flight"] for h in b.records("client_health")[5:-5])
    assert inflight and inflight[len(inflight) // 2] >= 7, inflight  # c=8: was read as about half


# -- defect 21: --store-text bundles are private ----------------------------------------------------------------
def test_store_text_bundle_is_owner_only(tmp_path: Path) -> None:
    with truth_server() as (url, _):
        p = attach(url, tmp_path / "b", "-c", "2", "-d", "1s", "--baseline", "0", "--store-text")
    assert p.returncode == 0, p.stderr
    b = tmp_path / "b"
    assert open_bundle(b).records("requests")[0].get("prompt_text")
    for f in [b, *b.rglob("*")]:
        mode = stat.S_IMODE(f.stat().st_mode)
        assert mode == (0o700 if f.is_dir() else 0o600), (f, oct(mode))


# -- server killed mid-capture, Ctrl-C, SIGTERM ---------------------------------------------------------------
def test_server_killed_mid_capture_keeps_every_finished_request(tmp_path: Path) -> None:
    with fault_server("--mode", "ok", "--itl-ms", "5") as (url, server):
        proc = subprocess.Popen([*DIAG, "attach", "--url", url, "--no-nvml", "-o", str(tmp_path / "b"), "-c", "4",
                                 "-d", "60s", "--baseline", "0", "--metrics-interval", "0.25s"],
                                stderr=subprocess.PIPE, text=True)
        _wait_lines(tmp_path / "b" / "requests.jsonl", 10)
        server.kill()
        _, err = proc.communicate(timeout=90)
    assert "Traceback" not in err
    assert proc.returncode == exits.ERROR, err
    assert "stopped accepting connections" in err.strip().splitlines()[-1], err
    b = open_bundle(tmp_path / "b")
    reqs = b.records("requests")
    assert sum(r["ok"] for r in reqs) >= 10 and b.manifest["streams"]["requests"]["records"] == len(reqs)
    assert b.manifest["probes"]["load"]["state"] == "failed"
    analyze(tmp_path / "b", tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_with_stalled_requests_in_flight_keeps_a_valid_bundle(tmp_path: Path, sig: signal.Signals) -> None:
    with fault_server("--mode", "stall", "--stall-every", "2", "--itl-ms", "10") as (url, _):
        proc = subprocess.Popen([*DIAG, "attach", "--url", url, "--no-nvml", "-o", str(tmp_path / "b"), "-c", "4",
                                 "-d", "60s", "--baseline", "0", "--timeout", "30s"],
                                stderr=subprocess.PIPE, text=True)
        _wait_lines(tmp_path / "b" / "requests.jsonl", 2)  # some finished; the stalled ones stay in flight
        time.sleep(0.5)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err
    assert proc.returncode == exits.INTERRUPTED, err
    b = open_bundle(tmp_path / "b")
    assert b.partial and sig.name in (b.manifest["capture"]["interrupted"] or "")
    reqs = b.records("requests")
    assert any(r["ok"] for r in reqs) and any(r["error"] == "incomplete" for r in reqs)
    analyze(tmp_path / "b", tmp_path)
