"""NVML probe against the FAKE NVML (tests/fakes/fake_nvml.py): this machine has no NVIDIA GPU."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.nvml import NvmlProbe, throttle_names

from diagnose.bundle import BundleWriter, open_bundle
from tests.fakes.fake_nvml import FakeGpu, FakeNvml, frame, scenario


def capture(tmp_path: Path, nvml: FakeNvml | None, seconds: float = 0.6, **kw: object) -> tuple:
    bw = BundleWriter(tmp_path / "b")
    ctx = CaptureContext(bundle=bw, target=Target(url="http://127.0.0.1:9"), stop=asyncio.Event())
    probe = NvmlProbe(rate_hz=50, nvml=nvml, **kw)  # type: ignore[arg-type]

    async def go() -> object:
        async def stop() -> None:
            await asyncio.sleep(seconds)
            ctx.stop.set()
        st, _ = await asyncio.gather(probe.run(ctx), stop())
        return st

    status = asyncio.run(go())
    bw.set_probe_status(status)  # type: ignore[arg-type]
    bw.finish()
    return status, open_bundle(tmp_path / "b")


def test_no_driver_is_unavailable_with_reason(tmp_path: Path) -> None:
    status, b = capture(tmp_path, FakeNvml(driver=False), seconds=0.05)
    assert status.state == "unavailable"
    assert "NVML Shared Library Not Found" in status.reason
    assert not b.has_stream("gpu_samples")


def test_real_pynvml_without_driver_is_unavailable(tmp_path: Path) -> None:
    pytest.importorskip("pynvml")
    status, _ = capture(tmp_path, None, seconds=0.05)
    if status.state == "ok":  # pragma: no cover - only on a machine with a GPU
        pytest.skip("this machine has an NVIDIA driver")
    assert status.state == "unavailable"
    assert status.reason


def test_no_gpu_is_unavailable(tmp_path: Path) -> None:
    status, _ = capture(tmp_path, FakeNvml([]), seconds=0.05)
    assert (status.state, status.reason) == ("unavailable", "NVML found no GPU")


def test_samples_all_counters(tmp_path: Path) -> None:
    fake = scenario("busy")
    status, b = capture(tmp_path, fake)
    assert status.state == "ok", status.reason
    recs = b.records("gpu_samples")
    dev = [r for r in recs if r["kind"] == "device"]
    samples = [r for r in recs if r["kind"] == "sample"]
    assert dev[0]["name"] == "NVIDIA H100 80GB HBM3" and dev[0]["gpm_supported"] is True
    assert dev[0]["power_limit_w"] == 700.0 and dev[0]["sm_clock_max_mhz"] == 1980
    assert len(samples) >= 10
    s = samples[-1]
    assert s["util_gpu_ratio"] == pytest.approx(0.97)
    assert s["power_w"] == pytest.approx(550.0) and s["temp_c"] == 65
    assert s["pcie_rx_bytes_s"] == 8000 * 1024
    assert s["dram_bw_util_ratio"] == pytest.approx(0.45) and s["tensor_util_ratio"] == pytest.approx(0.60)
    assert "dram_bw_util_ratio" not in samples[0]  # GPM needs two samples
    procs = [r for r in recs if r["kind"] == "procs"]
    assert procs and procs[0]["procs"] == [{"pid": 4242, "used_bytes": 60 * 2**30}]
    util = [r for r in recs if r["kind"] == "util"]
    assert util and all(0 <= v <= 1 for v in util[0]["util_gpu_ratio"])
    assert fake.shutdowns == fake.inits  # every nvmlInit is paired with nvmlShutdown


def test_unsupported_metrics_are_missing_not_zero(tmp_path: Path) -> None:
    gpu = FakeGpu([frame(gpm=None)], nvlink=False)
    status, b = capture(tmp_path, FakeNvml([gpu]))
    assert status.state == "ok"
    s = [r for r in b.records("gpu_samples") if r["kind"] == "sample"][-1]
    assert "dram_bw_util_ratio" not in s and "nvlink_tx_bytes" not in s
    assert "nvlink" in status.detail["unsupported"]


def test_throttle_names() -> None:
    assert throttle_names(0x40 | 0x1) == ["gpu_idle", "hw_thermal"]
