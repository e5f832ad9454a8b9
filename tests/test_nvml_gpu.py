"""The NVML probe against the REAL NVML of an NVIDIA GPU (marker: gpu; deselected by default).

CI has no GPU; benchmarks/gpu_device_check.sh runs this on a lent GPU machine (``python -m pytest -m gpu``)
while torch keeps the GPU busy, so utilisation, clocks and power must move.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.normalize import gpu as gpu_norm
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.nvml import NvmlProbe

pytestmark = pytest.mark.gpu
GPM_KEYS = ("sm_util_ratio", "dram_bw_util_ratio", "sm_occupancy_ratio", "tensor_util_ratio")


def _busy_gpu(stop: threading.Event) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize()


def test_real_nvml_samples_a_busy_gpu(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    assert torch.cuda.is_available(), "gpu tests need a CUDA GPU"
    stop = threading.Event()
    load = threading.Thread(target=_busy_gpu, args=(stop,), daemon=True)
    load.start()
    bw = BundleWriter(tmp_path / "b")
    ctx = CaptureContext(bundle=bw, target=Target(url="http://127.0.0.1:9"), stop=asyncio.Event())
    probe = NvmlProbe(rate_hz=20)

    async def go() -> object:
        async def halt() -> None:
            await asyncio.sleep(3.0)
            ctx.stop.set()
        st, _ = await asyncio.gather(probe.run(ctx), halt())
        return st

    try:
        status = asyncio.run(go())
    finally:
        stop.set()
        load.join(timeout=10)
    bw.set_probe_status(status)  # type: ignore[arg-type]
    bw.finish()
    assert status.state == "ok", status.reason  # type: ignore[attr-defined]
    recs = open_bundle(tmp_path / "b").records("gpu_samples")
    dev = [r for r in recs if r["kind"] == "device"]
    samples = [r for r in recs if r["kind"] == "sample"]
    assert dev and dev[0]["name"].startswith("NVIDIA") and dev[0]["mem_total_bytes"] > 2**30
    assert dev[0]["power_limit_w"] > 50 and dev[0]["sm_clock_max_mhz"] > 500
    assert len(samples) >= 40  # 20 Hz for 3 s
    assert max(s["util_gpu_ratio"] for s in samples) >= 0.5  # torch kept it busy
    assert all(0.0 <= s["util_gpu_ratio"] <= 1.0 for s in samples)
    assert max(s["sm_clock_mhz"] for s in samples) > 500 and max(s["power_w"] for s in samples) > 50
    assert all(0 < s["mem_used_bytes"] <= s["mem_total_bytes"] for s in samples)
    assert 10 < samples[-1]["temp_c"] < 100
    if dev[0]["gpm_supported"]:  # Hopper and later: GPM ratios from the second sample on (NaN ones left out)
        gpm = [s for s in samples if "sm_util_ratio" in s]
        print(f"GPM readings in {len(gpm)} of {len(samples)} samples")
        assert len(gpm) >= len(samples) // 2
        assert max(s["sm_util_ratio"] for s in gpm) > 0.3
        assert all(0.0 <= s[k] <= 1.0 for s in gpm for k in GPM_KEYS if k in s)
    assert 1 <= len([s for s in samples if "pcie_tx_bytes_s" in s]) <= 5  # once a second (3 s)
    # the analysis side reads what the real probe wrote
    t = gpu_norm.tables(open_bundle(tmp_path / "b"))
    assert len(t["gpu_samples"]) == len(samples)
