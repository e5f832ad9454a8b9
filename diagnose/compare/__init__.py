"""Two runs side by side (docs/compare.md): the samples of each load level and their bootstrap intervals
(samples), the per-metric differences, comparability and the findings diff (core), did an experiment move what
its hypothesis says (verify), the CI gate (gate) and prices (cost). The names below are the package's API."""

from diagnose.compare.core import (
    HOST_DRIFT_MIN,
    NOISE,
    Comparison,
    LevelDiff,
    MetricDiff,
    check_noise,
    check_options,
    compare,
    diff_metric,
    parse_cost,
    recorded_prices,
    reference_drift,
    run_interval,
)
from diagnose.compare.samples import (
    METRIC_BY_NAME,
    METRICS,
    LevelSample,
    MetricDef,
    bootstrap,
    level_sample,
    point,
    pooled,
    run_levels,
    spread,
    student_t_cdf,
    student_t_ppf,
)
from diagnose.compare.verify import OCCUPANCY, Move, Verification, occupancy_outcome, verify

__all__ = [
    "HOST_DRIFT_MIN", "METRICS", "METRIC_BY_NAME", "NOISE", "OCCUPANCY", "Comparison", "LevelDiff", "LevelSample",
    "MetricDef", "MetricDiff", "Move", "Verification", "bootstrap", "check_noise", "check_options", "compare",
    "diff_metric", "level_sample", "occupancy_outcome", "parse_cost", "point", "pooled", "recorded_prices",
    "reference_drift", "run_interval", "run_levels", "spread", "student_t_cdf", "student_t_ppf", "verify",
]
