"""`diagnose compare` and `diagnose verify` on real vLLM CPU captures (marker: engine): an A/A pair of the same
setting, and a pair that differs in one flag (--max-num-seqs 2 -> 8 under a queue-bound load)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.engine import VllmServer
from tests.conftest import with_eager
from tests.engine.evidence import analyzed_evidence, runs_evidence

pytestmark = pytest.mark.engine

DIAG = [sys.executable, "-m", "diagnose"]
LOAD = ["--concurrency", "8", "--duration", "12s", "--input-tokens", "128", "--output-tokens", "32"]


def _attach(url: str, out: Path, *extra: str, load: Sequence[str] = LOAD) -> None:
    p = subprocess.run([*DIAG, "attach", "--url", url, "--no-nvml", "--realtime", "-o", str(out), *load, *extra],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


def _warm(url: str, out: Path, load: Sequence[str]) -> None:
    """The same load on the freshly started server, not compared: a cold engine (first-seen batch shapes)
    runs slower than a warm one, and the A/A pair must differ in nothing (as `experiment` does)."""
    _attach(url, out, "--baseline", "0", "--warmup", "0", load=load)


# The closed loop at c=8 of LOAD, with output lengths that vary (seeded: the same sequence in every capture).
# With every output exactly 32 tokens the two batch slots of --max-num-seqs 2 lock into one of two regimes that
# persist for a whole run: staggered (each admission's prefill stalls the other request's decode, >50 ms token
# gaps every 0.35 s) or in step (both finish together, no stall). CI met one of each in an A/A pair: ITL P99 102
# vs 19 ms, TPOT P50 -24%, a real difference the intervals rightly found. Varied lengths keep the slots from
# locking. (A workload file of 64 requests all due at once, sent 8 at a time, did the same before length
# distributions existed; the tool reads such a file as one burst of 64 arrivals, an open loop, and SCH008 then
# took SCH001's place: not what this test is about.)
VARIED = ["--concurrency", "8", "--duration", "12s", "--input-tokens", "128", "--output-tokens", "uniform:min=24,max=40"]


def _backlog(path: Path, n: int = 64) -> list[str]:
    """A warm-up bounded by count, not time: ``n`` requests all due at once (128 prompt tokens, 24-40 output
    tokens, seeded), sent 8 at a time. A 12 s warm-up at c=8 served 9 requests on a slow, loaded host, and
    compare rightly called the next capture's server cold beside the second's (162 served before it)."""
    import random

    rng = random.Random(5)
    rows = [{"diagnose_workload": 1, "block_tokens": 16}]
    rows += [{"offset_s": 0.0, "input_tokens": 128, "output_tokens": rng.randint(24, 40)} for _ in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["--workload", str(path), "--max-concurrency", "8", "--duration", "120s"]


# The compared captures run their level three times (attach --repeat): compare resamples the runs first, so a
# host that slowed for part of one capture widens its interval instead of reading as a change (CI once had a2
# 15-28% slower across its loaded phase with its concurrency-1 reference within 3%). The warm-up runs once.
REPEAT = ("--repeat", "3")


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DIAG, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def capped(engine_built: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """One --max-num-seqs 2 server (eager) for this module's tests that attach to it (compare/verify and the
    goodput search): started by whichever of them runs first, stopped after the module, one start instead
    of two (~40 s on 2 idle cores, more on a loaded one). Each test warms it with its own load first (_warm):
    the batch shapes it will see are compiled and its prompts (seed 0, as in every capture here) are in the
    prefix cache before it measures, as on a fresh server, whichever test ran on it before."""
    server = VllmServer(log_path=tmp_path_factory.mktemp("capped") / "server.log",
                        extra_args=with_eager(["--max-num-seqs", "2"]))
    with server:
        yield server


@pytest.mark.timeout(900)
def test_compare_and_verify_on_real_captures(capped: VllmServer, start_vllm: Callable[..., object],
                                             tmp_path: Path) -> None:
    load = VARIED
    _warm(capped.url, tmp_path / "warm-a", _backlog(tmp_path / "warm.jsonl"))
    _attach(capped.url, tmp_path / "a1", *REPEAT, load=load)
    _attach(capped.url, tmp_path / "a2", *REPEAT, load=load)
    # A/A: the same setting twice in a row
    p = _run("compare", str(tmp_path / "a1"), str(tmp_path / "a2"), "--json", str(tmp_path / "aa.json"))
    assert p.returncode == 0, p.stderr
    aa = json.loads((tmp_path / "aa.json").read_text())
    drifted: list[str] = []
    while aa["comparability"]["host_drift"] and len(drifted) < 2:
        # compare itself saw the host change speed: with no setting changed, the engine spent more (or
        # less) CPU per output token over the measured runs than the noise band, every run of one beyond every
        # run of the other (CI once met +39%, every latency 40-48% worse): an A/A pair then measures the host, not compare.
        # The tool said so (checked here); the pair is captured again (at most twice more).
        assert "CPU time per output token" in p.stdout, p.stdout
        drifted += aa["comparability"]["host_drift"]
        _attach(capped.url, tmp_path / "a1", "--force", *REPEAT, load=load)
        _attach(capped.url, tmp_path / "a2", "--force", *REPEAT, load=load)
        p = _run("compare", str(tmp_path / "a1"), str(tmp_path / "a2"), "--json", str(tmp_path / "aa.json"))
        assert p.returncode == 0, p.stderr
        aa = json.loads((tmp_path / "aa.json").read_text())
    raised = start_vllm(extra_args=["--max-num-seqs", "8"])
    _warm(raised.url, tmp_path / "warm-b", _backlog(tmp_path / "warm.jsonl"))  # type: ignore[attr-defined]
    _attach(raised.url, tmp_path / "b", *REPEAT, load=load)  # type: ignore[attr-defined]

    assert aa["comparability"]["comparable"] and aa["comparability"]["changed"] == []
    assert [(lv["runs_a"], lv["runs_b"]) for lv in aa["levels"]] == [(3, 3)], aa["levels"]
    assert len(aa["levels"][0]["spread_a"]["ttft_p50"]["values"]) == 3
    judged = [m for lv in aa["levels"] for m in lv["metrics"]
              if m["verdict"] in ("better", "worse", "within noise", "no significant change")]
    same = [m for m in judged if m["verdict"] in ("no significant change", "within noise")]
    assert len(judged) >= 8
    # the mechanism: on an A/A pair compare calls nothing better or worse unless it says the host moved (a
    # host that ran at another speed through all three pairs is named in each; the verdicts are then the
    # host's, and compare reports them as such)
    if not aa["comparability"]["host_drift"]:
        assert len(same) >= 0.9 * len(judged), (
            str([(m["metric"], m["verdict"], round(m["rel"], 3)) for m in judged]) + "\n" + p.stdout + "\n"
            + analyzed_evidence(tmp_path / "a1") + "\n" + analyzed_evidence(tmp_path / "a2"))
    else:
        assert "CPU time per output token" in p.stdout, p.stdout

    # one flag changed: TTFT falls with the cap raised, and the queue-bound hypothesis is confirmed
    p = _run("compare", str(tmp_path / "a1"), str(tmp_path / "b"), "--json", str(tmp_path / "ab.json"),
             "--fail-on-regression", "ttft_p50=5%")
    assert p.returncode == 0, p.stdout + p.stderr  # faster is never a regression
    ab = json.loads((tmp_path / "ab.json").read_text())
    assert [c["what"] for c in ab["comparability"]["changed"]] == ["engine_config.max_num_seqs"]
    ttft = next(m for m in ab["levels"][0]["metrics"] if m["metric"] == "ttft_p50")
    assert ttft["verdict"] == "better" and ttft["rel_hi"] < 0, ttft
    gate = _run("compare", str(tmp_path / "b"), str(tmp_path / "a1"), "--fail-on-regression", "ttft_p50=5%", "-q")
    assert gate.returncode == 6, gate.stdout + gate.stderr  # the other way round it is a regression

    # the queue-cap finding is what a1 diagnoses; which finding leads depends on the host: on a machine stalled
    # 95% of the time each admission's prefill stalls the other slot's decode long enough that the ITL tail
    # (SCH007, also real here) outranked it once. verify is asked for the finding under test by its id.
    found = _run("analyze", str(tmp_path / "a1"), "-o", str(tmp_path / "a1.html"), "--json", str(tmp_path / "a1.json"))
    assert found.returncode == 0, found.stderr
    fired = [f["rule_id"] for f in json.loads((tmp_path / "a1.json").read_text())["findings"] if not f.get("held_back")]
    assert "SCH001" in fired, fired
    v = _run("verify", str(tmp_path / "a1"), str(tmp_path / "b"), "--finding", "SCH001", "--json",
             str(tmp_path / "v.json"))
    ver = json.loads((tmp_path / "v.json").read_text())
    assert ver["finding"] == "SCH001", ver["finding"]
    assert v.returncode == 0 and ver["outcome"] == "confirmed", v.stdout
    # the same experiment judged on the A/A pair: the occupancy it predicts (running up, queue down) did not
    # move, whatever the host did, so it is refuted, never confirmed
    r = _run("verify", str(tmp_path / "a1"), str(tmp_path / "a2"), "--finding", "SCH001")
    evidence = r.stdout + "\n" + analyzed_evidence(tmp_path / "a1") + "\n" + analyzed_evidence(tmp_path / "a2")
    assert r.returncode == 7 and r.stdout.startswith("refuted"), evidence


def _launch_cmd(extra: list[str]) -> tuple[str, str]:
    """The harness's vLLM CPU command line, as a user would pass it to --launch (environment via env)."""
    import shlex

    from harness.engine import VllmServer

    s = VllmServer(extra_args=with_eager(extra))
    env = {k: v for k, v in s.environment().items()
           if k in ("VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS",
                    "DO_NOT_TRACK", "PYTHONUNBUFFERED")}
    argv = ["env", "-u", "VIRTUAL_ENV", *(f"{k}={v}" for k, v in env.items()), *s.command()]
    return shlex.join(argv), s.url


