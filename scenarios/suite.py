"""Scenario suite: prove the diagnoses on the real vLLM CPU engine with known, injected bottlenecks.

For each scenario of scenarios/scenarios.yaml: start the engine with the scenario's flags (scenarios with
the same engine flags share one start unless --fresh-engine), inject the bottleneck (workload flags, or
busy processes pinned with taskset), run ``diagnose attach`` with its workload as a subprocess, then
``diagnose analyze BUNDLE -o BUNDLE.report.html --json BUNDLE.findings.json``, and compare the top finding with the
expected one. Prints a confusion table (expected vs top-1) and top-1 / top-3 accuracy, and writes them to
scenarios/runs/<UTC timestamp>.md (not committed) and one line in scenarios/results/runs.md.

    .venv/bin/python -m scenarios.suite [--only NAME[,NAME]] [--repeat 2] [--keep-bundles DIR]
                                        [--export-samples sample_traces] [--port-base 18600]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import psutil

from diagnose.errors import DiagnoseError
from harness.engine import SERVED_MODEL_NAME, ServerProcess, VllmServer, engine_ready
from harness.llama_server import LlamaServer, llama_ready
from scenarios.score import ScenarioResult, accuracy, confusion_markdown, findings_from_json, report_markdown
from scenarios.spec import Scenario, load_scenarios

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"  # the committed log: one line per run (runs.md)
RUNS_DIR = Path(__file__).resolve().parent / "runs"  # each run's full table and JSON (not committed)
DIAGNOSE = [sys.executable, "-m", "diagnose"]
HOG_CODE = "while True:\n    pass\n"
DEFAULT_NICE = -10
STARVED_CLIENT_OFFSET = 10  # session priority of a client starved on purpose, relative to the suite's


def session_priority(cmd: list[str], nice: int) -> list[str]:
    """``cmd`` run with its session's scheduler autogroup priority set to ``nice`` first (written before exec,
    so all it starts runs at it; with autogroups a plain nice only orders processes inside one session)."""
    return ["sh", "-c", f'echo {nice} > /proc/self/autogroup 2>/dev/null; exec "$@"', "sh", *cmd]


class NicedServer(VllmServer):
    """The engine started under ``nice -n N``: every process and thread it starts inherits the priority, so
    other tenants of a shared machine perturb the scenario less (injected hogs get the same priority)."""

    def __init__(self, nice: int, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.nice = nice

    def command(self) -> list[str]:
        cmd = super().command()
        if not self.nice:
            return cmd
        # the server is its own session (harness: start_new_session): raise the session's autogroup priority
        # before exec, so that start-up (torch.compile, minutes on a busy host) runs at it too
        return session_priority(niced(cmd, self.nice), self.nice)


class PinnedLlamaServer(LlamaServer):
    """llama-server under ``nice -n N``, every thread bound to one core (``taskset``): like vLLM's CPU worker,
    which binds itself to a core, the engine computes on ``core`` and the load client runs on the other."""

    def __init__(self, nice: int, core: int, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.nice, self.core = nice, core

    def command(self) -> list[str]:
        cmd = ["taskset", "-c", str(self.core), *super().command()]
        return session_priority(niced(cmd, self.nice), self.nice) if self.nice else cmd


LLAMA_CORE = 0  # the core llama-server computes on in the suite


def set_group_priority(pid: int | str, nice: int) -> bool:
    """Set the scheduler autogroup priority of ``pid``'s session (Linux autogroups: plain nice only orders
    processes inside one session's group, so the group's own nice is what counts against other tenants)."""
    if not nice:
        return False
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice), encoding="ascii")
        return True
    except OSError:
        return False


def niced(cmd: list[str], nice: int) -> list[str]:
    return ["nice", "-n", str(nice), *cmd] if nice else cmd


def log(msg: str) -> None:
    print(f"[suite {datetime.now(timezone.utc).strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- CPU placement ------------------------------------------------------------------------------------
def worker_core(server: ServerProcess) -> int:
    """The first core the engine's model-runner process (VLLM::Worker) is bound to (vLLM CPU pins it); for
    llama-server, the core the suite bound it to."""
    if isinstance(server, PinnedLlamaServer):
        return server.core
    procs = server.processes()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if "VLLM::Worker" in p.name() or "VLLM::Worker" in " ".join(p.cmdline()):
                return int(sorted(p.cpu_affinity())[0])
    return 0


def engine_process(server: ServerProcess, target: str) -> psutil.Process | None:
    """The engine's API-server process (``api_server``: the server's own pid) or its EngineCore process."""
    procs = server.processes()
    if target == "api_server":
        return procs[0] if procs else None
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                return p
    return None


@contextlib.contextmanager
def pinned(proc: psutil.Process, core: int) -> Iterator[int]:
    """Every thread of ``proc`` bound to ``core`` (threads it starts later inherit it); the old affinity of
    each thread is restored on exit, so a later scenario on the same engine is not pinned."""
    saved: dict[int, set[int]] = {}
    with contextlib.suppress(psutil.Error):
        for t in proc.threads():
            with contextlib.suppress(OSError):
                saved[t.id] = os.sched_getaffinity(t.id)
                os.sched_setaffinity(t.id, {core})
    try:
        yield len(saved)
    finally:
        for tid, cores in saved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cores)


def otlp_ports(port: int) -> tuple[int, int]:
    """The gRPC and HTTP ports of attach's span receiver for an engine on ``port`` (18600-18699); the engine
    exports to the gRPC one."""
    return port + 1000, port + 1100


def other_core(core: int) -> int:
    cores = sorted(psutil.Process().cpu_affinity() or [0])
    rest = [c for c in cores if c != core]
    return rest[0] if rest else core


@contextlib.contextmanager
def hogs(core: int | None, n: int, nice: int = 0) -> Iterator[list[int]]:
    """``n`` busy Python processes pinned to ``core`` (None: free to run anywhere) at priority ``nice``;
    always stopped on exit."""
    pin = ["taskset", "-c", str(core)] if core is not None else []
    procs = [subprocess.Popen(niced([*pin, sys.executable, "-c", HOG_CODE], nice),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
             for _ in range(n)]
    for p in procs:  # each hog is its own session, at the priority of the session it competes with
        set_group_priority(p.pid, nice)
    t0 = time.monotonic()
    try:
        yield [p.pid for p in procs]
    finally:
        cpu = 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = psutil.Process(p.pid).cpu_times()
                cpu += t.user + t.system
        log(f"busy processes on {'core ' + str(core) if core is not None else 'any core'} used {cpu:.1f} CPU-s in {time.monotonic() - t0:.1f} s")
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


# -- one scenario -------------------------------------------------------------------------------------
def _run(cmd: list[str], log_path: Path, timeout_s: float, new_session: bool = False) -> tuple[int, str]:
    with open(log_path, "ab") as fh:
        fh.write(("$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        try:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=timeout_s, check=False, cwd=ROOT, start_new_session=new_session)
        except subprocess.TimeoutExpired:
            return 124, f"timed out after {timeout_s:.0f} s"
    tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
    return proc.returncode, tail[0] if tail else ""


def attach_command(scn: Scenario, server: ServerProcess, bundle: Path) -> list[str]:
    cmd = [*DIAGNOSE, "attach", "--url", server.url, "--model", SERVED_MODEL_NAME, "-o", str(bundle), "--force",
           "--no-progress", *scn.attach_args]
    if "--pyspy" in scn.attach_args and server.pid is not None and "--pid" not in scn.attach_args:
        cmd += ["--pid", str(server.pid)]
    if scn.otlp:
        grpc, http = otlp_ports(server.port)
        cmd += ["--otlp", "--otlp-grpc-port", str(grpc), "--otlp-http-port", str(http)]
    return cmd


def engine_description(scn: Scenario) -> str:
    if scn.engine_kind == "llamacpp":
        return (f"taskset -c {LLAMA_CORE} llama-server -m TINY_GGUF --alias {SERVED_MODEL_NAME} --host 127.0.0.1 "
                f"-np 2 -c 4096 -t 1 --metrics --slots {' '.join(scn.engine_args)}").strip()
    env = " ".join(f"{k}={v}" for k, v in sorted({"VLLM_CPU_KVCACHE_SPACE": str(scn.kv_cache_space_gib),
                                                   **scn.engine_env}.items()))
    return (f"{env} python -m vllm.entrypoints.openai.api_server --model TINY_MODEL --served-model-name "
            f"{SERVED_MODEL_NAME} --host 127.0.0.1 --max-model-len 2048 --dtype bfloat16 {' '.join(scn.engine_args)}").strip()


def analysis_outputs(bundle: Path) -> tuple[Path, Path]:
    """Where the suite writes a bundle's report and findings: beside it, never inside it (an output never
    lands inside an input; diagnose refuses that with exit 2)."""
    return bundle.with_name(bundle.name + ".report.html"), bundle.with_name(bundle.name + ".findings.json")


def realtime_client_permitted() -> bool:
    """Whether the load client may run at real-time round-robin priority here (``chrt``, as root): how the suite
    runs it unless told otherwise, so that other tenants of the machine cannot delay its timestamps."""
    return shutil.which("chrt") is not None and os.geteuid() == 0


def run_scenario(scn: Scenario, server: ServerProcess, work: Path, repeat: int, nice: int = 0,
                 client_rt: bool = True) -> ScenarioResult:
    res = ScenarioResult(scn.name, scn.expect_top, scn.expect_top3, repeat=repeat, loadavg=os.getloadavg()[0])
    bundle = work / f"{scn.name}-r{repeat}"
    log_path = work / f"{scn.name}-r{repeat}.log"
    t0 = time.monotonic()
    wcore = worker_core(server)
    ccore = other_core(wcore)
    # Unless the scenario starves it on purpose, the load client runs at real-time round-robin priority on
    # any core, so that other tenants of the machine cannot delay its timestamps (measured here: event-loop
    # lag P99 100-1000 ms at normal priority on a loaded 2-core host, 1.6 ms this way). All its threads
    # inherit the policy: a helper thread left at normal priority can hold the GIL while preempted and stall
    # the loop, and pinning all of them to one core made the metrics parser's GIL hold show up as ~10 ms lag.
    # It uses ~10% of a core, so it takes little from the engine. Otherwise the client is pinned to a core
    # the engine's model runner is not bound to.
    attach = attach_command(scn, server, bundle)
    starve_client = scn.hog is not None and scn.hog.target in ("client", "client_near")
    if client_rt and not starve_client:
        cmd = ["chrt", "-r", "1", *attach]
    elif starve_client:
        # a client short of CPU: its own session at a lower priority than the busy processes it shares its
        # core with (at equal priority the scheduler's wake-up preference kept its loop lag at 8 ms)
        # client_near: the client at the busy processes' own priority (a client near its limit, not starved)
        assert scn.hog is not None
        weak = min(19, nice + (STARVED_CLIENT_OFFSET if scn.hog.target == "client" else scn.hog.nice_offset))
        cmd = ["taskset", "-c", str(ccore), *session_priority(attach, weak)]
    else:
        cmd = ["taskset", "-c", str(ccore), *attach]
    res.command = " ".join(attach).replace(str(bundle), "BUNDLE")
    res.engine = engine_description(scn)
    try:
        with contextlib.ExitStack() as stack:
            if scn.hog is not None:
                target = scn.hog.target
                core: int | None = {"worker": wcore, "any": None}.get(target, ccore)
                if target in ("api_server", "engine_core"):
                    proc = engine_process(server, target)
                    if proc is None:
                        res.error = f"no {target} process found in the engine's process tree"
                        return res
                    n = stack.enter_context(pinned(proc, ccore))
                    log(f"{scn.name}: {target} (pid {proc.pid}, {n} threads) pinned to core {ccore}")
                pids = stack.enter_context(hogs(core, scn.hog.procs, max(-20, min(19, nice + scn.hog.nice_offset))))
                log(f"{scn.name}: {scn.hog.procs} busy process(es) {pids} "
                    + (f"pinned to core {core}" if core is not None else "on any core")
                    + f" (worker core {wcore}, client core {ccore})")
                time.sleep(1.0)
            log(f"{scn.name}: attach ({' '.join(scn.attach_args)})")
            rc, tail = _run(niced(cmd, nice), log_path, scn.timeout_s, new_session=starve_client)
        if rc != 0 and not (bundle / "manifest.json").exists():
            res.error = f"attach exited {rc}: {tail}"
            return res
        report, findings = analysis_outputs(bundle)
        rc, tail = _run([*DIAGNOSE, "analyze", str(bundle), "-o", str(report), "--json", str(findings)],
                        log_path, 180)
        if rc not in (0, 5) or not findings.exists():  # 5: invalid run, findings written
            res.error = f"analyze exited {rc}: {tail}"
            return res
        res.findings = findings_from_json(findings)
    finally:
        res.seconds = time.monotonic() - t0
    return res


def make_server(scn: Scenario, nice: int, port: int, log_path: Path, startup_s: float) -> ServerProcess:
    """The scenario's engine (not started): vLLM's CPU build, or llama-server bound to ``LLAMA_CORE`` with one
    thread and two slots of 2,048 tokens unless the scenario's flags say otherwise (the last flag wins)."""
    if scn.engine_kind == "llamacpp":
        return PinnedLlamaServer(nice, LLAMA_CORE, port=port, extra_args=list(scn.engine_args), env=scn.engine_env,
                                 threads=1, log_path=log_path, startup_timeout_s=startup_s)
    return NicedServer(nice, port=port, extra_args=list(scn.engine_args), env=scn.engine_env,
                       otlp_traces_endpoint=(f"http://127.0.0.1:{otlp_ports(port)[0]}" if scn.otlp else None),
                       kv_cache_space_gib=scn.kv_cache_space_gib, log_path=log_path, startup_timeout_s=startup_s)


