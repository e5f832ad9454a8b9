"""Scale-out trace analysis: the ranks of a trace set fan out on Dask (``dask.distributed``), one task per rank.

Each task streams one rank's trace (diagnose/trace/parse.py), reduces it with the same per-rank reduction as
the single-process path (:func:`diagnose.trace.multirank.reduce_file`), writes the per-rank tables and the
rank's communication kernels as Parquet files under ``<results_dir>/rank-NNNNN/`` and returns only a small
summary (the one-row-per-rank rows, metadata, warnings, its worker's peak RSS). The client then reads the
Parquet files back and runs the same merge (:func:`diagnose.trace.multirank.merge`): the result is the one the
single-process path gives, on any number of workers. A worker holds one rank at a time
(``threads_per_worker=1``), so its memory is bounded by the largest rank, not by the set.

Where it runs: a running scheduler (``ScaleOut(scheduler="tcp://host:8786")``: its workers need diagnose
installed, and must see the trace files and the results directory at the same paths as the client, i.e. a
shared filesystem), or a local cluster of worker processes started for the analysis (one per core by
default). :func:`scale_out` puts a :class:`ScaleOut` in effect for the analyses run inside it (the CLI's
``diagnose analyze --scheduler/--workers``); :func:`diagnose.trace.analyze.analyze_files` consults it.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import socket
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pandas as pd

from diagnose.errors import DiagnoseError, InputError, require
from diagnose.trace.launch import LaunchSummary
from diagnose.trace.multirank import RankResult, ScaleOutInfo, reduce_file
from diagnose.trace.timeline import GpuTimeRow

# Without --workers / --scheduler, a local cluster is started for sets of at least AUTO_MIN_RANKS rank traces on
# machines with at least AUTO_MIN_CORES cores; below that the gain is small or negative once the cluster's
# start-up is paid (benchmarks/results/trace_ranks_dask.md: 0.77x-1.49x with 2 workers on 2 cores).
AUTO_MIN_RANKS = 8
AUTO_MIN_CORES = 4
CONNECT_TIMEOUT_S = 10.0  # waiting for a scheduler that does not answer
COMM_FILE = "comm_kernels.parquet"  # not a table name (a table "comm" exists)
# the scheduler's HTTP server (health, metrics) starts even without a dashboard: on a free port, never 8787
NO_HTTP_PORT = {"dashboard_address": ":0"}


@dataclass(frozen=True)
class ScaleOut:
    """How to fan the ranks out. ``scheduler``: the address of a running Dask scheduler; else a local cluster
    of ``workers`` processes (None: one per core, and only for sets of at least ``AUTO_MIN_RANKS`` traces on
    at least ``AUTO_MIN_CORES`` cores; 1: the single-process path). ``results_dir``: where the per-rank Parquet files go (None: a temporary
    directory, removed after the merge). ``only_workers``: run the tasks on these of the scheduler's workers
    only (addresses or names; e.g. the ones that see the shared filesystem)."""

    scheduler: str | None = None
    workers: int | None = None
    results_dir: Path | None = None
    only_workers: tuple[str, ...] = ()
    connect_timeout_s: float | None = None  # None: connect_timeout_s()

    def __post_init__(self) -> None:
        if self.scheduler is not None:
            object.__setattr__(self, "scheduler", check_scheduler_address(self.scheduler))


SCHEDULER_SCHEMES = ("tcp", "tls")


def check_scheduler_address(address: str) -> str:
    """``address`` as a Dask scheduler address, ``tcp://host:port`` (or ``tls://``; a bare ``host:port`` is
    tcp), port 1-65535; an :class:`InputError` (exit 2, one line) for anything else."""
    shown = repr(address[:200])
    addr = address.strip()
    scheme, sep, rest = addr.partition("://")
    if not sep:
        scheme, rest = "tcp", addr
    if scheme.lower() not in SCHEDULER_SCHEMES:
        raise InputError(f"--scheduler {shown}: expected tcp://HOST:PORT (a running Dask scheduler), "
                         f"not {scheme + '://'!r}")
    host, colon, port = rest.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [::1]
    if not colon or not host or any(c in host for c in "/ @?#[]") or not port.isdigit():
        raise InputError(f"--scheduler {shown}: expected tcp://HOST:PORT (a running Dask scheduler)")
    if not 1 <= int(port) <= 65535:
        raise InputError(f"--scheduler {shown}: port {int(port)} is out of range (1-65535)")
    return f"{scheme.lower()}://{rest}"


_CURRENT: ContextVar[ScaleOut | None] = ContextVar("diagnose_trace_scale_out", default=None)


@contextmanager
def scale_out(cfg: ScaleOut | None) -> Iterator[None]:
    """Run the trace analyses inside this block as ``cfg`` says (None: the single-process path)."""
    token = _CURRENT.set(cfg)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> ScaleOut | None:
    return _CURRENT.get()


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def fans_out(cfg: ScaleOut, n_files: int) -> bool:
    """Whether ``n_files`` rank traces go to Dask under ``cfg``. Dask is an extra (``diagnose[scale]``): without
    it a trace set is analysed in this process, and asking for a scheduler or workers is a one-line error."""
    if cfg.scheduler:
        require("distributed", "scale", "analyze --scheduler")
        return True
    if cfg.workers is None:
        return cores() >= AUTO_MIN_CORES and n_files >= AUTO_MIN_RANKS and _have_dask()
    if cfg.workers > 1 and n_files > 1:
        require("distributed", "scale", "analyze --workers")
        return True
    return False


def _have_dask() -> bool:
    try:
        require("distributed", "scale", "")
    except DiagnoseError:
        return False
    return True


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far. On Linux VmHWM of /proc/self/status: ``ru_maxrss`` also
    counts the RSS of the process that forked it before the exec (a worker would report its parent's peak)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # macOS: bytes; elsewhere kB
    return int(peak) if os.uname().sysname == "Darwin" else int(peak) * 1024


class TaskResult(TypedDict, total=False):
    """What a rank's Dask task returns (``rank_task``): its RankResult's small fields and where its tables are;
    ``index``, ``path`` and ``failed`` only for a rank whose worker died."""

    index: int
    path: str
    rank: int
    has_rank: bool
    error: str | None
    meta: dict[str, Any]  # RankResult.meta: the trace header's metadata
    events: int
    unit: str
    categories: dict[str, int]
    warnings: list[str]
    span_us: tuple[float, float] | None
    rows: dict[str, GpuTimeRow | LaunchSummary | dict[str, float]]  # RankResult.rows
    capture: bool
    dir: str
    tables: list[str]
    comm: bool
    worker: str
    peak_rss_bytes: int
    failed: str


class ScaleOutExtra(TypedDict):
    scale_out: ScaleOutInfo


def rank_task(path: str, index: int, results_dir: str, include_python: bool) -> TaskResult:
    """One Dask task: read and reduce one rank, write its tables as Parquet, return the small rest."""
    r = reduce_file(Path(path), index, include_python=include_python)
    out = Path(results_dir) / f"rank-{index:05d}"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key, df in r.tables.items():
        if df.empty:  # the merge leaves empty tables out anyway
            continue
        df.to_parquet(out / f"{key}.parquet", engine="pyarrow", index=False)
        written.append(key)
    if r.comm_ts_us is not None and r.comm_dur_us is not None:
        cols = {"ts_us": r.comm_ts_us, "dur_us": r.comm_dur_us}
        if r.comm_pre_idle_us is not None:
            cols["pre_idle_us"] = r.comm_pre_idle_us
        pd.DataFrame(cols).to_parquet(out / COMM_FILE, index=False)
    return {"index": r.index, "path": str(r.path), "rank": r.rank, "has_rank": r.has_rank, "error": r.error,
            "meta": r.meta, "events": r.events, "unit": r.unit, "categories": r.categories, "warnings": r.warnings,
            "span_us": r.span_us, "rows": r.rows, "capture": r.capture, "dir": str(out), "tables": written,
            "comm": r.comm_ts_us is not None, "worker": f"{socket.gethostname()}:{os.getpid()}",
            "peak_rss_bytes": peak_rss_bytes()}


def load_result(s: TaskResult) -> RankResult:
    """A task's summary and Parquet files -> the rank's RankResult, as the single-process path holds it."""
    r = RankResult(index=s["index"], path=Path(s["path"]), rank=s["rank"], has_rank=s["has_rank"], error=s["error"],
                   meta=s["meta"], events=s["events"], unit=s["unit"], categories=s["categories"],
                   warnings=s["warnings"], span_us=s["span_us"], rows=s["rows"], capture=s["capture"])
    d = Path(s["dir"])
    for key in s["tables"]:
        r.tables[key] = pd.read_parquet(d / f"{key}.parquet", engine="pyarrow")
    if s["comm"]:
        c = pd.read_parquet(d / COMM_FILE, engine="pyarrow")
        r.comm_ts_us = c["ts_us"].to_numpy(dtype=np.float64)
        r.comm_dur_us = c["dur_us"].to_numpy(dtype=np.float64)
        if "pre_idle_us" in c:
            r.comm_pre_idle_us = c["pre_idle_us"].to_numpy(dtype=np.float64)
    return r


def connect_timeout_s() -> float:
    """CONNECT_TIMEOUT_S, or Dask's own ``distributed.comm.timeouts.connect`` where that is shorter."""
    import dask.config
    from dask.utils import parse_timedelta

    configured = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect", CONNECT_TIMEOUT_S),
                                 default="s")
    return min(CONNECT_TIMEOUT_S, float(configured or CONNECT_TIMEOUT_S))