def _experiment(cmd: str, url: str, out: Path, args: Sequence[str]) -> tuple[subprocess.CompletedProcess[str],
                                                                            dict[str, Any]]:
    """`diagnose experiment` once; once more (into ``out``-2) when it came out inconclusive because it saw the
    host change speed between its two servers (the tool said so, checked here): on these 2 shared cores
    the second server's run once had a concurrency-1 reference 46% faster than the first's."""
    p = _run("experiment", "--launch", cmd, "--url", url, "-o", str(out), *args, timeout=560)
    ver = json.loads((out / "verify.json").read_text())
    if p.returncode == 8 and "host ran at a different speed" in str(ver.get("reason")):
        assert "host ran at a different speed" in p.stdout, p.stdout
        out = out.with_name(out.name + "-2")
        p = _run("experiment", "--launch", cmd, "--url", url, "-o", str(out), *args, timeout=560)
        ver = json.loads((out / "verify.json").read_text())
    return p, ver


@pytest.mark.timeout(900)
def test_experiment_refutes_the_queue_cap_by_an_unrelated_flag(engine_built: None, tmp_path: Path) -> None:
    """`diagnose experiment --finding SCH001 --set FLAG=VALUE`: the token budget is not what holds requests back
    under --max-num-seqs 2, so changing it alone refutes the queue-cap hypothesis (exit 7). The queue cap
    confirmed by its own flag is shown by `attach --launch --verify` (queue_cap, below: the same verification,
    with its flag, value, exit status, first line and report asserted there) and by `experiment --top` above;
    this test once ran that confirmation a third time (two more server starts and captures, ~2 min of CI)."""
    cmd, url = _launch_cmd(["--max-num-seqs", "2"])
    load = ["--", "--no-nvml", "--realtime", *LOAD]
    q, ver = _experiment(cmd, url, tmp_path / "r", ["--finding", "SCH001", "--set", "--max-num-batched-tokens=4096",
                                                    *load])
    evidence = q.stdout + q.stderr + "\n" + runs_evidence(Path(q.args[q.args.index("-o") + 1]))
    assert ver["experiment"]["flag"] == "--max-num-batched-tokens" and ver["experiment"]["value"] == "4096", evidence
    assert q.returncode == 7 and q.stdout.startswith("refuted: SCH001"), evidence
    assert (Path(q.args[q.args.index("-o") + 1]) / "report.html").read_text().count("refuted") >= 1


