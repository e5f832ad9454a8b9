"""GPU normaliser: signals and sections from bundles recorded through the FAKE NVML."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from diagnose.analysis import Window
from diagnose.normalize import gpu
from diagnose.reports.sections.gpu import sections as gpu_sections
from tests.fakes.fake_nvml import scenario
from tests.test_nvml_probe import capture

RUN = Window(0.0, math.inf)


def sig(tmp_path: Path, name: str) -> dict[str, float]:
    _, b = capture(tmp_path, scenario(name), seconds=0.8)
    t = gpu.tables(b)
    return {s.name: s.value for s in gpu.signals(t, RUN)}


def test_busy_gpu(tmp_path: Path) -> None:
    s = sig(tmp_path, "busy")
    assert s["gpu_util_mean_ratio"] == pytest.approx(0.97)
    assert s["gpu_throttle_active_ratio"] == 0.0
    assert s["gpu_sm_clock_drop_ratio"] == pytest.approx(0.0)
    assert s["gpu_mem_used_max_ratio"] == pytest.approx(60 / 80)
    assert s["gpu_power_over_limit_ratio"] == pytest.approx(550 / 700)
    assert s["gpu_mem_bw_util_mean_ratio"] == pytest.approx(0.45)


def test_throttled_gpu(tmp_path: Path) -> None:
    s = sig(tmp_path, "throttled")
    assert s["gpu_throttle_active_ratio"] > 0.5
    assert s["gpu_sm_clock_drop_ratio"] == pytest.approx(1 - 1410 / 1980)
    assert s["gpu_temp_max_c"] == 89


def test_membw_bound(tmp_path: Path) -> None:
    s = sig(tmp_path, "membw_bound")
    assert s["gpu_mem_bw_util_mean_ratio"] == pytest.approx(0.91)
    assert s["gpu_sm_util_mean_ratio"] == pytest.approx(0.35)


def test_idle_gaps(tmp_path: Path) -> None:
    s = sig(tmp_path, "idle_gaps")
    assert 0.3 < s["gpu_util_mean_ratio"] < 0.6


def test_no_gpm_means_no_bandwidth_signal(tmp_path: Path) -> None:
    s = sig(tmp_path, "no_gpm")
    assert "gpu_mem_bw_util_mean_ratio" not in s and "gpu_util_mean_ratio" in s


def test_two_gpus_min(tmp_path: Path) -> None:
    s = sig(tmp_path, "two_gpus")
    assert s["gpu_util_min_ratio"] == pytest.approx(0.20)
    assert s["gpu_util_mean_ratio"] == pytest.approx(0.575, abs=0.02)


def test_no_stream_no_signals(tmp_path: Path) -> None:
    from diagnose.io.bundle import open_bundle
    from diagnose.io.writer import BundleWriter

    BundleWriter(tmp_path / "e").finish()
    t = gpu.tables(open_bundle(tmp_path / "e"))
    assert gpu.signals(t, RUN) == [] and gpu_sections(t) == []


def test_sections(tmp_path: Path) -> None:
    _, b = capture(tmp_path, scenario("throttled"), seconds=0.5)
    secs = {s.id: s for s in gpu_sections(gpu.tables(b))}
    row = secs["gpu_summary"].payload.rows[0]
    assert row[1] == "NVIDIA H100 80GB HBM3" and row[7].value == 1410.0 and row[7].unit == "MHz"
    assert "time fraction" in secs["gpu_summary"].payload.note
    names = [s.name for s in secs["gpu_timeline"].payload.series]
    assert "GPU 0 SM clock MHz" in names
