"""Graph-capture passes (issue 35): a trace, or the steps of one, that records CUDA/HIP graphs rather than runs
them. Its kernels are recorded into graphs, not run, so its GPU idle, launch and sync figures say nothing about
serving.

Engine-neutral marker: the stream-capture runtime calls (``cudaStreamBeginCapture`` / ``hipStreamBeginCapture``
/ ``cuStreamBeginCapture``, each up to its ``...EndCapture``), which every capture makes (vLLM, SGLang,
torch.compile's Inductor cudagraph trees, plain ``torch.cuda.graph``). Engine markers as well: vLLM's
``capture_<batch>_<FULL|PIECEWISE|NONE>`` annotations and ``capture_model`` / ``_capture_cudagraphs`` frames,
SGLang's ``capture_bs`` / ``capture_<batch>_<MODE>`` (``capture_32_DECODE``) / ``capture_graph_bs_<batch>``
annotations and ``cuda_graph_runner.py`` ``capture`` frames, Inductor's ``cudagraph_trees.py`` recording frames.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

CAPTURE_ANNOTATION = re.compile(r"^capture_\d+_[A-Z][A-Z_]*\b|^capture_bs\b|^capture_graph_bs_\d+|"
                                r"^cuda_graph_capture|^graph_capture")
CAPTURE_FRAME = re.compile(r"\.py\(\d+\): (?:capture_model|_capture_cudagraphs)$|"
                           r"cuda_graph_runner\.py\(\d+\): (?:capture|capture_one_batch_size)$|"
                           r"cudagraph_trees\.py\(\d+\): (?:_record|record_function)$")
BEGIN_CAPTURE = re.compile(r"^(?:cuda|hip|cu)StreamBeginCapture")
END_CAPTURE = re.compile(r"^(?:cuda|hip|cu)StreamEndCapture")


def _named(df: pd.DataFrame | None, pat: re.Pattern[str]) -> np.ndarray:
    if df is None or df.empty:
        return np.zeros(0, dtype=bool)
    codes, uniq = pd.factorize(df["name"].astype(str), sort=False)  # match the unique names only
    return np.isin(codes, [i for i, u in enumerate(uniq) if pat.search(str(u))])


def capture_intervals(annotations: pd.DataFrame, frames: pd.DataFrame | None,
                      runtime: pd.DataFrame | None) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) in µs of the capture marks: capture annotations and frames, and each stream-capture begin
    call up to the end of the next end-capture call (the begin call alone when none follows)."""
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    for df, pat in ((annotations, CAPTURE_ANNOTATION), (frames, CAPTURE_FRAME)):
        hit = _named(df, pat)
        if df is not None and hit.any():
            ts = df["ts_us"].to_numpy(dtype=float)[hit]
            starts.append(ts)
            ends.append(ts + df["dur_us"].to_numpy(dtype=float)[hit])
    b = _named(runtime, BEGIN_CAPTURE)
    if runtime is not None and b.any():
        ts = runtime["ts_us"].to_numpy(dtype=float)
        te = ts + runtime["dur_us"].to_numpy(dtype=float)
        e = _named(runtime, END_CAPTURE)
        bts, bte = ts[b], te[b]
        ets = np.sort(te[e])
        k = np.searchsorted(ets, bts, side="left")  # the first end-capture call ending after the begin
        nxt = ets[np.minimum(k, len(ets) - 1)] if len(ets) else bte
        starts.append(bts)
        ends.append(np.where(k < len(ets), nxt, bte))
    if not starts:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(starts), np.concatenate(ends)


def steps_in_capture(st: np.ndarray, en: np.ndarray, cap: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per step (CPU interval st..en), how many capture marks overlap it."""
    cs, ce = cap
    if not len(cs) or not len(st):
        return np.zeros(len(st), dtype=int)
    return ((cs[None, :] <= en[:, None]) & (ce[None, :] >= st[:, None])).sum(axis=1)