@pytest.mark.timeout(1500)
def test_experiment_top_runs_each_findings_flag_then_both(engine_built: None, tmp_path: Path) -> None:
    """Two bottlenecks at once: --max-num-seqs 2 queues a c=8 load (SCH001) and, with prefix caching off, the
    75% of each prompt that all share is prefilled again every time (SCH006). `experiment --top 2`: one shared
    baseline, each finding's flag alone, then both together (4 starts; 3.4 min here with 10 s captures). Measured here: TTFT P50
    -81% (max-num-seqs 8), -37% (prefix caching), -87% together; SCH003, which changes SCH001's flag again, is
    skipped with why."""
    cmd, url = _launch_cmd(["--max-num-seqs", "2", "--no-enable-prefix-caching"])
    load = ["--", "--no-nvml", "--realtime", "--concurrency", "8", "--input-tokens", "1024", "--output-tokens", "32",
            "--shared-prefix", "0.75", "--duration", "15s"]
    out = tmp_path / "top"
    p = _run("experiment", "--launch", cmd, "--url", url, "-o", str(out), "--top", "2", *load, timeout=1400)
    js = json.loads((out / "top.json").read_text())
    if p.returncode == 8 and "host ran at a different speed" in str((js.get("what_if") or [{}])[-1].get("reason")):
        # the tool saw the host change speed as much as the combined change's effect and said to capture again
        # (as _experiment does); once more, into top-2
        out = tmp_path / "top-2"
        p = _run("experiment", "--launch", cmd, "--url", url, "-o", str(out), "--top", "2", *load, timeout=1400)
        js = json.loads((out / "top.json").read_text())
    evidence = p.stdout + p.stderr + "\n" + runs_evidence(out)
    rows = js.get("what_if") or []
    assert len(rows) == 3, evidence
    assert {(r["finding"], r["experiment"].split(":", 1)[1].strip()) for r in rows[:2]} == {
        ("SCH001", "--max-num-seqs 8"), ("SCH006", "--enable-prefix-caching on")}, evidence
    combined = rows[2]
    assert combined["experiment"].startswith("combined: ") and combined["bundle"].endswith("combined")
    launch = combined["launch"]
    assert launch[launch.index("--max-num-seqs") + 1] == "8" and launch[-1] == "--enable-prefix-caching", launch
    assert any(x.startswith("SCH003: its experiment changes --max-num-seqs") for x in js["skipped"]), js["skipped"]
    # each change alone and both together are verified against the one baseline: TTFT falls with each, and
    # each is confirmed, whatever the host's speed did meanwhile: raising the cap through the engine's
    # occupancy, prefix caching through the cache's hit ratio (0 with caching off, 0.82 with it on here), which
    # the host's speed sets neither of (stop 42 accepted "inconclusive" for a single change: prefix caching
    # alone was, twice, -33% TTFT beside a concurrency-1 reference that moved -31 and -33%)
    assert all(r["metrics"]["ttft_p50"]["verdict"] == "better" for r in rows), evidence
    assert [r["outcome"] for r in rows] == ["confirmed"] * 3, evidence
    assert p.returncode == 0 and "what-if" in p.stdout and "combined: " in p.stdout, evidence
    assert sorted(d.name for d in out.iterdir() if (d / "manifest.json").is_file()) == [
        "before", "before-warmup", "combined", "combined-warmup", *sorted(
            f"exp{i}-{r['finding']}{w}" for i, r in enumerate(rows[:2], start=1) for w in ("", "-warmup"))]