# -- the suite ----------------------------------------------------------------------------------------
def run_suite(scenarios: list[Scenario], repeats: int, work: Path, port_base: int, fresh: bool,
              server_logs: Path, nice: int = DEFAULT_NICE, restart: bool = False,
              client_rt: bool = True, startup_s: float = 600.0) -> list[ScenarioResult]:
    results: list[ScenarioResult] = []
    groups: list[list[Scenario]] = []
    for s in scenarios:
        same = next((g for g in groups if g[0].engine_key() == s.engine_key()), None) if not fresh else None
        if same is None:
            groups.append([s])
        else:
            same.append(s)
    # engine starts dominate the suite's time (30-200 s each on 2 shared cores), so by default one start
    # serves every repeat of its group; --restart-per-repeat starts the engines afresh for each repeat
    rounds = ([[(g, rep) for g in groups] for rep in range(1, repeats + 1)] if restart
              else [[(g, 0) for g in groups]])
    port = port_base
    for rnd in rounds:
        for group, rep in rnd:
            first = group[0]
            port = port_base + (port - port_base + 1) % 100
            reps = [rep] if rep else list(range(1, repeats + 1))
            server = make_server(first, nice, port, server_logs / f"engine-{first.name}-r{reps[0]}.log", startup_s)
            log(f"engine for {', '.join(s.name for s in group)}: {' '.join(first.engine_args) or '(defaults)'} "
                f"on port {port}")
            try:
                with server:
                    if server.pid is not None:
                        set_group_priority(server.pid, nice)
                    log(f"engine ready in {server.ready_s:.0f} s")
                    for r_ in reps:
                        for scn in group:
                            r = run_scenario(scn, server, work, r_, nice, client_rt)
                            results.append(r)
                            log(f"{scn.name} (run {r_}): top-1 {r.top1} (expected {r.expected or '(none)'}) "
                                f"{'OK' if r.ok1 else 'WRONG'}; top-3 {r.top3}; {r.seconds:.0f} s"
                                + (f"; {r.error}" if r.error else ""))
            except DiagnoseError as e:
                for r_ in reps:
                    for scn in group:
                        if not any(r.name == scn.name and r.repeat == r_ for r in results):
                            results.append(ScenarioResult(scn.name, scn.expect_top, scn.expect_top3,
                                                          error=str(e)[:300], repeat=r_))
                log(f"engine failed: {e}")
    return sorted(results, key=lambda r: r.repeat)


