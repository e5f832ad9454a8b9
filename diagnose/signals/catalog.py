"""Every signal, declared once: name, unit, source, producer and meaning.

Rules may use only names declared here: `diagnose rules lint` rejects any other name (an exact match, no
prefix or suffix patterns). tests/test_signal_catalog.py runs every producer over every shipped sample and
trace (plus small synthetic inputs for the paths no sample takes) and checks both ways: each emitted signal is
declared with the unit, source and producer it was emitted with, and each declared signal is emitted by its
producer.

Families (percentiles, SLO terms, histogram quantiles, host categories) are generated below from explicit
lists; every name they generate is an exact entry. Adding a signal to a normaliser means adding it here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from diagnose.model import Source


@dataclass(frozen=True)
class SignalSpec:
    name: str
    unit: str  # the unit the producer emits (Signal.unit)
    source: Source  # Signal.source
    producer: str  # the module that computes it
    description: str


CLIENT = "diagnose.normalize.client"
DERIVED = "diagnose.normalize.derived"
PROMETHEUS = "diagnose.normalize.prometheus"
OTEL = "diagnose.normalize.otel"
HOST = "diagnose.normalize.host"
GPU = "diagnose.normalize.gpu"
TRACE = "diagnose.trace.signals"  # normalize/trace.py passes these through for a bundle
FLEET = "diagnose.normalize.fleet"
SLOTS = "diagnose.normalize.slots"
ATTRIBUTION = "diagnose.normalize.attribution"
TASKS = "diagnose.normalize.tasks"
READINESS = "diagnose.readiness.signals"

PCTS: tuple[str, ...] = ("p50", "p90", "p95", "p99", "max")
SLO_METRICS: tuple[str, ...] = ("ttft", "itl", "tpot", "e2e")
# host_<category>_cpu_share_ratio: the categories of diagnose/normalize/host_stacks.py CATEGORIES
HOST_CATEGORIES: tuple[str, ...] = (
    "http_serialization", "tokenization", "detokenization", "request_processing", "scheduling",
    "model_forward", "sampling", "ipc", "event_loop", "waiting", "spin_wait", "native", "other",
)
# server_<stem>_p<N>_ms (+ _bucket_lo_ms, _bucket_hi_ms) and server_<stem>_mean_ms: the histograms of
# diagnose/normalize/prometheus.py _HISTOGRAM_SIGNALS as (stem, percentiles, has a mean, what)
SERVER_HISTOGRAMS: tuple[tuple[str, tuple[int, ...], bool, str], ...] = (
    ("ttft", (50, 90, 99), True, "server TTFT (engine's own start point)"),
    ("queue_time", (50, 99), True, "server queue time"),
    ("prefill_time", (50, 99), True, "server prefill time"),
    ("decode_time", (), True, "server decode time per request"),
    ("itl", (50, 99), False, "server inter-token latency"),
    ("e2e", (50, 99), False, "server end-to-end latency"),
)
# the engine settings that become signals (from the server's info or command line): the keys and units of
# diagnose/normalize/prometheus.py ENGINE_SETTINGS, as (name, unit, what)
ENGINE_SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("max_num_seqs", "requests", "the batch-size cap (running requests)"),
    ("max_num_batched_tokens", "tokens", "tokens per engine step, cap"),
    ("kv_capacity_tokens", "tokens", "KV-cache capacity in tokens"),
    ("kv_block_size_tokens", "tokens", "KV-cache block size in tokens"),
    ("kv_blocks", "blocks", "KV-cache blocks"),
    ("prefix_caching", "flag", "prefix caching on (1) or off (0)"),
    ("chunked_prefill", "flag", "chunked prefill on (1) or off (0)"),
    ("cuda_graphs", "flag", "CUDA graphs on (1) or off (0, eager)"),
    ("tensor_parallel_size", "ranks", "tensor-parallel size"),
    ("max_model_len", "tokens", "maximum model length"),
    ("context_size", "tokens", "context size (llama.cpp)"),
    ("max_concurrent_requests", "requests", "maximum concurrent requests (TGI)"),
    ("max_batch_total_tokens", "tokens", "maximum tokens in a batch (TGI)"),
    ("threads", "threads", "engine threads (llama.cpp)"),
    ("continuous_batching", "flag", "continuous batching on (1) or off (0; llama.cpp --no-cont-batching)"),
    ("ubatch_tokens", "tokens", "physical batch size in tokens (llama.cpp --ubatch-size)"),
    ("sampling_top_k", "tokens", "the server's default top-k (llama.cpp --top-k; 0 = disabled: the whole vocabulary is sorted)"),
    ("constrained_decoding", "flag", "a grammar or JSON schema constrains every generation by default (llama.cpp --grammar, --json-schema)"),
)
# span_<stem>_p50_ms / _p99_ms from the engine's request spans (diagnose/normalize/otel.py)
SPAN_STEMS: tuple[tuple[str, str], ...] = (
    ("queue_time", "queue time"), ("prefill_time", "prefill time"), ("decode_time", "decode time"),
    ("frontend_time", "frontend time (TTFT - queue - prefill)"), ("ttft", "server TTFT"),
)

_Entry = tuple[str, str, str]  # name, unit, description
# diagnose/normalize/errors.py CLASSES, with what each means
_ERROR_CLASSES: tuple[tuple[str, str], ...] = (
    ("context_overflow", "the request does not fit the server's context (the error body says so)"),
    ("rate_limited", "rate limited (HTTP 429)"),
    ("auth", "authentication refused (HTTP 401/403)"),
    ("model_not_found", "model not found (HTTP 404, or a body saying the model does not exist)"),
    ("invalid_request", "refused as invalid (any other HTTP 4xx)"),
    ("server_timeout", "the server or a gateway timed out (HTTP 408/504)"),
    ("server_error", "server error (any other HTTP 5xx)"),
    ("connection_lost", "connection reset, refused or not made (the server stopped answering)"),
    ("client_timeout", "no answer within the load client's request timeout"),
    ("stream_broken", "an answer that was not a well-formed event stream"),
)


def _pct_label(p: str) -> str:
    return "max" if p == "max" else p.upper()


def _lat(prefix: str, what: str, pcts: Iterable[str] = PCTS) -> list[_Entry]:
    return [(f"{prefix}_{p}_ms", "ms", f"{what}, {_pct_label(p)} (ms)") for p in pcts]


def _server_histograms() -> list[_Entry]:
    out: list[_Entry] = []
    for stem, pcts, mean, what in SERVER_HISTOGRAMS:
        for p in pcts:
            out += [(f"server_{stem}_p{p}_ms", "ms", f"{what} P{p} from the engine's histogram (ms)"),
                    (f"server_{stem}_p{p}_bucket_lo_ms", "ms", f"lower bound of the bucket holding {what} P{p} (ms)"),
                    (f"server_{stem}_p{p}_bucket_hi_ms", "ms", f"upper bound of the bucket holding {what} P{p} (ms)")]
        if mean:
            out.append((f"server_{stem}_mean_ms", "ms", f"{what} mean, histogram _sum / _count (ms)"))
    return out


_CLIENT: list[_Entry] = [
    *_lat("ttft", "time to first token, client side"),
    *_lat("itl", "inter-token latency, pooled chunk gaps"),
    *_lat("tpot", "time per output token (E2E - TTFT)/(n - 1)", ("p50", "p90", "p95", "p99")),
    *_lat("e2e", "end-to-end request latency"),
    ("itl_req_mean_p50_ms", "ms", "per-request mean ITL, P50 over requests (ms)"),
    ("itl_req_mean_p99_ms", "ms", "per-request mean ITL, P99 over requests (ms)"),
    ("output_tps", "tok/s", "system output tokens per second"),
    ("output_tps_per_req_p50", "tok/s", "per-request output tokens per second, P50"),
    ("request_rps", "req/s", "completed requests per second"),
    ("error_rate_ratio", "ratio", "share of measured requests that failed"),
    ("http_429_ratio", "ratio", "share of measured requests rejected with HTTP 429"),
    ("goodput_rps", "req/s", "requests per second that met every SLO term"),
    ("goodput_ratio", "ratio", "share of requests that met every SLO term"),
    ("requests_measured", "requests", "requests in the statistics (warm-up excluded)"),
    ("ttft_p50_itl_ratio", "ratio", "TTFT P50 / ITL P50: how many decode steps' time the first token takes"),
    ("workload_open_loop", "flag", "1: the window's measured phases send at a rate (open loop); 0: at a concurrency"),
    ("arrival_gap_cv_ratio", "ratio", "open loop: coefficient of variation of the gaps between sends (Poisson 1)"),
    ("burst_tail_share_ratio", "ratio", "open loop: of the TTFT tail's excess over the median (requests at or above "
     "the P90), the share carried by requests sent in a burst (while the client had more than twice its mean in "
     "flight)"),
    ("client_in_flight_mean", "requests", "requests the client had in flight, time-weighted (summed send-to-end time / the window's span)"),
    ("requests_total", "requests", "all requests sent"),
    ("requests_excluded_profiler", "requests",
     "requests overlapping the engine profiler's window, left out of the statistics"),
    ("requests_excluded_client_stall", "requests",
     "requests touched by a short load-client stall, left out of the statistics"),
    ("profiler_window_s", "s", "length of the engine profiler's window excluded from the statistics (s)"),
    ("prompt_tokens_mean", "tokens", "mean prompt tokens per request"),
    ("output_tokens_mean", "tokens", "mean output tokens per request"),
    ("output_tokens_asked_mean", "tokens", "mean max_tokens the requests asked for"),
    ("stream_bytes_per_token_mean", "bytes", "bytes of the streamed answers (HTTP body, chunk framing included) per "
     "output token: what the server serialises and sends for each token"),
    ("output_cut_share_ratio", "ratio", "share of the requests the server ended for length with under 90% of the "
     "tokens they asked for (cut short by the context, not by max_tokens)"),
    ("client_schedule_lag_p99_ms", "ms", "client send lateness vs the schedule, P99 (ms)"),
    ("client_loop_lag_p99_ms", "ms", "client event-loop lag, P99 (ms); series: every self-check sample"),
    ("client_cpu_max_percent", "percent",
     "client process CPU, max (% of one core); series: every self-check sample (rules judge its share)"),
    ("ttft_cold_ratio", "ratio", "TTFT of the first requests / warm TTFT"),
    ("ttft_cold_p50_ms", "ms", "TTFT P50 of the capture's first 3 requests (its first phase, warm-up included)"),
    ("ttft_warm_p50_ms", "ms", "TTFT P50 of the rest of the capture's first phase (after its first 3 requests)"),
    *[(f"slo_{m}_{p}_ms", "ms", f"SLO asked: {m.upper()} {_pct_label(p)} (ms)") for m in SLO_METRICS for p in PCTS],
    ("sweep_levels", "levels", "number of load levels in a sweep"),
    ("sweep_ttft_p50_growth_ratio", "ratio", "TTFT P50 at the highest / lowest load level"),
    ("sweep_itl_p50_growth_ratio", "ratio", "ITL P50 at the highest / lowest load level"),
    ("sweep_output_tps_growth_ratio", "ratio", "output tok/s at the highest / lowest load level"),
    ("sweep_load_growth_ratio", "ratio", "highest / lowest offered load"),
    ("workload_shared_prefix_ratio", "ratio",
     "share of each prompt that is a prefix common to all requests (workload spec), or, where larger, the mean "
     "share of a multi-turn request's prompt that repeats its conversation so far (the previous turn's prompt "
     "and answer; a first turn 0)"),
    ("workload_logprobs_tokens", "tokens",
     "the most likely alternatives whose log-probabilities each request asked for with every output token "
     "(attach --logprobs N, workload spec; 0: the sampled token's own; absent: none asked)"),
    ("warmup_requests", "requests",
     "warm-up requests excluded from the statistics at the start of the capture (workload spec)"),
    # the failed requests by class (diagnose/normalize/errors.py; present when at least one request failed)
    *[(f"error_{c}_ratio", "ratio", f"share of the finished requests that failed with: {what}")
      for c, what in _ERROR_CLASSES],
    *[(f"error_{c}_requests", "requests", f"requests that failed with: {what} (the signal's label in a finding "
       "is the server's last such answer, redacted and shortened)") for c, what in _ERROR_CLASSES],
    ("error_main_share_ratio", "ratio", "share of the failed requests in the most common error class (its label "
     "in a finding names the class, with the sizes of a context overflow)"),
    ("error_context_limit_tokens", "tokens", "the context a request had to fit in, as the context-overflow "
     "answers state it (median; llama.cpp states a slot's share of its context)"),
    ("error_context_request_tokens", "tokens", "the tokens a request needed, as the context-overflow answers state "
     "them (median: prompt, plus max_tokens where the server counts it)"),
    ("error_retry_after_s", "s", "the longest Retry-After the server sent with a rate limit (s)"),
    ("server_lost_at_s", "s", "when the first connection was reset or refused, seconds after the load's first "
     "request (the server, or a proxy before it, stopped answering)"),
    ("server_back_at_s", "s", "when the server answered again after it stopped: the first request sent after "
     "the loss that succeeded, seconds after the load's first request"),
]

_DERIVED: list[_Entry] = [
    ("context_wanted_tokens", "tokens", "the context setting that lets the requests finish as asked: prompt + "
     "max_tokens (means), times the slots where the context is split between fixed slots (llama.cpp)"),
    ("itl_split_decode_ratio", "ratio", "share of the ITL P50 a decode step alone takes (the baseline's ITL P50)"),
    ("kv_demand_ratio", "ratio", "KV tokens the peak of running requests needs at full length (running max x "
     "(prompt + output tokens, means)) / KV-cache capacity"),
    ("kv_offered_demand_ratio", "ratio", "KV tokens the requests the client kept in flight need at full length "
     "(in flight mean x (prompt + output tokens, means)) / KV-cache capacity"),
    ("itl_split_engine_load_ratio", "ratio", "share of the ITL P50 the engine under load adds (server ITL P50 above "
     "a decode step alone: the batch, prefill chunks and preemption sharing its steps)"),
    ("itl_split_outside_ratio", "ratio", "share of the ITL P50 outside the engine (client ITL P50 above the "
     "server's: API server streaming, network, client)"),
    *[(f"{m}_over_slo_ratio", "ratio", f"measured {m.upper()} / its SLO (worst SLO term)") for m in SLO_METRICS],
    ("baseline_ttft_p50_ms", "ms", "TTFT P50 of the baseline (baseline phase or lowest load level) (ms)"),
    ("baseline_itl_p50_ms", "ms", "ITL P50 of the baseline (ms)"),
    ("ttft_vs_baseline_ratio", "ratio", "TTFT P50 at the highest load / baseline"),
    ("itl_vs_baseline_ratio", "ratio", "ITL P50 at the highest load / baseline"),
    ("tps_vs_baseline_ratio", "ratio", "output tok/s at the highest load / baseline"),
    ("offered_concurrency", "requests", "the closed loop's concurrency at the highest measured level"),
    ("load_vs_baseline_ratio", "ratio", "offered load at the highest level / baseline, like with like (requests "
     "in flight when a rate is compared with a concurrency)"),
    ("tail_slo_ratio_top", "ratio", "worst SLO term / limit at the highest load level"),
    ("tail_slo_ratio_bottom", "ratio", "worst SLO term / limit at the lowest load level"),
]

_PROMETHEUS: list[_Entry] = [
    ("queue_depth_mean", "requests", "requests waiting in the server queue, time-weighted mean (Little's law "
     "from the queue-time histogram sum; the gauge's mean over scrapes without one)"),
    ("queue_depth_max", "requests", "requests waiting, max"),
    ("api_server_in_flight_mean", "requests", "requests in flight outside the engine's queue and batch (client in "
     "flight - engine waiting - engine running, all by Little's law): API server and network"),
    ("api_server_in_flight_share_ratio", "ratio", "share of the client's in-flight requests outside the engine"),
    ("server_ttft_split_queue_ratio", "ratio", "queue time's share of the client's mean TTFT (server histogram sums)"),
    ("server_ttft_split_engine_ratio", "ratio", "the engine's share (queue + prefill) of the client's mean TTFT "
     "(server histogram sums)"),
    ("server_ttft_split_prefill_ratio", "ratio", "prefill's share of the client's mean TTFT (server histogram sums)"),
    ("server_ttft_split_outside_ratio", "ratio", "the rest of the client's mean TTFT: API server, network, client "
     "(1 - queue - prefill shares)"),
    ("running_requests_mean", "requests", "requests in the running batch, time-weighted mean (Little's law from "
     "the prefill + decode histogram sums; the gauge's mean over scrapes without them)"),
    ("running_requests_max", "requests", "requests in the running batch, max"),
    ("kv_usage_mean_ratio", "ratio", "KV-cache usage, mean (0-1)"),
    ("kv_usage_max_ratio", "ratio", "KV-cache usage, max (0-1)"),
    ("prefix_cache_hit_ratio", "ratio", "prefix-cache hit tokens / queried tokens over the window"),
    ("preemptions_total", "events", "preemptions over the window"),
    ("rejected_requests_total", "requests", "requests rejected by admission control over the window"),
    *_server_histograms(),
    ("server_queue_share_of_ttft_ratio", "ratio", "server queue time / server TTFT (means over the window); an "
     "engine with a queue gauge but no queue-time histogram (llama.cpp): the mean wait by Little's law / the "
     "client's mean TTFT"),
    ("server_output_tps", "tokens/s", "server generated tokens per second (counter rate)"),
    ("metrics_window_coverage_ratio", "ratio", "share of the window between the first and the last metrics "
     "scrape (below 0.8 the window gets no other server figure)"),
    ("server_requests_before_capture", "requests", "requests the server had finished before the capture began "
     "(its counter at the first scrape; 0: a cold server)"),
    ("server_process_cpu_ratio", "cores", "API-server process CPU time per second (1.0 = one core busy)"),
    ("server_ttft_client_gap_mean_ms", "ms",
     "client mean TTFT - server mean TTFT: time outside the engine's TTFT interval (ms)"),
    ("server_ttft_client_gap_share_ratio", "ratio", "(client mean TTFT - server mean TTFT) / client mean TTFT: the "
     "share of the client's TTFT outside the engine's TTFT interval (network, proxy, HTTP, streaming, the client)"),
    ("batch_tokens_per_step_mean", "tokens", "tokens per output step, mean (a prompt counts whole in the step of "
     "its first token: not a measure of prefill chunks or of the token budget)"),
    *[(name, unit, f"engine setting: {what}") for name, unit, what in ENGINE_SETTINGS],
]

_OTEL: list[_Entry] = [
    ("join_matched_ratio", "ratio", "share of client requests joined to a server span"),
    ("ttft_queue_share_ratio", "ratio", "share of client TTFT spent queued (joined spans)"),
    ("ttft_prefill_share_ratio", "ratio", "share of client TTFT spent in prefill (joined spans)"),
    *[(f"ttft_tail_{part}_share_ratio", "ratio", f"share of the slow requests' TTFT spent {what} (joined spans; the "
       "requests at or above the percentile of the TTFT SLO, else the P90)")
      for part, what in (("queue", "queued"), ("prefill", "in prefill"), ("frontend", "in the server frontend"),
                         ("client_network", "in client and network"))],
    ("ttft_engine_share_ratio", "ratio", "share of client TTFT spent in the engine, queued or in prefill (joined "
     "spans)"),
    ("ttft_frontend_share_ratio", "ratio", "share of client TTFT spent in the server frontend (joined spans)"),
    ("ttft_client_network_share_ratio", "ratio", "share of client TTFT spent in client and network (joined spans)"),
    ("ttft_client_network_p50_ms", "ms", "client TTFT - the engine's own TTFT, per joined request, P50: time "
     "between client and server (network, proxy, TLS, HTTP before arrival, streaming out, the client) (ms)"),
    ("span_requests_count", "count", "server request spans in the window"),
    *[(f"span_{stem}_{p}_ms", "ms", f"server span {what} {p.upper()} (ms)")
      for stem, what in SPAN_STEMS for p in ("p50", "p99")],
]

_HOST: list[_Entry] = [
    ("host_engine_cores_allowed", "cores", "cores the engine's processes may run on (CPU affinity; the most any one "
     "of them may use)"),
    *[(f"host_{cat}_cpu_share_ratio", "ratio", f"share of the engine processes' CPU time in category {cat}")
      for cat in HOST_CATEGORIES],
    ("host_spin_wait_share_ratio", "ratio", "share of the engine processes' CPU time spent spin-waiting"),
    ("host_thread_busy_max_ratio", "ratio", "busiest engine thread's CPU share of one core, spin-wait included"),
    ("host_thread_saturated_max_ratio", "ratio", "busiest engine Python thread's on-CPU share of one core"),
    ("host_engine_cpu_cores_mean", "cores", "CPU used by all engine processes (cores)"),
    # run-queue wait (schedstat: time runnable but not on a CPU) as wait / (run + wait). Who counts
    # (normalize/host.py thread_wait): "working" threads are engine threads on a CPU >= 2% of a core and
    # runnable >= 5% of the time that are not poll/yield loops; poll/yield loops are every thread of vLLM's
    # EngineCore process (its busy loop calls sched_yield, so its wait is high on an idle machine too: failure
    # class 6 of issue 10) and any thread with >= 50% of its py-spy samples in spin_wait/waiting.
    ("host_run_queue_wait_ratio", "ratio",
     "run-queue wait / (run + wait) of every engine thread runnable >= 5% of the time, poll loops included "
     "(for comparison only: no rule judges it)"),
    ("host_work_wait_ratio", "ratio",
     "run-queue wait / (run + wait) of the engine's working threads (worker compute threads, API-server threads; "
     "poll/yield loops and background pollers excluded): the CPU contention the engine's work suffered"),
    ("host_worker_wait_ratio", "ratio", "run-queue wait / (run + wait) of a worker process's working threads "
     "(the worst worker process)"),
    ("host_api_server_wait_ratio", "ratio", "run-queue wait / (run + wait) of the API server process's working "
     "threads"),
    ("host_poll_loop_wait_ratio", "ratio", "run-queue wait / (run + wait) of the engine's poll/yield loops "
     "(EngineCore busy loop, spin-wait threads): high by design, never judged"),
    ("host_victim_wait_ratio", "ratio", "run-queue wait / (run + wait) of the working thread that lost the most "
     "time waiting; its description names the thread, its process and its core"),
    ("host_foreign_cpu_cores", "cores", "CPU used by the busiest processes outside the engine's process tree "
     "(the probe's top 5 per scan above 5% of a core; diagnose's own processes included and marked)"),
    ("host_competitor_core_ratio", "ratio", "share of the victim thread's core used by the busiest process outside "
     "the engine (all its CPU when the victim's core is unknown); 0 when the probe scanned and found none; its "
     "description names the process (pid, name)"),
    ("host_loop_competitor_core_ratio", "ratio", "share of the core of one of the engine's poll/yield loops "
     "(EngineCore's scheduler loop) used by the busiest process outside the engine, the loop whose core is most "
     "taken; 0 when the probe scanned and found none; its description names the process and the loop"),
    ("host_cpu_steal_ratio", "ratio", "CPU time stolen by the hypervisor, share of all CPU time"),
    ("host_cpu_busy_ratio", "ratio", "whole machine CPU busy share (all processes)"),
    ("host_cores", "cores", "cores of the server's machine (the host probe's count, beside /proc/stat)"),
    ("host_cpu_steal_or_contention_ratio", "ratio",
     "max of host_work_wait_ratio (run-queue wait of the engine's working threads, poll/yield loops excluded) "
     "and host_cpu_steal_ratio: time the engine's work was ready to run but had no CPU"),
    ("host_gil_held_ratio", "ratio", "share of py-spy dump snapshots in which an engine thread held the GIL"),
    ("host_gil_contention_ratio", "ratio", "share of py-spy dump snapshots with threads waiting for the GIL"),
]

_GPU: list[_Entry] = [
    ("gpu_util_mean_ratio", "ratio", "NVML utilisation.gpu time fraction, mean"),
    ("gpu_util_min_ratio", "ratio", "NVML utilisation.gpu time fraction, min over GPUs"),
    ("gpu_idle_sample_ratio", "ratio", "share of NVML samples with the GPU idle"),
    ("gpu_mem_bw_util_mean_ratio", "ratio", "GPM DRAM bandwidth utilisation, mean"),
    ("gpu_sm_util_mean_ratio", "ratio", "GPM SM utilisation (share of SMs busy), mean"),
    ("gpu_sm_occupancy_mean_ratio", "ratio", "GPM SM occupancy (warps resident), mean"),
    ("gpu_tensor_util_mean_ratio", "ratio", "GPM tensor-core utilisation, mean"),
    ("gpu_mem_busy_mean_ratio", "ratio", "NVML utilization.memory (time fraction memory was read or written), mean"),
    ("gpu_temp_max_c", "C", "GPU temperature, max (C)"),
    ("gpu_throttle_active_ratio", "ratio", "share of samples with a non-idle clock-throttle reason"),
    ("gpu_mem_used_max_ratio", "ratio", "GPU memory used / total, max"),
    ("gpu_power_over_limit_ratio", "ratio", "power / power limit, max"),
    ("gpu_pcie_tx_mean_mb_s", "MB/s", "PCIe transmit throughput, mean (MB/s)"),
    ("gpu_pcie_rx_mean_mb_s", "MB/s", "PCIe receive throughput, mean (MB/s)"),
    ("gpu_nvlink_tx_mean_mb_s", "MB/s", "NVLink transmit throughput, mean (MB/s)"),
    ("gpu_sm_clock_drop_ratio", "ratio", "1 - min SM clock / max SM clock"),
]

_TRACE: list[_Entry] = [
    ("trace_gpu_busy_ratio", "ratio", "GPU busy share of the traced window"),
    ("trace_gpu_idle_ratio", "ratio", "GPU idle share of the window"),
    ("trace_gpu_compute_ratio", "ratio", "GPU compute (non-communication) share of the window"),
    ("trace_gpu_comm_exposed_ratio", "ratio", "communication not overlapped by compute, share of the window"),
    ("trace_gpu_memory_exposed_ratio", "ratio", "memcpy/memset not overlapped by compute, share of the window"),
    ("trace_comm_overlap_ratio", "ratio", "share of communication time overlapped by compute"),
    ("trace_gpu_kernels_count", "count", "GPU kernels in the trace"),
    ("trace_rank_busy_spread_ratio", "ratio", "max minus min GPU busy ratio across ranks"),
    *[(f"trace_gpu_idle_{k}_ratio", "ratio", f"share of GPU idle time attributed to {k.replace('_', ' ')}")
      for k in ("host_wait", "launch_overhead", "other")],
    ("trace_gpu_idle_launch_explained_ratio", "ratio", "share of GPU idle time in gaps a launch explains"),
    ("trace_launch_bound_kernel_ratio", "ratio",
     "eagerly launched kernels whose GPU time is shorter than their CPU launch call"),
    ("trace_launch_call_p50_us", "us", "median CPU time of a kernel launch call (eager launches)"),
    ("trace_launch_delay_p50_us", "us", "median delay from the end of the launch call to the kernel start"),
    ("trace_kernel_dur_p50_us", "us", "median eager kernel duration"),
    ("trace_graph_kernel_ratio", "ratio", "share of launched kernels that ran inside CUDA/HIP graph replays"),
    ("trace_sync_total_ms", "ms", "CPU time in host synchronisation and synchronous memcpy/memset calls"),
    ("trace_async_pageable_copies_count", "count", "async memcpy calls on pageable host memory"),
    ("trace_async_pageable_copy_ratio", "ratio",
     "GPU time of the async copies on pageable host memory over the window (the most they can cost)"),
    ("trace_steps_count", "count", "engine steps found in the trace annotations"),
    ("trace_steps_excluded_count", "count",
     "steps excluded as warm-up or profiler start/stop artefacts (not in any step signal)"),
    *[(f"trace_step_{k}_count", "count", f"{k} steps") for k in ("prefill", "decode", "mixed")],
    ("trace_step_dur_p50_ms", "ms", "median engine-step duration (CPU annotation)"),
    ("trace_step_dur_p99_ms", "ms", "P99 engine-step duration"),
    ("trace_inter_step_gap_p50_ms", "ms", "median CPU time between steps"),
    ("trace_step_gpu_busy_ratio", "ratio", "GPU busy time of the steps' kernels over the steps' GPU spans"),
    ("trace_sync_in_step_ms", "ms", "mean CPU time per step in host syncs and synchronous copies"),
    ("trace_sync_in_step_ratio", "ratio", "share of step time spent in host syncs and synchronous copies"),
    ("trace_decode_step_p50_ms", "ms", "median decode-step duration"),
    ("trace_decode_memory_bound_ratio", "ratio", "decode-step kernel time in memory-bound classes, and in GEMMs "
     "memory-bound by their shapes on the trace's device"),
    ("trace_gemm_shaped_ratio", "ratio", "GEMM kernel time whose operator was recorded with its shapes "
     "(record_shapes)"),
    ("trace_gemm_memory_bound_ratio", "ratio", "share of the shaped GEMMs' kernel time in GEMMs bound by memory "
     "bandwidth (FLOPs per byte moved below the device's ridge point)"),
    ("trace_gemm_memory_bw_util_ratio", "ratio", "bytes the memory-bound GEMMs moved per second of their kernels, "
     "over the device's peak bandwidth"),
    ("trace_mixed_step_inflation_ratio", "ratio", "median mixed step duration / median pure decode step duration"),
    ("trace_decode_attention_ratio", "ratio", "decode-step kernel time in attention kernels"),
    ("trace_mixed_prefill_tokens_p50_tokens", "tokens", "median prefill tokens carried by a mixed step"),
    ("trace_collective_skew_p50_us", "us", "median spread of start times of the same collective across ranks"),
    ("trace_collective_skew_p99_us", "us", "P99 of that spread"),
    ("trace_straggler_last_share_ratio", "ratio", "share of collectives the most frequent last rank started last"),
    *[(f"trace_gpu_idle_{k}_ratio", "ratio", f"share of GPU idle time attributed to {k.replace('_', ' ')}")
      for k in ("queued", "graph_internal")],
    ("trace_gpu_launch_idle_ratio", "ratio", "GPU idle in gaps a launch explains, share of the window"),
    ("trace_idle_gaps_count", "count", "GPU idle gaps (all streams merged)"),
    ("trace_gpu_pre_trace_ms", "ms", "GPU idle before the trace's own work began (excluded from the shares)"),
    ("trace_capture_flag", "flag", "the trace records a CUDA/HIP graph capture, not serving"),
    ("trace_eager_kernel_ratio", "ratio", "share of launched kernels launched one by one (not in a graph replay)"),
    ("trace_eager_kernels_count", "count", "kernels launched one by one"),
    ("trace_comm_wait_ratio", "ratio", "share of communication kernel time spent waiting for peer ranks"),
    ("trace_comm_wait_kernels_count", "count", "collectives that waited for a peer rank"),
    ("trace_comm_kernels_count", "count", "communication kernels"),
    ("trace_gpu_comm_wait_exposed_ratio", "ratio", "exposed communication waiting for peers, share of the window"),
    ("trace_gpu_comm_transfer_exposed_ratio", "ratio", "exposed communication transferring, share of the window"),
    ("trace_custom_allreduce_ratio", "ratio", "share of communication time in custom (non-NCCL) all-reduce kernels"),
    ("trace_sync_overlap_gpu_busy_ratio", "ratio", "share of in-step sync time during which the GPU was busy"),
    ("trace_sync_blocking_steps_count", "count", "steps whose syncs while the GPU was idle exceed 5% of the step"),
    ("trace_collectives_count", "count", "collectives matched across ranks"),
    ("trace_straggler_rank", "count", "the rank that started the most collectives last (a rank number)"),
    ("trace_straggler_lag_p50_us", "us", "median lag of that rank behind the earliest rank at each collective"),
    ("trace_host_stall_p50_ms", "ms",
     "median over steps of the longest host stall in a step (GPU idle until the CPU called the next launch)"),
    ("trace_host_stall_step_ratio", "ratio", "the steps' longest host stalls over the steps' CPU duration"),
    ("trace_host_stall_steps_count", "count", "steps whose longest host stall is at least 10% of the step"),
    ("trace_host_stall_untraced_ratio", "ratio",
     "share of those stalls in which the trace recorded no CPU op or runtime call (native code or GIL: untraced)"),
    ("trace_host_stall_eager_steps_count", "count", "of those steps, the ones that ran eagerly (no graph replay)"),
    ("trace_straggler_lag_step_ratio", "ratio",
     "that median lag over the median engine-step duration (the share of a step the other ranks wait)"),
    ("trace_straggler_idle_share_ratio", "ratio",
     "the straggler's GPU idle before each collective beyond the other ranks', over its lag (1: host late)"),
]

# fleet (diagnose/normalize/fleet.py, docs/fleet.md): across the replicas of a Prometheus selector; the
# description of a per-replica signal is the replica's name (labels), shown by rules as {label.<signal>}
_FLEET: list[_Entry] = [
    ("fleet_replicas", "replicas", "replicas the selector found in the window"),
    ("fleet_load_mean", "requests", "the fleet's mean of each replica's mean requests in flight (Little's law on "
     "its e2e latency histogram; running + waiting gauges without one)"),
    ("fleet_load_busiest_mean", "requests", "the busiest replica's mean requests in flight"),
    ("fleet_load_idlest_mean", "requests", "the least loaded replica's mean requests in flight"),
    ("fleet_load_imbalance_ratio", "ratio", "busiest replica's mean requests in flight / the fleet's mean"),
    ("fleet_request_rate_imbalance_ratio", "ratio", "highest replica finished-request rate / the fleet's mean"),
    ("fleet_queue_busiest_mean", "requests", "the most queued replica's mean waiting requests"),
    ("fleet_kv_usage_busiest_max_ratio", "ratio", "the highest KV-cache usage any replica reached"),
    ("fleet_prefix_hit_max_ratio", "ratio", "the highest replica prefix-cache hit rate (hit / queried tokens)"),
    ("fleet_prefix_hit_min_ratio", "ratio", "the lowest replica prefix-cache hit rate (hit / queried tokens)"),
    ("fleet_prefix_hit_spread_ratio", "ratio", "prefix-cache hit rate, highest replica - lowest replica"),
    ("fleet_restarts_total", "restarts", "replica restarts in the window (process start time changes or counter "
     "resets), summed over replicas"),
]


_SLOTS: list[_Entry] = [
    ("slot_context_tokens", "tokens", "the context of one llama.cpp slot (n_ctx in /slots)"),
    ("slot_context_used_max_ratio", "ratio", "the fullest a busy llama.cpp slot's context was (the tokens it held, "
     "prompt + generated, / n_ctx; max over /slots samples)"),
    ("slots_busy_mean", "slots", "busy llama.cpp slots, mean over /slots samples"),
]


_ATTRIBUTION_SERVER: list[_Entry] = [
    *[(f"server_ttft_tail_{part}_ratio", "ratio", f"share of the slow requests' TTFT spent {what} (server histograms: "
       "the slowest requests taken to be those that waited and prefilled longest)")
      for part, what in (("queue", "waiting in the engine's queue"), ("prefill", "in prefill"),
                         ("outside", "outside the engine (API server, network, client)"))],
]

_ATTRIBUTION_DECODE: list[_Entry] = [
    ("decode_time_steady_ratio", "ratio", "share of the requests' token gaps in steady steps (each gap up to 2 x "
     "the ITL P50: a decode step, the batch, the stream)"),
    ("decode_time_stall_ratio", "ratio", "share of the requests' token gaps in stalls: the part of a gap above 2 x "
     "the ITL P50 (a step that carried other work: a prefill chunk, mostly), preemption's gaps left out"),
    ("decode_time_preemption_ratio", "ratio", "share of the requests' token gaps in preemption: the stall of the "
     "longest gaps, as many as the engine counted preemptions (a preempted request waits and recomputes)"),
]


_TASKS: list[_Entry] = [
    ("tasks_started", "tasks", "tasks (attach --turns: a conversation or an agent's chain) started in the window"),
    ("tasks_completed", "tasks", "tasks whose every planned turn was answered"),
    ("tasks_abandoned_ratio", "ratio", "share of the started tasks abandoned: a turn failed on every attempt"),
    *[(f"task_latency_{p}_ms", "ms", f"task latency {p.upper() if p != 'max' else 'max'}: first request sent to "
       "the last answer's end, think time included (complete tasks)") for p in ("p50", "p90", "p99", "max")],
    ("task_rps", "task/s", "complete tasks per second"),
    ("task_goodput_rps", "task/s", "complete tasks per second whose every answered request met each SLO term"),
    ("task_goodput_ratio", "ratio", "share of the started tasks complete and within the SLO"),
    ("task_retries_total", "requests", "turns sent again after a failed attempt (--retries)"),
]


# production readiness (diagnose/readiness/signals.py, docs/readiness.md): a readiness run's measurements, judged
# by rules/catalog/readiness/; each check's signals exist only when it ran. A description that names text (slots,
# errors) is replaced by that text where the run has it, shown by the rules as {label.<signal>}
_READINESS_CLIENT: list[_Entry] = [
    ("readiness_cancel_judged", "flag", "1: the cancellation check ran and can be judged"),
    ("readiness_cancel_streams", "requests", "streams the cancellation check opened"),
    ("readiness_cancel_aborted", "requests", "streams the cancellation check aborted after their first tokens"),
    ("readiness_cancel_kept_failed", "requests", "kept streams that failed after the abort (the first errors)"),
    ("readiness_cold_judged", "flag", "1: the cold-start check ran (diagnose launched the server)"),
    ("readiness_cold_first_failed", "flag", "1: the first request after healthy failed (its error); 0: it was served"),
    ("readiness_cold_first_vs_warm_ratio", "times", "first request's TTFT after a fresh start / warm TTFT P50"),
    ("readiness_cold_first_ttft_ms", "ms", "first request's TTFT after a fresh start (ms)"),
    ("readiness_slo_ttft_ms", "ms", "the SLO's tightest TTFT term (ms)"),
    ("readiness_over_ran", "flag", "1: the overload ramp ran"),
    ("readiness_over_overloaded", "flag", "1: the ramp overloaded the server (its top step was sent, and it fell "
     "behind its arrivals or rejected some); 0: it did not"),
    ("readiness_over_sent", "requests", "requests the overload ramp sent"),
    ("readiness_over_rejected", "requests", "requests rejected with 429/503 during the ramp"),
    ("readiness_over_rejected_with_retry_after", "requests", "rejected requests whose answer had a Retry-After"),
    ("readiness_over_errors", "requests", "requests that failed or timed out during the ramp (the first errors)"),
    ("readiness_over_top_factor", "times", "the ramp's top step, times the measured capacity"),
    ("readiness_over_capacity_rps", "req/s", "the capacity the ramp was built on (req/s)"),
    ("readiness_over_top_ttft_p99_ms", "ms", "TTFT P99 of the requests the server admitted at the top step (ms)"),
    ("readiness_over_open_capped", "requests", "top step arrivals not sent: the client's cap on open requests was "
     "full"),
    ("readiness_over_max_in_flight", "requests", "the overload client's cap on open requests"),
    ("readiness_over_recovery_s", "s", "seconds after the ramp until requests one at a time were back near the "
     "baseline TTFT"),
    ("readiness_fail_judged", "flag", "1: the failure check ran (a crash and a restart)"),
    ("readiness_fail_restart_failed", "flag", "1: the restart failed (why); absent when it did not"),
    ("readiness_fail_recovery_s", "s", "seconds from the crash to the first completion after the restart"),
    ("readiness_fail_health_gap_s", "s", "seconds from the restarted server's healthy to its first completion"),
    ("readiness_fail_retry_amplification", "times", "the clients' attempts per second during the outage / the "
     "completions per second before the crash"),
]
_READINESS_SERVER: list[_Entry] = [
    ("readiness_cancel_in_flight_before", "requests", "the engine's requests in flight before the cancellation "
     "check"),
    ("readiness_cancel_release_s", "s", "seconds from the abort until the engine's in-flight work dropped to what "
     "the client still reads"),
    ("readiness_cancel_idle_s", "s", "seconds from the last kept stream's end until the engine's in-flight work "
     "was back to its level before the check"),
    ("readiness_cancel_stale_in_flight", "requests", "in-flight gauges after the last stream, stale until another "
     "request ran a step"),
    ("readiness_cancel_leaked", "requests", "requests still in flight on the engine past the bound"),
    ("readiness_cancel_left_busy_slots", "slots", "llama.cpp slots still busy past the bound (their ids)"),
    ("readiness_cancel_left_running", "requests", "the engine's running requests past the bound"),
    ("readiness_cancel_left_waiting", "requests", "the engine's waiting requests past the bound"),
    ("readiness_cancel_left_kv_usage_ratio", "ratio", "the KV cache the engine held past the bound"),
]
_READINESS_DERIVED: list[_Entry] = [
    ("readiness_over_top_ttft_limit_ms", "ms", "the TTFT P99 the top step's admitted requests must keep (ms; how "
     "it is made)"),
]


def _build() -> dict[str, SignalSpec]:
    out: dict[str, SignalSpec] = {}
    groups: tuple[tuple[str, Source, list[_Entry]], ...] = (
        (CLIENT, "client", _CLIENT), (DERIVED, "derived", _DERIVED), (PROMETHEUS, "server", _PROMETHEUS),
        (OTEL, "server", _OTEL), (HOST, "host", _HOST), (GPU, "gpu", _GPU), (TRACE, "trace", _TRACE),
        (FLEET, "server", _FLEET), (SLOTS, "server", _SLOTS), (ATTRIBUTION, "server", _ATTRIBUTION_SERVER),
        (ATTRIBUTION, "derived", _ATTRIBUTION_DECODE), (TASKS, "client", _TASKS),
        (READINESS, "client", _READINESS_CLIENT), (READINESS, "server", _READINESS_SERVER),
        (READINESS, "derived", _READINESS_DERIVED),
    )
    for producer, source, entries in groups:
        for name, unit, description in entries:
            if name in out:
                raise ValueError(f"signal {name} declared twice ({out[name].producer} and {producer})")
            out[name] = SignalSpec(name, unit, source, producer, description)
    return out


CATALOG: dict[str, SignalSpec] = _build()
# name -> description, for the normalisers that label their signals from here
SIGNALS: dict[str, str] = {name: spec.description for name, spec in CATALOG.items()}


def is_known(name: str) -> bool:
    """Whether ``name`` is a declared signal (exactly: no prefix or suffix patterns)."""
    return name in CATALOG
