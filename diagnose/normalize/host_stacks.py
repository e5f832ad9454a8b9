"""Serving categories for Python stacks, and the flame-graph tree built from them.

A stack (frames root first, each ``"func (file)"`` as py-spy writes them) gets one category:

1. ``spin_wait`` if any frame is a busy-wait (vLLM's shm_broadcast ``SpinCondition.wait`` /
   ``acquire_read``, ``sched_yield``): on-CPU time that does no useful work and must not be blamed;
2. ``waiting`` if the leaf frame is a blocking wait (``Condition.wait``, ``select``, ``poll``, ``sleep``...):
   sampled while the thread was about to block or had just woken;
3. otherwise the category of the frame nearest the leaf that matches one of the patterns below, so the
   most specific work wins (``model_dump_json`` under a starlette handler is serialisation, a
   tokenizer call under a request handler is tokenisation);
4. ``other`` when nothing matches.
"""

from __future__ import annotations

import re

CATEGORIES: tuple[str, ...] = (
    "http_serialization", "tokenization", "detokenization", "request_processing", "scheduling",
    "model_forward", "sampling", "ipc", "event_loop", "waiting", "spin_wait", "native", "other",
)

CATEGORY_TEXT: dict[str, str] = {
    "http_serialization": "HTTP server, routing, JSON/SSE serialisation",
    "tokenization": "prompt tokenisation",
    "detokenization": "incremental detokenisation of output tokens",
    "request_processing": "frontend request/output processing (engine client, output processor)",
    "scheduling": "engine-core loop and scheduler (batch building, KV-cache block management)",
    "model_forward": "model execution: input preparation and forward pass",
    "sampling": "sampling and logits processing",
    "ipc": "inter-process messaging (ZMQ, shared-memory queues, msgpack)",
    "event_loop": "asyncio/uvloop event loop in native code",
    "waiting": "blocking waits caught on-CPU (condition, queue, select, sleep)",
    "spin_wait": "busy-wait polling (sched_yield spin): on-CPU but not useful work",
    "native": "threads without Python frames (OpenMP/BLAS pools, runtime threads)",
    "other": "frames that match no serving category",
}

_SPIN = re.compile(r"\bsched_yield\b|SpinCondition\.wait|acquire_read \([^)]*shm_broadcast|\bspin_wait\b|busy_wait")
_WAIT_LEAF = re.compile(
    r"^(Condition\.wait|Event\.wait|Queue\.get|SimpleQueue\.get|_PollLikeSelector\.select|"
    r"(Epoll|Poll|Select|Kqueue|Default)Selector\.select|select|poll|Poller\.poll|wait|sleep|"
    r"_wait_for_tstate_lock|Thread\.join|recv|recv_multipart|accept|Connection\._recv.*|"
    r"BaseEventLoop\._run_once|_run_once|Future\.result|_worker)\b"
)
# (category, pattern over one frame "func (file)"); checked in this order on each frame
_FRAME_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("detokenization", re.compile(r"detokeniz|Detokeniz|\bdecode\b.*tokeniz|convert_ids_to_tokens|"
                                  r"decode_batch|IncrementalDetokenizer|decode_token|_decode\b.*tokeniz")),
    ("tokenization", re.compile(r"(?<![dD]e)[tT]okeniz|encode_batch|_encode_plus|TokenizerPool|"
                                r"\bencode\b.*tokeniz|apply_chat_template")),
    ("sampling", re.compile(r"[sS]ampler|sample_tokens|topk_topp|logits_processor|LogitsProcessor|"
                            r"vllm/v1/sample/|compute_logprobs|apply_penalties")),
    ("model_forward", re.compile(r"execute_model|model_executor/|_custom_ops|forward_context|model_runner|"
                                 r"torch/|(^|\.)forward \(|_inductor|_functorch|attention|cpu_attn|"
                                 r"vllm/compilation/|triton|onednn|gemm")),
    ("scheduling", re.compile(r"Scheduler\.|core/sched/|kv_cache_manager|kv_cache_coordinator|block_pool|"
                              r"kv_cache_utils|KVCache|EngineCore\.step|run_busy_loop|_process_engine_step|"
                              r"schedule_batch|scheduler\.py")),
    ("ipc", re.compile(r"zmq/|shm_broadcast|serial_utils|msgpack|collective_rpc|multiproc_executor|"
                       r"_send_msg|process_input_sockets|process_output_sockets|core_client\.py|"
                       r"multiprocessing/connection")),
    ("http_serialization", re.compile(r"uvicorn/|starlette/|fastapi/|pydantic|h11|httptools|\bjson\b|orjson|"
                                      r"_sse|\bsse\b|aiohttp/|prometheus_fastapi|model_dump|"
                                      r"prometheus_client|http/")),
    ("request_processing", re.compile(r"vllm/entrypoints/|vllm/v1/engine/|vllm/renderers/|"
                                      r"sglang/srt/managers/|vllm/inputs/|vllm/outputs")),
    ("event_loop", re.compile(r"^(Runner\.run|run|run_forever|run_until_complete) \((asyncio|uvloop)/")),
)


def func_of(frame: str) -> str:
    i = frame.find(" (")
    return frame if i < 0 else frame[:i]


def categorize(frames: list[str]) -> str:
    """The serving category of one stack (frames root first)."""
    if not frames:
        return "other"
    if any(_SPIN.search(f) for f in frames):
        return "spin_wait"
    if _WAIT_LEAF.match(func_of(frames[-1])):
        return "waiting"
    for f in reversed(frames):
        for cat, pat in _FRAME_RULES:
            if pat.search(f):
                return cat
    return "other"
