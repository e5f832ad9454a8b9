"""Attribution that does not contradict itself (issue 38): "one variable changed (...)" is not claimed beside a
note that the host ran at a different speed, and nothing is attributed between runs that are not comparable."""

from __future__ import annotations

from pathlib import Path

from diagnose import compare as cmp
from diagnose.pipeline import analyze
from tests.test_compare import QUEUE, _reference_scaled, _rewrite


def test_a_changed_setting_with_host_drift_is_not_attributed_to_the_setting_alone(tmp_path: Path) -> None:
    slow = _reference_scaled(QUEUE, tmp_path / "slow", 1.6)
    _rewrite(slow, tmp_path / "b", manifest={"target": {"engine_config": {"max_model_len": 2048,
                                                                         "max_num_seqs": 16}}})
    c = cmp.compare(analyze(QUEUE), analyze(tmp_path / "b"), resamples=200)
    assert c.comparability["changed"] == [{"what": "engine_config.max_num_seqs", "a": 2, "b": 16}]
    assert c.comparability["host_drift"], c.comparability
    att = c.comparability["attribution"]
    assert not att.startswith("one variable changed") and "cannot be attributed to the setting alone" in att


def test_no_attribution_between_runs_that_are_not_comparable(tmp_path: Path) -> None:
    other = _rewrite(QUEUE, tmp_path / "other", manifest={"target": {"model": "another-model",
                                                                     "engine_config": {"max_model_len": 2048,
                                                                                       "max_num_seqs": 16}}})
    c = cmp.compare(analyze(QUEUE), analyze(other), resamples=200)
    assert not c.comparability["comparable"] and c.comparability["attribution"].startswith("not comparable")