@contextmanager
def _client(cfg: ScaleOut, n_files: int) -> Iterator[Any]:
    from distributed import Client, LocalCluster

    timeout = cfg.connect_timeout_s if cfg.connect_timeout_s is not None else connect_timeout_s()
    if cfg.scheduler:
        probe_scheduler(cfg.scheduler, timeout)  # Client() itself waits forever on a listener that never answers
        try:
            client = Client(cfg.scheduler, timeout=timeout)
        except (OSError, TimeoutError, ValueError, TypeError) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DiagnoseError(f"cannot reach the Dask scheduler at {cfg.scheduler}: {reason}") from e
        with client:
            yield client
        return
    n = max(1, min(cfg.workers or cores(), n_files))
    import dask.config

    # the workers' statistical profiler samples the task thread every 10 ms: pure overhead here
    with dask.config.set({"distributed.worker.profile.enabled": False}), \
            LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                         silence_logs=logging.ERROR, scheduler_kwargs=dict(NO_HTTP_PORT)) as cluster, \
            Client(cluster) as client:
        yield client


def probe_scheduler(address: str, timeout_s: float) -> None:
    """Ask the scheduler at ``address`` who it is (Dask's ``identity``), all within ``timeout_s``: a
    :class:`DiagnoseError` (one line, exit 1) when it cannot be reached or does not answer in time."""
    import asyncio

    from distributed.comm import connect

    async def ask() -> Any:
        comm = await connect(address, timeout=timeout_s)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    async def bounded() -> Any:
        return await asyncio.wait_for(ask(), timeout_s)

    from concurrent.futures import ThreadPoolExecutor

    try:
        with ThreadPoolExecutor(1) as pool:  # its own thread and loop: the caller may be inside a running loop
            reply = pool.submit(asyncio.run, bounded()).result()
    except asyncio.TimeoutError:
        raise DiagnoseError(f"cannot reach the Dask scheduler at {address}: Timed out: no answer within "
                            f"{timeout_s:g} s") from None
    except (OSError, ValueError, TypeError, RuntimeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DiagnoseError(f"cannot reach the Dask scheduler at {address}: {reason}") from None
    if not isinstance(reply, dict) or reply.get("type") != "Scheduler":
        raise DiagnoseError(f"cannot reach the Dask scheduler at {address}: what answers there is not a Dask "
                            "scheduler")


def reduce_files(files: Sequence[Path], cfg: ScaleOut, *, include_python: bool = False,
                 ) -> tuple[list[RankResult], ScaleOutExtra]:
    """Every rank's RankResult, computed on Dask; plus ``{"scale_out": ...}`` for the summary (where it ran,
    how many workers, each worker's peak RSS)."""
    from distributed import KilledWorker

    own_dir = cfg.results_dir is None
    out = Path(tempfile.mkdtemp(prefix="diagnose-ranks-")) if own_dir else Path(str(cfg.results_dir))
    log = logging.getLogger("distributed")
    level = log.level
    log.setLevel(logging.ERROR)  # the client's own chatter (reconnects, slow event loop) is not the user's
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"distributed(\.|$)")  # nor its warnings (slow scratch dirs, ports)
        try:
            with _client(cfg, len(files)) as client:
                futs = client.map(rank_task, [str(f) for f in files], list(range(len(files))),
                                  [str(out)] * len(files), [include_python] * len(files), pure=False,
                                  workers=list(cfg.only_workers) or None, allow_other_workers=False)
                summaries: list[TaskResult] = []
                for i, fut in enumerate(futs):
                    try:
                        summaries.append(fut.result())
                    except KilledWorker as e:  # the worker died (out of memory, say): that rank fails, not the set
                        summaries.append({"index": i, "path": str(files[i]), "failed": f"{files[i]}: worker died "
                                          f"while analysing it ({e})"})
                    except ModuleNotFoundError as e:  # a scheduler whose workers lack diagnose
                        raise DiagnoseError(f"the workers of the Dask scheduler at {client.scheduler.address} cannot "
                                            f"import {e.name}: install diagnose where they run") from e
                workers = len(cfg.only_workers) or len(client.nthreads())
                address = client.scheduler.address
            results = [RankResult(index=s["index"], path=Path(s["path"]), error=s["failed"]) if "failed" in s
                       else load_result(s) for s in summaries]
        finally:
            log.setLevel(level)
            if own_dir:
                shutil.rmtree(out, ignore_errors=True)
    peaks: dict[str, int] = {}  # worker process -> its peak RSS (the largest its tasks reported)
    for s in summaries:
        if "worker" in s:
            peaks[s["worker"]] = max(peaks.get(s["worker"], 0), s["peak_rss_bytes"])
    extra: ScaleOutExtra = {"scale_out": {"scheduler": cfg.scheduler or address, "local": not cfg.scheduler, "workers": workers,
                           "worker_peak_rss_bytes": sorted(peaks.values()),
                           "results_dir": None if own_dir else str(out)}}
    return results, extra
