"""Experiments as data: the one variable an experiment changes, of which kind, and its suggested value.

Every rule's experiment names a ``variable`` (rules/catalog/*/*.yaml, checked by ``diagnose rules lint``):

    variable: {kind: engine_flag, name: max_num_seqs, value: {signal: client_in_flight_mean, round: up}}

* ``kind``: ``engine_flag`` (a server setting, named engine-neutrally here and spelt per engine by
  ``ENGINE_FLAGS``), ``env`` (an environment variable of the server), ``client`` (a setting of the workload:
  a ``diagnose attach`` option), ``deployment`` (hardware, placement, replicas: nothing a flag sets);
* ``name``: for ``engine_flag`` a key of ``ENGINE_FLAGS``; otherwise the variable or option itself;
* ``value`` (optional): a literal (``16``, ``"fp8"``, ``"off"``), or ``{signal: NAME, times: K, round: up}``
  resolved from the bundle's signals (``times`` defaults to 1; ``round: up`` rounds up to a whole number).

An engine's spelling of a flag is the one its own CLI documents; a flag an engine has no equivalent for is
absent (the experiment then names the neutral setting only).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from diagnose.model import Signal

VARIABLE_KINDS = ("engine_flag", "env", "client", "deployment")

# neutral setting -> (what it is, {engine: its flag})
ENGINE_FLAGS: dict[str, tuple[str, dict[str, str]]] = {
    "max_num_seqs": ("the batch-size cap (requests running at once)",
                     {"vllm": "--max-num-seqs", "sglang": "--max-running-requests",
                      "tgi": "--max-concurrent-requests", "llamacpp": "--parallel"}),
    "max_num_batched_tokens": ("the token budget of one engine step (prefill chunk size)",
                               {"vllm": "--max-num-batched-tokens", "sglang": "--chunked-prefill-size",
                                "tgi": "--max-batch-prefill-tokens", "llamacpp": "--batch-size"}),
    "kv_cache_size": ("the memory given to the KV cache",
                      {"vllm": "--gpu-memory-utilization", "sglang": "--mem-fraction-static",
                       "tgi": "--cuda-memory-fraction", "llamacpp": "--ctx-size"}),
    "context_length": ("the context one sequence may use (llama.cpp: the total the --parallel slots share)",
                       {"vllm": "--max-model-len", "sglang": "--context-length", "tgi": "--max-total-tokens",
                        "llamacpp": "--ctx-size"}),
    "threads": ("the engine's compute threads", {"llamacpp": "--threads"}),
    "kv_cache_dtype": ("the KV cache's data type", {"vllm": "--kv-cache-dtype", "sglang": "--kv-cache-dtype",
                                                    "llamacpp": "--cache-type-k"}),
    "prefix_caching": ("automatic prefix caching", {"vllm": "--enable-prefix-caching",
                                                    "sglang": "--disable-radix-cache (remove)",
                                                    "llamacpp": "--cache-prompt"}),
    "cuda_graphs": ("CUDA/HIP graph capture", {"vllm": "--enforce-eager (remove)",
                                               "sglang": "--disable-cuda-graph (remove)"}),
    "api_server_count": ("API-server (frontend) processes", {"vllm": "--api-server-count",
                                                             "sglang": "--tokenizer-worker-num"}),
    "quantization": ("weight quantisation", {"vllm": "--quantization", "sglang": "--quantization",
                                             "tgi": "--quantize"}),
    "request_logging": ("per-request logging", {"vllm": "--disable-log-requests", "sglang": "--log-level warning"}),
    "max_waiting_requests": ("the waiting-queue / admission limit", {"sglang": "--max-queued-requests",
                                                                      "tgi": "--max-waiting-tokens"}),
    "async_scheduling": ("overlap of CPU scheduling with GPU execution", {"vllm": "--async-scheduling",
                                                                         "sglang": "--enable-overlap-schedule"}),
    "custom_all_reduce": ("the engine's own all-reduce", {"vllm": "--disable-custom-all-reduce (remove)",
                                                          "sglang": "--disable-custom-all-reduce (remove)"}),
    "tensor_parallel_size": ("the tensor-parallel degree", {"vllm": "--tensor-parallel-size", "sglang": "--tp-size",
                                                            "tgi": "--num-shard"}),
    # llama.cpp settings from user reports (issue 34: SCH011-SCH013)
    "continuous_batching": ("continuous batching", {"llamacpp": "--no-cont-batching (remove)"}),
    "sampling_top_k": ("the server's default top-k", {"llamacpp": "--top-k"}),
    "constrained_decoding": ("a grammar / JSON schema for every request",
                             {"llamacpp": "--grammar / --json-schema (remove)"}),
}


def variable_problems(v: Any, where: str) -> list[str]:
    """Schema problems of one experiment's ``variable`` (rules lint)."""
    if not isinstance(v, dict):
        return [f"{where}: variable must be a mapping {{kind, name, value}}"]
    probs = []
    kind, name = v.get("kind"), v.get("name")
    if kind not in VARIABLE_KINDS:
        probs.append(f"{where}: variable kind {kind!r} not one of {', '.join(VARIABLE_KINDS)}")
    if not isinstance(name, str) or not name:
        probs.append(f"{where}: variable needs a name")
    elif kind == "engine_flag" and name not in ENGINE_FLAGS:
        probs.append(f"{where}: engine flag {name!r} is not in diagnose/engines/experiments.py ENGINE_FLAGS")
    for k in v:
        if k not in ("kind", "name", "value"):
            probs.append(f"{where}: unknown variable key {k!r}")
    value = v.get("value")
    if isinstance(value, dict):
        if not isinstance(value.get("signal"), str):
            probs.append(f"{where}: a computed value needs {{signal: NAME}}")
        if "times" in value and not isinstance(value["times"], (int, float)):
            probs.append(f"{where}: value times must be a number")
        if value.get("round", "up") != "up":
            probs.append(f"{where}: value round must be 'up'")
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        probs.append(f"{where}: value must be a literal or {{signal, times, round}}")
    return probs