def rescore(scenarios: list[Scenario], work: Path) -> list[ScenarioResult]:
    """Analyse kept bundles (WORK/<scenario>-r<N>) again with the current rules: same captures, new verdicts."""
    results = []
    by_name = {s.name: s for s in scenarios}
    for bundle in sorted(work.glob("*-r[0-9]*")):
        name, _, rep = bundle.name.rpartition("-r")
        if name not in by_name or not rep.isdigit() or not (bundle / "manifest.json").exists():
            continue
        scn = by_name[name]
        r = ScenarioResult(name, scn.expect_top, scn.expect_top3, repeat=int(rep))
        report, findings = analysis_outputs(bundle)
        rc, tail = _run([*DIAGNOSE, "analyze", str(bundle), "-o", str(report), "--json", str(findings)],
                        work / f"{bundle.name}.log", 180)
        if rc not in (0, 5) or not findings.exists():  # 5: invalid run, findings written
            r.error = f"analyze exited {rc}: {tail}"
        else:
            r.findings = findings_from_json(findings)
        results.append(r)
    return sorted(results, key=lambda r: (r.repeat, r.name))


def log_run(stem: str, header: str, results: list[ScenarioResult]) -> None:
    """One line for this run in results/runs.md, the committed log (the full table stays in runs/)."""
    lines = header.splitlines()
    what = next((x for x in lines[1:] if x.strip() and not x.startswith("Command:")), "").strip()
    cmd = next((x for x in lines if x.startswith("Command:")), "").removeprefix("Command: ").strip()
    misses = "; ".join(f"{r.name} → {r.top1 or 'none'}" + (" (error)" if r.error else "") for r in results if not r.ok1)
    log = RESULTS_DIR / "runs.md"
    with log.open("a", encoding="utf-8") as f:
        f.write(f"| {stem} | {what.replace('|', '/')} | {cmd.replace('|', '/')} | {misses or '—'} |\n")


