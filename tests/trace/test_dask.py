"""Scale-out trace analysis (diagnose/trace/distributed.py) on a real dask.distributed LocalCluster (processes,
2 workers, 1 thread each): the Dask path gives exactly the single-process path's result (tables, warnings,
signals; through the CLI: findings too) on 1 worker and on 2, on the real multi-rank traces and on a 64-rank set
built from a real rank; a corrupt rank is left out and named; an unreachable scheduler is one line."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from diagnose.errors import InputError
from diagnose.trace import TraceAnalysis, analyze_trace
from diagnose.trace.distributed import NO_HTTP_PORT, ScaleOut, fans_out, scale_out
from diagnose.trace.multirank import collective_skew
from tests.trace.helpers import DATA
from tests.trace.rankset import write_rank_set

SOURCE_RANK = DATA / "sampled_128rank" / "sampled_128rank_rank0.json.gz"  # real: HTA's 128-rank job, rank 0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.ERROR, scheduler_kwargs=NO_HTTP_PORT) as c:
        yield c


def _workers(cluster: Any) -> list[str]:
    return sorted(cluster.scheduler_info["workers"])


def assert_same(a: TraceAnalysis, b: TraceAnalysis) -> None:
    assert sorted(a.tables) == sorted(b.tables)
    for k in a.tables:
        x, y = a.tables[k], b.tables[k]
        if k == "trace_summary":
            x, y = x.drop(columns="analysis_s"), y.drop(columns="analysis_s")
        pd.testing.assert_frame_equal(x, y, obj=k)
    assert a.warnings == b.warnings
    assert [(s.name, s.value, s.unit) for s in a.signals] == [(s.name, s.value, s.unit) for s in b.signals]
    for k in ("files", "ranks", "events", "categories", "meta", "span_us", "failed"):
        assert a.summary[k] == b.summary[k], k


def three_ways(path: Path, cluster: Any) -> tuple[TraceAnalysis, TraceAnalysis, TraceAnalysis]:
    """Single process, Dask on one worker, Dask on two."""
    single = analyze_trace(path)
    with scale_out(ScaleOut(scheduler=cluster.scheduler_address, only_workers=tuple(_workers(cluster)[:1]))):
        one = analyze_trace(path)
    with scale_out(ScaleOut(scheduler=cluster.scheduler_address)):
        two = analyze_trace(path)
    assert one.summary["scale_out"]["workers"] == 1 and two.summary["scale_out"]["workers"] == 2
    assert "scale_out" not in single.summary
    return single, one, two


def test_real_multirank_traces_same_on_one_process_one_worker_and_two(cluster: Any, tmp_path: Path) -> None:
    single, one, two = three_ways(DATA / "sampled_128rank", cluster)
    assert_same(single, one)
    assert_same(single, two)
    assert single.summary["ranks"] == [0, 1] and len(single.tables["trace_collectives"]) > 0
    # ranks of unrelated real jobs, without a common rank numbering: file order, a duplicate rank renumbered
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("h100_single_gpu_qwen1.5_0.5b_chat.json.gz", "mi300x_sglang_qwen3_8b_decode.json.gz",
                 "a100_alexnet_cuda_sync_events.json.gz", "vllm_cpu_0.32_worker_rank0_c8.pt.trace.json.gz"):
        shutil.copyfile(DATA / name, mixed / name)
    for i in (0, 1):
        shutil.copyfile(DATA / "sampled_128rank" / f"sampled_128rank_rank{i}.json.gz", mixed / f"z{i}.json.gz")
    shutil.copyfile(SOURCE_RANK, mixed / "z2_same_rank_again.json.gz")
    single, one, two = three_ways(mixed, cluster)
    assert_same(single, one)
    assert_same(single, two)
    assert any("already seen" in w for w in single.warnings)
    assert len(single.summary["ranks"]) == 7 and len(set(single.summary["ranks"])) == 7
    # both workers took part in the two-worker run, one in the other
    assert len(two.summary["scale_out"]["worker_peak_rss_bytes"]) == 2
    assert len(one.summary["scale_out"]["worker_peak_rss_bytes"]) == 1


def test_64_rank_set_from_a_real_rank_names_the_delayed_rank(cluster: Any, tmp_path: Path) -> None:
    delayed, delay = 37, 5000.0
    write_rank_set(SOURCE_RANK, tmp_path / "r64", 64, delayed=delayed, delay_us=delay, jitter_us=3.0)
    single = analyze_trace(tmp_path / "r64")  # (one worker against two: the test above)
    with scale_out(ScaleOut(scheduler=cluster.scheduler_address)):
        two = analyze_trace(tmp_path / "r64")
    assert_same(single, two)
    assert single.summary["ranks"] == list(range(64))
    coll = single.tables["trace_collectives"]
    assert len(coll) == 10 and (coll["last_rank"] == delayed).all()
    # every rank is the same trace shifted by 3 µs x (rank mod 7); the delayed one by 5000 µs more
    assert coll["skew_us"].to_numpy() == pytest.approx(delay + 3.0 * (delayed % 7), abs=1e-6)
    rk = single.tables["trace_rank_skew"].set_index("rank")
    assert rk.loc[delayed, "times_last"] == 10 and rk.loc[delayed, "wait_us"] == 0
    others = rk.drop(index=delayed)
    assert (others["wait_us"] > 0).all() and (others["wait_ratio"] > 0).all()
    sig = {s.name: s.value for s in single.signals}
    assert sig["trace_straggler_last_share_ratio"] == 1.0 and sig["trace_straggler_rank"] == delayed
    waited = float(rk["wait_us"].sum()) / float(rk["comm_us"].sum())
    assert 0 < waited < 1 and rk.loc[delayed, "wait_ratio"] == 0
    assert len(two.summary["scale_out"]["worker_peak_rss_bytes"]) == 2


def test_corrupt_rank_is_named_and_the_rest_analysed(cluster: Any, tmp_path: Path) -> None:
    paths = write_rank_set(SOURCE_RANK, tmp_path / "r8", 8, delayed=5)
    data = paths[3].read_bytes()
    paths[3].write_bytes(data[: len(data) // 2])  # truncated gzip
    single = analyze_trace(tmp_path / "r8")
    with scale_out(ScaleOut(scheduler=cluster.scheduler_address)):
        two = analyze_trace(tmp_path / "r8")
    assert_same(single, two)
    assert single.summary["ranks"] == [0, 1, 2, 4, 5, 6, 7]
    w = [m for m in single.warnings if "could not be read" in m]
    assert len(w) == 1 and w[0].startswith("1 of 8 rank traces could not be read and were left out: ")
    assert str(paths[3]) in w[0] and "truncated gzip" in w[0]
    assert list(single.summary["failed"]) == [str(paths[3])]
    assert (single.tables["trace_collectives"]["last_rank"] == 5).all()  # the analysis of the rest stands
    # when no rank can be read, that is the error
    for p in paths:
        p.write_bytes(b"not a trace")
    with pytest.raises(InputError, match="none of the 8 rank traces could be read; first: .*rank-00000"):
        analyze_trace(tmp_path / "r8")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diagnose", *args], capture_output=True, text=True, timeout=240,
                          env={**os.environ, **(env or {})})


def _findings(p: Path) -> dict[str, Any]:
    doc = json.loads(p.read_text())
    return {"findings": doc["findings"], "signals": doc["signals"], "verdict": doc["verdict"],
            "warnings": doc["warnings"]}


def test_cli_same_findings_in_one_process_on_a_scheduler_and_on_a_local_cluster(cluster: Any,
                                                                               tmp_path: Path) -> None:
    src = DATA / "sampled_128rank"
    outs = {}
    for name, extra in (("one", ["--workers", "1"]), ("sched", ["--scheduler", cluster.scheduler_address]),
                        ("local", ["--workers", "2"])):
        p = run_cli("analyze", str(src), *extra, "-o", str(tmp_path / f"{name}.html"),
                    "--json", str(tmp_path / f"{name}.json"))
        assert p.returncode == 0, p.stderr
        assert "Traceback" not in p.stderr and "distributed." not in p.stderr, p.stderr
        outs[name] = _findings(tmp_path / f"{name}.json")
    assert outs["one"]["findings"] and outs["one"]["signals"]["trace_collective_skew_p50_us"]
    assert outs["sched"] == outs["one"]
    assert outs["local"] == outs["one"]


def test_cli_unreachable_scheduler_is_one_line_naming_it(tmp_path: Path) -> None:
    import dask.config
    from click.testing import CliRunner

    from diagnose.cli.main import cli
    from tests.servers.truth import free_port

    addr = f"tcp://127.0.0.1:{free_port()}"
    runner = CliRunner()
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        res = runner.invoke(cli, ["analyze", str(DATA / "sampled_128rank"), "--scheduler", addr,
                                   "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"diagnose: error: cannot reach the Dask scheduler at {addr}")
    assert "Timed out" in lines[0] and not (tmp_path / "r.html").exists()
    res = runner.invoke(cli, ["analyze", str(DATA / "sampled_128rank"), "--scheduler", addr, "--workers", "2"])
    assert res.exit_code == 2 and "--workers sizes a local cluster" in res.stderr


def test_when_the_set_fans_out() -> None:
    assert fans_out(ScaleOut(scheduler="tcp://h:8786"), 1)
    assert not fans_out(ScaleOut(workers=1), 500)
    assert fans_out(ScaleOut(workers=2), 2) and not fans_out(ScaleOut(workers=2), 1)
    from diagnose.trace import distributed

    auto = ScaleOut()
    assert fans_out(auto, distributed.AUTO_MIN_RANKS) == (distributed.cores() >= distributed.AUTO_MIN_CORES)
    assert not fans_out(auto, distributed.AUTO_MIN_RANKS - 1)


def test_collective_wait_and_transfer_exact() -> None:
    # two collectives; rank 1 arrives 40 µs after rank 0 at the first, rank 0 arrives 30 µs late at the second
    starts = {0: np.array([100.0, 200.0 + 30.0]), 1: np.array([140.0, 200.0])}
    durs = {0: np.array([50.0, 5.0]), 1: np.array([6.0, 40.0])}
    per_coll, per_rank, w = collective_skew(starts, durs)
    assert not w and per_coll["skew_us"].tolist() == [40.0, 30.0] and per_coll["last_rank"].tolist() == [1, 0]
    r = per_rank.set_index("rank")
    # rank 0 waits 40 of its 50 µs at the first, 0 at the second; rank 1 waits 0, then 30 of its 40 µs
    assert r.loc[0, "wait_us"] == 40.0 and r.loc[0, "transfer_us"] == 10.0 + 5.0
    assert r.loc[1, "wait_us"] == 30.0 and r.loc[1, "transfer_us"] == 6.0 + 10.0
    assert r.loc[1, "wait_ratio"] == pytest.approx(30.0 / 46.0)
    assert per_coll["wait_us_mean"].tolist() == [20.0, 15.0]
    # a wait longer than the kernel is capped at its duration
    _, per_rank, _ = collective_skew({0: np.array([0.0]), 1: np.array([50.0])}, {0: np.array([8.0]), 1: np.array([8.0])})
    assert per_rank.set_index("rank").loc[0, "wait_us"] == 8.0