@pytest.mark.timeout(900)
def test_find_max_goodput_matches_a_fine_manual_sweep(capped: VllmServer, tmp_path: Path) -> None:
    """--max-num-seqs 2: up to c=2 no request waits for a batch slot; above it, requests queue for a whole
    request's time. The search (ladder 1, 2, 4, 8, then bisection) must put the TTFT P90 edge within one
    ladder step of a fine sweep (every concurrency 1..6 in one capture, each level judged on its own)."""
    url = capped.url
    shape = ["--input-tokens", "128", "--output-tokens", "32", "--duration", "8s", "--no-nvml", "--realtime"]
    _warm(url, tmp_path / "warm", ["-c", "4", *shape])
    # the fine manual sweep first: one capture, c=1..6, each level's TTFT P90 against the limit
    _attach(url, tmp_path / "fine", "--baseline", "0", load=["-c", "1:6:+1", *shape])
    from diagnose.pipeline import analyze

    a = analyze(tmp_path / "fine")
    levels = {ph.concurrency: s for ph, s in zip(a.phases, a.phase_signals, strict=True) if not ph.is_baseline}
    ttft90 = {c: s["ttft_p90_ms"].value for c, s in levels.items()}
    # the limit between the two regimes, from this host's own c=1 level: while no request waits, TTFT P90 is
    # about c=1's; once a tenth of the requests wait for a whole request, it is that plus a request's time. The
    # limit lies 40% of a request's time above c=1's P90 (a fixed 60 ms held on a host that prefilled the 128
    # tokens in ~20 ms; on an AVX2-only host, where bfloat16 is emulated, c=1 alone took 123 ms)
    one = levels[1.0]
    limit_ms = round(one["ttft_p90_ms"].value + 0.4 * one["e2e_p50_ms"].value, 1)
    slo = f"ttft_p90={limit_ms:g}ms"
    p = _run("attach", "--url", url, "--find-max-goodput", "-c", "1:8:x2", "--slo", slo, *shape, "--baseline", "4",
             "-o", str(tmp_path / "edge"), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads((tmp_path / "edge" / "search.json").read_text())
    found = next(x["level"] for x in r["points"] if x["label"] == r["max_goodput"]) if r["max_goodput"] else 0
    fine = max((c for c, v in ttft90.items() if c is not None and all(ttft90[k] <= limit_ms for k in ttft90
                                                                      if k is not None and k <= c)), default=0)
    evidence = f"search: {p.stdout}\nlimit {limit_ms} ms; fine sweep TTFT P90 ms per concurrency: {ttft90}"
    assert fine >= 1 and abs(found - fine) <= 1, evidence  # one ladder step near the edge (the bisection's)
    assert r["saturation"] is not None or "not reached" in r["saturation_note"], evidence
    html = (tmp_path / "edge" / "report.html").read_text()
    assert "Throughput vs latency, one point per level" in html


# Three bottlenecks, each diagnosed and its experiment run by one `attach --launch ... --verify` (the queue
# cap is also refuted through `diagnose experiment` above: the same flow). The loads are the scenario suite's
# (scenarios/scenarios.yaml) with shorter captures. The servers run --enforce-eager: vLLM's CPU build otherwise
# compiles for 24 s at each of the two starts (measured: prefill_heavy 218 s compiled, 166 s eager, the same
# verdict), and issue 13 asks for the whole command within 3 minutes here.
VERIFY_CASES = {
    "queue_cap": (["--max-num-seqs", "2", "--enforce-eager"], "SCH001", "--max-num-seqs",
                  ["--concurrency", "8", "--input-tokens", "128", "--output-tokens", "32"]),
    "prefix_cache_miss": (["--no-enable-prefix-caching", "--enforce-eager"], "SCH006", "--enable-prefix-caching",
                          ["--concurrency", "4", "--input-tokens", "1024", "--output-tokens", "32",
                           "--shared-prefix", "0.75"]),
    # 40 s, not 10: requests take ~1.5 s here and the closed loop runs in waves of 8, so the blocks of time
    # are few and alike within; measured TTFT P50 -68% with a 95% interval of -81% to +164% over 10 s and -70%
    # (-83% to +39%) over 20 s, both inconclusive
    "prefill_heavy": (["--max-num-batched-tokens", "256", "--max-num-seqs", "16", "--enforce-eager"], "SCH004",
                      "--max-num-batched-tokens", ["--concurrency", "8", "--input-tokens", "1536",
                                                   "--output-tokens", "16", "--duration", "40s"]),
}


@pytest.mark.timeout(1300)
@pytest.mark.parametrize("case", sorted(VERIFY_CASES))
def test_attach_launch_verify_confirms_the_experiment(case: str, engine_built: None, tmp_path: Path) -> None:
    import time

    engine_args, rule, flag, load = VERIFY_CASES[case]
    cmd, url = _launch_cmd(engine_args)
    t0 = time.monotonic()
    load = load if "--duration" in load else [*load, "--duration", "10s"]
    out = tmp_path / "v"
    p = _run("attach", "--launch", cmd, "--url", url, "--verify", *load, "--no-nvml",
             "--realtime", "-o", str(out), timeout=600)
    took = time.monotonic() - t0
    first = json.loads((out / "verify.json").read_text()) if (out / "verify.json").exists() else {}
    if p.returncode == 8 and "host ran at a different speed" in str(first.get("reason")):
        # the tool saw the host change speed between its two servers and said to capture both again (as
        # _experiment does; CI, stop 41: prefill_heavy's concurrency-1 reference 29% faster in the second run,
        # while four runs of the two budgets here put it at 8.4, 7.2, 8.7 and 9.3 ms in turn: host noise)
        assert "host ran at a different speed" in p.stdout, p.stdout
        out = tmp_path / "v-2"
        p = _run("attach", "--launch", cmd, "--url", url, "--verify", *load, "--no-nvml",
                 "--realtime", "-o", str(out), timeout=600)
    evidence = p.stdout + p.stderr + (("\n" + runs_evidence(out)) if (out / "after").exists() else "")
    ver = json.loads((out / "verify.json").read_text()) if (out / "verify.json").exists() else {}
    assert ver.get("finding") == rule and ver["experiment"]["flag"] == flag, evidence
    if case == "queue_cap":  # the value the cap is raised to (SCH001's experiment: the load's concurrency)
        assert ver["experiment"]["value"] == "8", evidence
    assert p.returncode == 0 and ver["outcome"] == "confirmed", evidence
    assert p.stdout.startswith(f"confirmed: {rule}")
    assert (out / "report.html").read_text().count("confirmed") >= 1
    print(f"{case}: attach --launch --verify took {took:.0f} s")  # the closing note's figure (-s to see it)
