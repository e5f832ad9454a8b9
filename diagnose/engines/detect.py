"""Which inference engine is behind a URL, and how its Prometheus names map to engine-neutral signals.

Detection (:func:`detect_engine`) asks a few cheap, read-only endpoints and stops at the first clear answer:
``/v1/models`` ``owned_by`` (vllm, sglang, llamacpp), ``/version`` (vLLM), ``/server_info`` (SGLang),
``/info`` (TGI), ``/props`` (llama.cpp), and finally the metric name prefixes of ``/metrics``. An engine
that none of these identify is ``unknown``: it still gets the client-side analysis.

The maps (:data:`METRIC_MAPS`) follow docs/engine-signals.md (and the normalized schema in the engine
telemetry notes): each :class:`MetricRef` names the wire sample(s) for one neutral signal, its kind, the
factor to the base unit (seconds, ratio 0-1, tokens, requests) and optional label filters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from diagnose.capture.redact import join_url

if TYPE_CHECKING:  # aiohttp is imported where it is used: the parse worker imports this module too
    import aiohttp

Kind = Literal["gauge", "counter", "histogram"]
Agg = Literal["sum", "max"]

ENGINES = ("vllm", "sglang", "tgi", "llamacpp")

#: metric family prefixes that identify an engine (and that the Prometheus probe keeps).
ENGINE_PREFIXES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm:",),
    "sglang": ("sglang:",),
    "tgi": ("tgi_",),
    "llamacpp": ("llamacpp:",),
    "trtllm": ("trtllm_",),
    "triton": ("nv_",),
    "dynamo": ("dynamo_",),
}

#: label that separates data-parallel engine replicas (summed or maxed over for instance totals).
DP_LABEL: dict[str, str] = {"vllm": "engine", "sglang": "dp_rank"}


@dataclass(frozen=True)
class MetricRef:
    """One engine-neutral signal and the wire sample names that carry it for one engine.

    ``names`` are sample names as they appear on the wire (histograms by family name, the
    ``_bucket``/``_sum``/``_count`` suffixes are added by the reader; a counter named without ``_total``,
    as TGI's exporter writes them, is also looked up as ``<name>_total``, which is how prometheus_client's
    parser reports every counter sample). With ``combine="first"``
    the first name present in a scrape is used (renames across versions); with ``"sum"`` all present names
    are added (llama.cpp prefix-cache queries = uncached + cached prompt tokens). ``labels`` filters samples
    by label value (a regular expression that must match the whole value). ``agg`` combines several
    matching series (label sets) in one scrape: ``sum`` for counts, ``max`` for ratios.
    """

    signal: str
    kind: Kind
    names: tuple[str, ...]
    unit: str
    scale: float = 1.0
    combine: Literal["first", "sum"] = "first"
    labels: tuple[tuple[str, str], ...] = ()
    agg: Agg = "sum"
    note: str = ""

    def matches_labels(self, labels: dict[str, str]) -> bool:
        return all(re.fullmatch(pat, labels.get(key, "")) is not None for key, pat in self.labels)


def _g(signal: str, names: str | tuple[str, ...], unit: str, **kw: Any) -> MetricRef:
    return MetricRef(signal, "gauge", (names,) if isinstance(names, str) else names, unit, **kw)


def _c(signal: str, names: str | tuple[str, ...], unit: str, **kw: Any) -> MetricRef:
    return MetricRef(signal, "counter", (names,) if isinstance(names, str) else names, unit, **kw)


def _h(signal: str, names: str | tuple[str, ...], unit: str, **kw: Any) -> MetricRef:
    return MetricRef(signal, "histogram", (names,) if isinstance(names, str) else names, unit, **kw)


_PROCESS = (
    _c("process_cpu_seconds", "process_cpu_seconds_total", "s", note="API-server process only"),
    _g("process_resident_memory_bytes", "process_resident_memory_bytes", "bytes", agg="max"),
)

METRIC_MAPS: dict[str, tuple[MetricRef, ...]] = {
    "vllm": (
        _g("queue_depth", "vllm:num_requests_waiting", "requests"),
        _g("running_requests", "vllm:num_requests_running", "requests"),
        _g("kv_usage_ratio", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), "ratio", agg="max"),
        _c("prefix_cache_queries_tokens", ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
           "tokens"),
        _c("prefix_cache_hits_tokens", ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"), "tokens"),
        _c("preemptions", "vllm:num_preemptions_total", "events"),
        _c("prompt_tokens", "vllm:prompt_tokens_total", "tokens"),
        _c("generation_tokens", "vllm:generation_tokens_total", "tokens"),
        _c("finished_requests", "vllm:request_success_total", "requests"),
        _c("rejected_requests", "vllm:admission_rejections_total", "requests"),
        _h("ttft_seconds", "vllm:time_to_first_token_seconds", "s",
           note="frontend arrival (tokenization start) to first token: includes queue and prefill"),
        _h("queue_time_seconds", "vllm:request_queue_time_seconds", "s", note="first QUEUED to first SCHEDULED"),
        _h("prefill_time_seconds", "vllm:request_prefill_time_seconds", "s", note="first SCHEDULED to first token"),
        _h("decode_time_seconds", "vllm:request_decode_time_seconds", "s", note="first to last token"),
        _h("itl_seconds", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), "s",
           note="per engine output (step), not per token"),
        _h("tpot_seconds", "vllm:request_time_per_output_token_seconds", "s"),
        _h("e2e_seconds", "vllm:e2e_request_latency_seconds", "s"),
        _h("batch_tokens_per_step", "vllm:iteration_tokens_total", "tokens",
           note="prompt + generation tokens per engine step"),
        # the lengths of finished requests: an observed workload's length distributions (diagnose/signals/observed.py)
        _h("request_prompt_tokens", "vllm:request_prompt_tokens", "tokens", note="prompt tokens per finished request"),
        _h("request_output_tokens", "vllm:request_generation_tokens", "tokens",
           note="generated tokens per finished request"),
        *_PROCESS,
    ),
    "sglang": (
        _g("queue_depth", "sglang:num_queue_reqs", "requests"),
        _g("running_requests", "sglang:num_running_reqs", "requests"),
        _g("kv_usage_ratio", "sglang:token_usage", "ratio", agg="max"),
        _c("prefix_cache_queries_tokens", "sglang:prefill_effective_tokens_total", "tokens"),
        _c("prefix_cache_hits_tokens", "sglang:prefill_effective_tokens_total", "tokens", labels=(("mode", ".*_hit"),)),
        _c("preemptions", "sglang:num_retracted_requests_total", "events", note="retractions"),
        _c("prompt_tokens", "sglang:prompt_tokens_total", "tokens"),
        _c("generation_tokens", "sglang:generation_tokens_total", "tokens"),
        _c("finished_requests", "sglang:num_requests_total", "requests"),
        _h("ttft_seconds", "sglang:time_to_first_token_seconds", "s", note="TokenizerManager receipt to first token"),
        _h("queue_time_seconds", "sglang:queue_time_seconds", "s"),
        _h("prefill_time_seconds", "sglang:per_stage_req_latency_seconds", "s",
           labels=(("stage", "prefill_forward"),)),
        _h("itl_seconds", "sglang:inter_token_latency_seconds", "s", note="per token"),
        _h("tpot_seconds", "sglang:request_time_per_output_token_seconds", "s"),
        _h("e2e_seconds", "sglang:e2e_request_latency_seconds", "s"),
        *_PROCESS,
    ),
    "tgi": (
        _g("queue_depth", "tgi_queue_size", "requests"),
        _g("running_requests", "tgi_batch_current_size", "requests"),
        _c("finished_requests", "tgi_request_success", "requests"),
        _c("rejected_requests", "tgi_request_failure", "requests", labels=(("err", "overloaded"),)),
        _h("queue_time_seconds", "tgi_request_queue_duration", "s"),
        _h("tpot_seconds", "tgi_request_mean_time_per_token_duration", "s", note="includes prefill"),
        _h("e2e_seconds", "tgi_request_duration", "s"),
        _h("request_prompt_tokens", "tgi_request_input_length", "tokens", note="input tokens per request"),
        _h("request_output_tokens", "tgi_request_generated_tokens", "tokens", note="generated tokens per request"),
        *_PROCESS,
    ),
    "llamacpp": (
        _g("queue_depth", "llamacpp:requests_deferred", "requests"),
        _g("running_requests", "llamacpp:requests_processing", "requests"),
        _g("kv_usage_ratio", "llamacpp:kv_cache_usage_ratio", "ratio", agg="max", note="older builds only"),
        _c("prefix_cache_queries_tokens", ("llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total"),
           "tokens", combine="sum"),
        _c("prefix_cache_hits_tokens", "llamacpp:prompt_tokens_cached_total", "tokens"),
        _c("prompt_tokens", "llamacpp:prompt_tokens_total", "tokens", note="uncached prompt tokens only"),
        _c("generation_tokens", "llamacpp:tokens_predicted_total", "tokens"),
        _c("prefill_seconds", "llamacpp:prompt_seconds_total", "s"),
        _c("decode_seconds", "llamacpp:tokens_predicted_seconds_total", "s"),
        _c("engine_steps", "llamacpp:n_decode_total", "steps"),
        *_PROCESS,
    ),
}


def metric_map(engine: str) -> tuple[MetricRef, ...]:
    """The name map for ``engine``; an unknown engine maps only the process metrics."""
    return METRIC_MAPS.get(engine, _PROCESS)


def engine_from_metric_names(names: Iterable[str]) -> str | None:
    """The engine whose namespace prefix the most metric names carry, or None."""
    counts: dict[str, int] = {}
    for n in names:
        for eng, prefixes in ENGINE_PREFIXES.items():
            if n.startswith(prefixes):
                counts[eng] = counts.get(eng, 0) + 1
    return max(counts, key=lambda e: counts[e]) if counts else None


def is_engine_relevant(name: str) -> bool:
    """Whether the Prometheus probe keeps samples of this family or sample name (see docs/engine-signals.md)."""
    if name.endswith("_created"):
        return False
    if name.startswith(("process_cpu_seconds", "process_resident_memory_bytes", "process_start_time_seconds")):
        return True
    return any(name.startswith(p) for ps in ENGINE_PREFIXES.values() for p in ps)


# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineInfo:
    """What :func:`detect_engine` found: engine name (or ``unknown``), version, served models, and how."""

    name: str = "unknown"
    version: str | None = None
    models: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    config: dict[str, float] = field(default_factory=dict)  # e.g. max_num_seqs when an endpoint states it

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "models": list(self.models),
                "evidence": list(self.evidence), "config": dict(self.config)}


_OWNED_BY = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp", "llama.cpp": "llamacpp"}


async def _get(session: aiohttp.ClientSession, url: str, timeout_s: float,
               headers: dict[str, str] | None, as_json: bool = True) -> Any:
    """GET ``url``; the decoded JSON (or text), or None on any failure (detection is best effort)."""
    import asyncio

    import aiohttp

    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers) as r:
            if r.status != 200:
                return None
            if not as_json:
                return await r.text()
            return await r.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, UnicodeDecodeError):
        return None


def _dig(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _config_from_server_info(info: Mapping[str, object]) -> dict[str, float]:
    """max_num_seqs (vLLM) / max_running_requests (SGLang) when the server info states it."""
    for path in (("max_running_requests",), ("server_args", "max_running_requests"),
                 ("vllm_config", "scheduler_config", "max_num_seqs"), ("scheduler_config", "max_num_seqs"),
                 ("max_num_seqs",)):
        v = _dig(info, *path)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return {"max_num_seqs": int(v)}
    return {}


async def detect_engine(base_url: str, session: aiohttp.ClientSession, *, timeout_s: float = 3.0,
                        headers: dict[str, str] | None = None) -> EngineInfo:
    """Identify the engine behind ``base_url`` (no trailing slash, no /v1). Never raises for a server that
    answers oddly or not at all: the result is then ``EngineInfo("unknown")`` with what was learned."""
    base = base_url.rstrip("/")
    evidence: list[str] = []
    name = "unknown"
    version: str | None = None
    config: dict[str, float] = {}
    models_doc = await _get(session, join_url(base, "/v1/models"), timeout_s, headers)
    data = models_doc.get("data") if isinstance(models_doc, dict) else None
    models = tuple(str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id")) if isinstance(data, list) else ()
    owners = {str(m.get("owned_by", "")).lower() for m in data if isinstance(m, dict)} if isinstance(data, list) else set()
    for owner in sorted(owners):
        if owner in _OWNED_BY:
            name = _OWNED_BY[owner]
            evidence.append(f"/v1/models owned_by={owner}")
            break

    if name in ("vllm", "unknown"):
        ver = await _get(session, join_url(base, "/version"), timeout_s, headers)
        if isinstance(ver, dict) and isinstance(ver.get("version"), str):
            version = ver["version"]  # vLLM and TRT-LLM both answer {"version": ...}: not proof of either
    if name in ("sglang", "unknown", "vllm"):
        info = await _get(session, join_url(base, "/server_info"), timeout_s, headers)
        if isinstance(info, dict):
            config.update(_config_from_server_info(info))
            if name == "unknown" and "version" in info and ("frontend" in info or "internal_states" in info):
                name = "sglang"
                evidence.append("/server_info")
            if name == "sglang" and isinstance(info.get("version"), str):
                version = info["version"]
    if name in ("tgi", "unknown"):
        info = await _get(session, join_url(base, "/info"), timeout_s, headers)
        if isinstance(info, dict) and "model_id" in info and ("router" in info or "max_batch_total_tokens" in info
                                                              or "max_concurrent_requests" in info):
            name = "tgi"
            evidence.append("/info model_id")
            version = str(info["version"]) if info.get("version") is not None else version
            if isinstance(info.get("max_concurrent_requests"), int):
                config.setdefault("max_concurrent_requests", info["max_concurrent_requests"])
    if name in ("llamacpp", "unknown"):
        props = await _get(session, join_url(base, "/props"), timeout_s, headers)
        if isinstance(props, dict) and ("build_info" in props or "total_slots" in props):
            if name == "unknown":
                name = "llamacpp"
                evidence.append("/props")
            if isinstance(props.get("build_info"), str):
                version = props["build_info"]
            slots = props.get("total_slots")
            if isinstance(slots, int):
                config.setdefault("max_num_seqs", slots)
                gen = props.get("default_generation_settings")
                n_ctx = gen.get("n_ctx") if isinstance(gen, dict) else None
                if isinstance(n_ctx, int) and n_ctx > 0:  # a slot's context; -c is the slots' total
                    config.setdefault("context_size", n_ctx * slots)
    if name == "unknown":
        text = await _get(session, join_url(base, "/metrics"), timeout_s, headers, as_json=False)
        if isinstance(text, str):
            names = (line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines()
                     if line and not line.startswith("#"))
            eng = engine_from_metric_names(names)
            if eng is not None:
                name = eng
                evidence.append(f"/metrics prefix {ENGINE_PREFIXES[eng][0]}")
    import asyncio  # here: the metric maps above are imported by analysis, which needs no event loop

    settings, where = await asyncio.to_thread(server_cmdline_settings, base)
    for k, v in settings.items():
        config.setdefault(k, int(v) if float(v).is_integer() else v)
    if where:
        evidence.append(where)
    return EngineInfo(name=name, version=version, models=models, evidence=tuple(evidence), config=config)


# -- engine settings from the server's command line --------------------------------------------------------
# flag -> neutral setting (numbers); vLLM, SGLang, TGI and llama.cpp spellings. Table-driven, one place.
VALUE_FLAGS: dict[str, str] = {
    "--max-num-seqs": "max_num_seqs", "--max-running-requests": "max_num_seqs", "--parallel": "max_num_seqs",
    "-np": "max_num_seqs", "--max-concurrent-requests": "max_concurrent_requests",
    "--max-num-batched-tokens": "max_num_batched_tokens", "--chunked-prefill-size": "max_num_batched_tokens",
    "--max-batch-total-tokens": "max_batch_total_tokens", "--batch-size": "max_num_batched_tokens",
    "-b": "max_num_batched_tokens",
    "--block-size": "kv_block_size_tokens", "--max-model-len": "max_model_len", "--ctx-size": "context_size",
    "-c": "context_size", "--tensor-parallel-size": "tensor_parallel_size", "-tp": "tensor_parallel_size",
    "--tp-size": "tensor_parallel_size", "--tp": "tensor_parallel_size", "--threads": "threads", "-t": "threads",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    # llama.cpp (issue 34, families from user reports: docs/families-from-users.md)
    "--ubatch-size": "ubatch_tokens", "-ub": "ubatch_tokens", "--top-k": "sampling_top_k",
}
BOOL_FLAGS: dict[str, tuple[str, float]] = {
    "--enable-prefix-caching": ("prefix_caching", 1.0), "--no-enable-prefix-caching": ("prefix_caching", 0.0),
    "--disable-radix-cache": ("prefix_caching", 0.0),
    "--enable-chunked-prefill": ("chunked_prefill", 1.0), "--no-enable-chunked-prefill": ("chunked_prefill", 0.0),
    "--enforce-eager": ("cuda_graphs", 0.0), "--disable-cuda-graph": ("cuda_graphs", 0.0),
    # llama.cpp: continuous batching (on by default) and its per-slot prompt cache (on by default)
    "--cont-batching": ("continuous_batching", 1.0), "-cb": ("continuous_batching", 1.0),
    "--no-cont-batching": ("continuous_batching", 0.0), "-nocb": ("continuous_batching", 0.0),
    "--cache-prompt": ("prefix_caching", 1.0), "--no-cache-prompt": ("prefix_caching", 0.0),
}
# a flag whose mere presence (with any value: a grammar, a schema, a file) states a setting
PRESENCE_FLAGS: dict[str, tuple[str, float]] = {
    flag: ("constrained_decoding", 1.0)
    for flag in ("--grammar", "--grammar-file", "--json-schema", "-j", "--json-schema-file", "-jf")
}


# a flag whose value is a word: flag -> (neutral setting, {word: value}); other words (llama.cpp's "auto") unknown
CHOICE_FLAGS: dict[str, tuple[str, dict[str, float]]] = {
    flag: ("flash_attention", {"on": 1.0, "off": 0.0, "true": 1.0, "false": 0.0, "1": 1.0, "0": 0.0})
    for flag in ("--flash-attn", "-fa")
}


def settings_from_cmdline(argv: Sequence[str]) -> dict[str, float]:
    """The engine settings a server's command line states (flags not given are not guessed: absent)."""
    out: dict[str, float] = {}
    args = list(argv)
    for i, arg in enumerate(args):
        flag, eq, inline = arg.partition("=")
        if flag in BOOL_FLAGS and not eq:
            key, val = BOOL_FLAGS[flag]
            out[key] = val
        elif flag in PRESENCE_FLAGS:
            key, val = PRESENCE_FLAGS[flag]
            out[key] = val
        elif flag in CHOICE_FLAGS:
            key, words = CHOICE_FLAGS[flag]
            word = (inline if eq else (args[i + 1] if i + 1 < len(args) else "")).lower()
            if word in words:
                out[key] = words[word]
        elif flag in VALUE_FLAGS:
            raw = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            try:
                v = float(raw)
            except ValueError:
                continue
            if math.isfinite(v):
                out[VALUE_FLAGS[flag]] = v
    return out


def _loopback_port(base_url: str) -> int | None:
    from urllib.parse import urlsplit

    try:
        u = urlsplit(base_url)
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        return None
    host = (u.hostname or "").lower()
    loop = host == "localhost" or host == "::1" or host.startswith("127.")
    return port if loop else None


def server_cmdline_settings(base_url: str) -> tuple[dict[str, float], str | None]:
    """(settings, evidence) from the command line of the process listening on ``base_url``'s port, when the
    server runs on this machine (a loopback URL) and /proc lets us read it; ({}, None) otherwise. The evidence
    names the pid and only the recognised flags (never the whole command line: it may carry secrets)."""
    port = _loopback_port(base_url)
    if port is None:
        return {}, None
    import psutil

    try:
        pids = {c.pid for c in psutil.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
        for pid in sorted(pids):
            argv = psutil.Process(pid).cmdline()
            found = settings_from_cmdline(argv)
            if found:
                flags = ", ".join(f"{k}={v:g}" for k, v in sorted(found.items()))
                return found, f"command line of pid {pid}: {flags}"
    except (psutil.Error, OSError):
        return {}, None
    return {}, None