def export_samples(results: list[ScenarioResult], scenarios: list[Scenario], work: Path, dest: Path,
                   prefix: str) -> list[Path]:
    """Trimmed copies of the last repeat's bundles under dest/<prefix><scenario>/ (see scenarios/export.py)."""
    from scenarios.export import export_sample

    by_name = {s.name: s for s in scenarios}
    out = []
    last = max((r.repeat for r in results), default=1)
    for r in results:
        if r.repeat != last or not r.ok1:
            continue  # a sample must pass its own expectations
        bundle = work / f"{r.name}-r{r.repeat}"
        made = export_sample(bundle, dest / f"{prefix}{r.name}", by_name[r.name], r, r.command, r.engine)
        if made is None:
            log(f"{dest / (prefix + r.name)} exists and is not the suite's: left alone")
        else:
            out.append(made)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scenarios.suite", description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--repeat", type=int, default=1, help="run the whole suite this many times")
    ap.add_argument("--keep-bundles", type=Path, default=None, help="keep the bundles (and logs) in this folder")
    ap.add_argument("--export-samples", type=Path, default=None,
                    help="write trimmed bundles of the last repeat as sample folders under this directory")
    ap.add_argument("--sample-prefix", default="vllm_cpu_", help="folder-name prefix for --export-samples")
    ap.add_argument("--export-skip", default="healthy,queue_bound",
                    help="scenarios not to export (their sample folders are maintained elsewhere)")
    ap.add_argument("--port-base", type=int, default=18600)
    ap.add_argument("--fresh-engine", action="store_true", help="one engine start per scenario (no sharing)")
    ap.add_argument("--restart-per-repeat", action="store_true",
                    help="start the engines afresh for each repeat (default: one start serves all repeats)")
    ap.add_argument("--nice", type=int, default=DEFAULT_NICE,
                    help="priority of the engine, client and hogs (negative needs root; 0: leave as is)")
    ap.add_argument("--startup-timeout", type=float, default=600.0,
                    help="seconds to wait for an engine to become healthy (torch.compile on a busy 2-core host: minutes)")
    ap.add_argument("--no-client-rt", dest="client_rt", action="store_false",
                    help="run the load client at normal priority (default: SCHED_RR via chrt, when permitted)")
    ap.add_argument("--rescore", type=Path, default=None,
                    help="analyse the bundles kept in this folder again with the current rules (no engine)")
    ap.add_argument("--scenarios", type=Path, default=None, help="scenario file (default scenarios/scenarios.yaml)")
    args = ap.parse_args(argv)
    try:
        scenarios = load_scenarios(args.scenarios) if args.scenarios else load_scenarios()
        if args.only:
            want = [n.strip() for n in args.only.split(",") if n.strip()]
            unknown = sorted(set(want) - {s.name for s in scenarios})
            if unknown:
                raise DiagnoseError(f"--only: unknown scenario(s) {', '.join(unknown)}")
            scenarios = [s for s in scenarios if s.name in want]
        if shutil.which("taskset") is None and any(s.hog for s in scenarios):
            raise DiagnoseError("taskset (util-linux) is needed for the CPU-hog scenarios")
        work = args.rescore or args.keep_bundles or Path(tempfile.mkdtemp(prefix="diagnose-scenarios-"))
        work.mkdir(parents=True, exist_ok=True)
        started = datetime.now(timezone.utc)
        t0 = time.monotonic()
        if args.rescore:
            results = rescore(scenarios, work)
        else:
            kinds = {s.engine_kind for s in scenarios}
            if "vllm" in kinds and not engine_ready():
                raise DiagnoseError("the vLLM CPU engine is not built: run `bash harness/ensure_engine.sh` first")
            if "llamacpp" in kinds and not llama_ready():
                raise DiagnoseError("llama-server is not built: run `bash harness/ensure_llama.sh` first")
            nice = args.nice if args.nice >= 0 or os.geteuid() == 0 else 0
            set_group_priority("self", nice)
            client_rt = args.client_rt and realtime_client_permitted()
            results = run_suite(scenarios, max(1, args.repeat), work, args.port_base, args.fresh_engine, work,
                                nice, args.restart_per_repeat, client_rt, args.startup_timeout)
        took = time.monotonic() - t0
        a1, a3, n = accuracy(results)
        engines = " and ".join(sorted({"vLLM CPU engine" if s.engine_kind == "vllm" else "llama.cpp llama-server"
                                       for s in scenarios}))
        what = (f"re-analysis of the bundles in {work} with the current rules (no new captures)" if args.rescore
                else f"{len(scenarios)} scenarios x {max(1, args.repeat)} run(s) on the real {engines}")
        header = (f"# Scenario suite {started.strftime('%Y-%m-%d %H:%M UTC')}\n\n"
                  f"{what}, {took / 60:.1f} min. Top-1 {a1}/{n}, top-3 {a3}/{n}. Host: {os.cpu_count()} CPUs.\n\n"
                  f"Command: `python -m scenarios.suite {' '.join(argv if argv is not None else sys.argv[1:])}`")
        md = report_markdown(results, header)
        RUNS_DIR.mkdir(parents=True, exist_ok=True)
        out = RUNS_DIR / f"{started.strftime('%Y%m%dT%H%M%SZ')}.md"
        out.write_text(md, encoding="utf-8")
        log_run(out.stem, header, results)
        (out.with_suffix(".json")).write_text(json.dumps(
            [{"repeat": r.repeat, "scenario": r.name, "expected": r.expected, "top1": r.top1, "ok1": r.ok1,
              "ok3": r.ok3, "findings": r.findings, "error": r.error, "seconds": round(r.seconds, 1)}
             for r in results], indent=1), encoding="utf-8")
        print(confusion_markdown(results))
        print(f"\ntop-1 {a1}/{n}, top-3 {a3}/{n}; written to {out.relative_to(ROOT)}")
        if args.export_samples:
            skip = {n.strip() for n in args.export_skip.split(",") if n.strip()}
            for p in export_samples([r for r in results if r.name not in skip], scenarios, work,
                                    args.export_samples, args.sample_prefix):
                print(f"sample: {p}")
        if args.keep_bundles is None and args.rescore is None:
            shutil.rmtree(work, ignore_errors=True)
        return 0 if a1 == n else 1
    except DiagnoseError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