def resolve_value(value: Any, signals: Mapping[str, Signal]) -> str:
    """The suggested value as text ('' when it cannot be computed from this bundle's signals)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)):
        return f"{value:g}"
    if isinstance(value, str):
        return value
    s = signals.get(str(value.get("signal")))
    if s is None or not s.is_finite():
        return ""
    x = s.value * float(value.get("times", 1))
    if value.get("round") == "up":
        x = math.ceil(x - 1e-9)
    return f"{x:g}"


def flag_for(name: str, engine: str | None) -> str:
    """The engine's own spelling of a neutral setting ('' when unknown for that engine)."""
    entry = ENGINE_FLAGS.get(name)
    if entry is None or not engine:
        return ""
    return entry[1].get(engine, "")


SETTING_FLAG = {"context_size": "context_length"}  # a setting the capture read -> the ENGINE_FLAGS name that sets it


def named_settings(engine_config: Mapping[str, float], engine: str | None) -> list[tuple[str, float]]:
    """The engine's settings the capture read (its /props, /server_info or command line), each named by the
    engine's own flag where diagnose knows it, else by the key it was read under, in the keys' order:
    [('--ctx-size', 4096), ('flash_attention', 1), ('--parallel', 2)]."""
    named = []
    for key, value in sorted(engine_config.items()):
        flag = flag_for(SETTING_FLAG.get(key, key), engine)
        named.append((flag if flag and "(" not in flag else key, value))
    return named


def describe(kind: str, name: str, value: str, engine: str | None = None) -> str:
    """One phrase: 'engine setting max_num_seqs (vllm: --max-num-seqs) = 16'."""
    if kind == "engine_flag":
        flag = flag_for(name, engine)
        head = f"engine setting {name}" + (f" ({engine}: {flag})" if flag else "")
    elif kind == "env":
        head = f"environment variable {name}"
    elif kind == "client":
        head = f"workload setting {name}"
    else:
        head = f"deployment: {name}"
    return head + (f" = {value}" if value else "")


# the flag that turns a setting OFF, where an engine has one: prose that says "remove --no-enable-prefix-caching"
# names the engine's own (llama-server's --no-cache-prompt; --cache-reuse is another thing: KV shifting)
OFF_FLAGS: dict[str, dict[str, str]] = {
    "prefix_caching": {"vllm": "--no-enable-prefix-caching", "sglang": "--disable-radix-cache",
                       "llamacpp": "--no-cache-prompt"},
}


def spell_text(text: str, engine: str | None) -> str:
    """Prose written in vLLM's words in the engine's own (the engine map, ``ENGINE_FLAGS``): on llama.cpp
    'the batch-size cap (max-num-seqs)' reads 'the batch-size cap (--parallel)', and a setting named by its
    neutral key in the evidence ('max_num_seqs = 2') gains the engine's flag ('max_num_seqs (--parallel) = 2').
    Unchanged for vLLM, an unknown engine, and settings an engine has no plain flag for."""
    if not engine or engine == "vllm" or not text:
        return text
    for off in OFF_FLAGS.values():  # before the on-flags: "--no-enable-prefix-caching" holds "enable-prefix-caching"
        if off.get("vllm") and off.get(engine):
            text = re.sub(rf"(?<![\w-]){re.escape(off['vllm'])}(?![\w-])", off[engine], text)
    for name, (_what, flags) in ENGINE_FLAGS.items():
        ours, theirs = flags.get("vllm", ""), flags.get(engine, "")
        if not ours or not theirs or "(" in ours or "(" in theirs:
            continue
        text = re.sub(rf"(?<![\w-])(?:--)?{re.escape(ours.removeprefix('--'))}(?![\w-])", theirs, text)
        text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?!\w| \()", f"{name} ({theirs})", text)
    return text


def spell_change(change: str, kind: str, name: str, engine: str | None) -> str:
    """An experiment's text with the engine's own flag for its variable: the catalogue writes vLLM's spelling
    (``raise --max-num-seqs``); on llama.cpp that reads ``raise --parallel``. Unchanged for vLLM, for other
    kinds of variable, and where the engine has no plain equivalent (none, or one to remove)."""
    if kind != "engine_flag" or not engine or engine == "vllm":
        return change
    ours, theirs = flag_for(name, "vllm"), flag_for(name, engine)
    if not ours or not theirs or "(" in ours or "(" in theirs:
        return change
    return re.sub(rf"(?<![\w-]){re.escape(ours)}(?![\w-])", theirs, change)
