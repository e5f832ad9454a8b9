"""NVML probe against the FAKE NVML (tests/fakes/fake_nvml.py): this machine has no NVIDIA GPU."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from diagnose.io.bundle import open_bundle
from diagnose.io.writer import BundleWriter
from diagnose.probes.base import CaptureContext, Target
from diagnose.probes.nvml import NvmlProbe, throttle_names
from tests.fakes.fake_nvml import FakeGpu, FakeNvml, frame, recorded, scenario


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
    # PCIe throughput blocks ~21 ms per call on a real GPU: read on the first tick, then once per second
    pcie = [r for r in samples if "pcie_rx_bytes_s" in r]
    assert pcie[0] is samples[0] and pcie[0]["pcie_rx_bytes_s"] == 8000 * 1024
    assert len(pcie) == 1  # 0.6 s capture
    assert s["dram_bw_util_ratio"] == pytest.approx(0.45) and s["tensor_util_ratio"] == pytest.approx(0.60)
    assert "dram_bw_util_ratio" not in samples[0]  # GPM needs two samples
    procs = [r for r in recs if r["kind"] == "procs"]
    assert procs and procs[0]["procs"] == [{"pid": 4242, "used_bytes": 60 * 2**30}]
    assert not [r for r in recs if r["kind"] == "util"]  # buffered samples are off by default (slower)
    assert dev[0]["util_samples"] is False
    assert fake.shutdowns == fake.inits  # every nvmlInit is paired with nvmlShutdown


def test_pcie_read_once_per_interval(tmp_path: Path) -> None:
    status, b = capture(tmp_path, scenario("busy"), seconds=0.6, pcie_interval_s=0.2)
    samples = [r for r in b.records("gpu_samples") if r["kind"] == "sample"]
    with_pcie = [r for r in samples if "pcie_tx_bytes_s" in r]
    assert 2 <= len(with_pcie) <= 4 < len(samples)


def test_util_samples_on_request_start_at_the_capture(tmp_path: Path) -> None:
    import time

    fake = scenario("busy")
    fake.gpus[0].util_history.append((time.time_ns() // 1000 - 10_000_000, 3))  # in the driver's buffer from before
    status, b = capture(tmp_path, fake, util_samples=True)
    util = [r for r in b.records("gpu_samples") if r["kind"] == "util"]
    assert util and all(0 <= v <= 1 for r in util for v in r["util_gpu_ratio"])
    assert 0.03 not in [v for r in util for v in r["util_gpu_ratio"]]  # the sample from before the start is left out


def test_gpm_nan_is_left_out(tmp_path: Path) -> None:
    gpu = FakeGpu([frame(gpm={10: float("nan"), 2: 80.0, 3: 40.0, 5: 60.0})])
    status, b = capture(tmp_path, FakeNvml([gpu]))
    s = [r for r in b.records("gpu_samples") if r["kind"] == "sample"][-1]
    assert "dram_bw_util_ratio" not in s and s["sm_util_ratio"] == pytest.approx(0.8)


def test_unsupported_metrics_are_missing_not_zero(tmp_path: Path) -> None:
    gpu = FakeGpu([frame(gpm=None)], nvlink=False)
    status, b = capture(tmp_path, FakeNvml([gpu]))
    assert status.state == "ok"
    s = [r for r in b.records("gpu_samples") if r["kind"] == "sample"][-1]
    assert "dram_bw_util_ratio" not in s and "nvlink_tx_bytes" not in s
    assert "nvlink" in status.detail["unsupported"]


def test_throttle_names() -> None:
    assert throttle_names(0x40 | 0x1) == ["gpu_idle", "hw_thermal"]


H200 = Path(__file__).resolve().parent.parent / "sample_traces" / "h200_toy_idle_between_steps" / "bundle"


def test_replay_of_real_h200_samples(tmp_path: Path) -> None:
    """The probe over NVML values recorded on a real H200 (sample_traces/h200_*): every value comes back."""
    real = [r for r in open_bundle(H200).records("gpu_samples") if r["kind"] == "sample"]
    status, b = capture(tmp_path, recorded(H200), seconds=0.8)
    assert status.state == "ok" and status.detail["names"] == ["NVIDIA H200"]
    got = [r for r in b.records("gpu_samples") if r["kind"] == "sample"]
    assert 10 <= len(got) <= len(real)
    for r, g in zip(real, got, strict=False):  # the fake moves one recorded frame per sample
        for key in ("util_gpu_ratio", "sm_clock_mhz", "throttle_reasons", "power_w", "temp_c", "mem_used_bytes"):
            assert g[key] == pytest.approx(r[key], rel=1e-6, abs=2**30 / 2**20), key
    gpm = [(r, g) for r, g in zip(real[1:], got[1:], strict=False) if "sm_util_ratio" in r]
    assert gpm and all(g["sm_util_ratio"] == pytest.approx(r["sm_util_ratio"]) for r, g in gpm)
