"""Every signal name rules may use, with its unit and meaning.

Rules are linted against this vocabulary (`diagnose rules lint`), and a test checks that every signal the
normalisers emit on the shipped samples is listed here. Names carry their unit as a suffix.
"""

from __future__ import annotations

_PCTS = ("p50", "p90", "p95", "p99", "max")


def _lat(prefix: str, what: str, pcts: tuple[str, ...] = _PCTS) -> dict[str, str]:
    return {f"{prefix}_{p}_ms": f"{what}, {p.upper() if p != 'max' else 'max'} (ms)" for p in pcts}


SIGNALS: dict[str, str] = {
    # client (normalize/client.py)
    **_lat("ttft", "time to first token, client side"),
    **_lat("itl", "inter-token latency, pooled chunk gaps"),
    **_lat("tpot", "time per output token (E2E - TTFT)/(n - 1)", ("p50", "p90", "p95", "p99")),
    **_lat("e2e", "end-to-end request latency"),
    "itl_req_mean_p50_ms": "per-request mean ITL, P50 over requests (ms)",
    "itl_req_mean_p99_ms": "per-request mean ITL, P99 over requests (ms)",
    "output_tps": "system output tokens per second",
    "output_tps_per_req_p50": "per-request output tokens per second, P50",
    "request_rps": "completed requests per second",
    "error_rate_ratio": "share of measured requests that failed",
    "http_429_ratio": "share of measured requests rejected with HTTP 429",
    "goodput_rps": "requests per second that met every SLO term",
    "goodput_ratio": "share of requests that met every SLO term",
    "requests_measured": "requests in the statistics (warm-up excluded)",
    "requests_total": "all requests sent",
    "requests_excluded_profiler": "requests overlapping the engine profiler's window, left out of the statistics",
    "requests_excluded_client_stall": "requests touched by a short load-client stall, left out of the statistics",
    "profiler_window_s": "length of the engine profiler's window excluded from the statistics (s)",
    "prompt_tokens_mean": "mean prompt tokens per request",
    "output_tokens_mean": "mean output tokens per request",
    "client_schedule_lag_p99_ms": "client send lateness vs the schedule, P99 (ms)",
    "client_loop_lag_p99_ms": "client event-loop lag, P99 (ms)",
    "client_cpu_max_percent": "client process CPU, max (% of one core)",
    "client_bound_ratio": "1 when the load client was the bottleneck",
    "ttft_cold_ratio": "TTFT of the first requests / warm TTFT",
    "slo_ttft_p50_ms": "SLO asked", "slo_ttft_p90_ms": "SLO asked", "slo_ttft_p95_ms": "SLO asked",
    "slo_ttft_p99_ms": "SLO asked", "slo_ttft_max_ms": "SLO asked",
    "slo_itl_p50_ms": "SLO asked", "slo_itl_p90_ms": "SLO asked", "slo_itl_p95_ms": "SLO asked",
    "slo_itl_p99_ms": "SLO asked", "slo_itl_max_ms": "SLO asked",
    "slo_tpot_p50_ms": "SLO asked", "slo_tpot_p90_ms": "SLO asked", "slo_tpot_p95_ms": "SLO asked",
    "slo_tpot_p99_ms": "SLO asked", "slo_tpot_max_ms": "SLO asked",
    "slo_e2e_p50_ms": "SLO asked", "slo_e2e_p90_ms": "SLO asked", "slo_e2e_p95_ms": "SLO asked",
    "slo_e2e_p99_ms": "SLO asked", "slo_e2e_max_ms": "SLO asked",
    "sweep_levels": "number of load levels in a sweep",
    "sweep_ttft_p50_growth_ratio": "TTFT P50 at the highest / lowest load level",
    "sweep_itl_p50_growth_ratio": "ITL P50 at the highest / lowest load level",
    "sweep_output_tps_growth_ratio": "output tok/s at the highest / lowest load level",
    "sweep_load_growth_ratio": "highest / lowest offered load",
    # derived (normalize/derived.py)
    "ttft_over_slo_ratio": "measured TTFT / its SLO (worst SLO term)",
    "itl_over_slo_ratio": "measured ITL / its SLO (worst SLO term)",
    "tpot_over_slo_ratio": "measured TPOT / its SLO (worst SLO term)",
    "e2e_over_slo_ratio": "measured E2E / its SLO (worst SLO term)",
    "baseline_ttft_p50_ms": "TTFT P50 of the baseline (baseline phase or lowest load level) (ms)",
    "baseline_itl_p50_ms": "ITL P50 of the baseline (ms)",
    "ttft_vs_baseline_ratio": "TTFT P50 at the highest load / baseline",
    "itl_vs_baseline_ratio": "ITL P50 at the highest load / baseline",
    "tps_vs_baseline_ratio": "output tok/s at the highest load / baseline",
    "load_vs_baseline_ratio": "offered load at the highest level / baseline",
    "tail_slo_ratio_top": "worst SLO term / limit at the highest load level",
    "tail_slo_ratio_bottom": "worst SLO term / limit at the lowest load level",
    # server metrics (normalize/prometheus.py)
    "queue_depth_mean": "requests waiting in the server queue, mean over scrapes",
    "queue_depth_max": "requests waiting, max",
    "running_requests_mean": "requests in the running batch, mean",
    "running_requests_max": "requests in the running batch, max",
    "kv_usage_mean_ratio": "KV-cache usage, mean (0-1)",
    "kv_usage_max_ratio": "KV-cache usage, max (0-1)",
    "prefix_cache_hit_ratio": "prefix-cache hit tokens / queried tokens over the window",
    "preemptions_total": "preemptions over the window",
    "server_ttft_p50_ms": "server TTFT histogram P50 (ms)",
    "server_ttft_p99_ms": "server TTFT histogram P99 (ms)",
    "server_queue_time_p50_ms": "server queue time P50 (ms)",
    "server_queue_time_p99_ms": "server queue time P99 (ms)",
    "server_queue_time_mean_ms": "server queue time mean (ms)",
    "server_prefill_time_p50_ms": "server prefill time P50 (ms)",
    "server_prefill_time_p99_ms": "server prefill time P99 (ms)",
    "server_prefill_time_mean_ms": "server prefill time mean (ms)",
    "server_decode_time_mean_ms": "server decode time per request, mean (ms)",
    "server_itl_p50_ms": "server inter-token latency P50 (ms)",
    "server_itl_p99_ms": "server inter-token latency P99 (ms)",
    "batch_tokens_per_step_mean": "tokens per engine step, mean",
    "max_num_seqs": "the engine's batch-size cap (from its config info)",
    "rejected_requests_total": "requests rejected by admission control over the window",
    "server_queue_share_of_ttft_ratio": "server queue time / server TTFT (means over the window)",
    # otel join (normalize/otel.py)
    "join_matched_ratio": "share of client requests joined to a server span",
    "ttft_queue_share_ratio": "share of client TTFT spent queued (joined spans)",
    "ttft_prefill_share_ratio": "share of client TTFT spent in prefill (joined spans)",
    "ttft_frontend_share_ratio": "share of client TTFT spent in the server frontend (joined spans)",
    "ttft_client_network_share_ratio": "share of client TTFT spent in client and network (joined spans)",
    "span_queue_time_p99_ms": "server span queue time P99 (ms)",
    "span_prefill_time_p99_ms": "server span prefill time P99 (ms)",
    # host (normalize/host.py)
    "host_thread_saturated_max_ratio": "busiest engine Python thread's on-CPU share of one core",
    "host_spin_wait_share_ratio": "share of engine samples in spin-wait",
    "host_gil_held_ratio": "share of py-spy dump snapshots in which an engine thread held the GIL",
    "host_cpu_steal_or_contention_ratio": "run-queue wait / (run + wait) of engine threads",
    # gpu (normalize/gpu.py)
    "gpu_util_mean_ratio": "NVML utilisation.gpu time fraction, mean",
    "gpu_util_min_ratio": "NVML utilisation.gpu time fraction, min",
    "gpu_mem_bw_util_mean_ratio": "DRAM bandwidth utilisation, mean",
    "gpu_throttle_active_ratio": "share of samples with a non-idle clock-throttle reason",
    "gpu_mem_used_max_ratio": "GPU memory used / total, max",
    "gpu_power_over_limit_ratio": "power / power limit, max",
    "gpu_sm_clock_drop_ratio": "1 - min SM clock / max SM clock",
    # appended by the rule catalog (issue 5)
    "kv_capacity_tokens": "KV-cache capacity in tokens (server configuration)",
    "server_ttft_mean_ms": "server TTFT mean (ms)",
    "workload_shared_prefix_ratio": "share of each prompt that is a prefix common to all requests (workload spec)",
    "warmup_requests": "warm-up requests excluded from the statistics at the start of the capture (workload spec)",
}

# Families of names built from a pattern (host categories, trace analysis): any name with one of these
# prefixes and a unit suffix is accepted by lint, and listed by the normaliser's own docs.
PREFIXES: tuple[str, ...] = ("host_", "gpu_", "trace_", "span_", "server_")
UNIT_SUFFIXES: tuple[str, ...] = ("_ms", "_s", "_ratio", "_total", "_mean", "_max", "_min", "_percent", "_bytes",
                                  "_tps", "_rps", "_count", "_gbps", "_us")


def is_known(name: str) -> bool:
    if name in SIGNALS:
        return True
    return name.startswith(PREFIXES) and name.endswith(UNIT_SUFFIXES)
