"""The analysis side of llama.cpp support (issue 15), on the shipped llama.cpp samples and small inputs: queue
time by Little's law for an engine without a queue histogram, cut outputs, experiments in the engine's own
flags, the settings line of the report, and SCH010 standing while a client near its limit holds timing
findings back."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnose.engines.detect import settings_from_cmdline
from diagnose.engines.experiments import named_settings, spell_change
from diagnose.io.manifest import read_manifest
from diagnose.model import Signal
from diagnose.pipeline import analyze
from diagnose.reports.render import render_html
from diagnose.reports.view_model import engine_settings
from diagnose.rules.engine import evaluate
from diagnose.rules.spec import load_rules, load_thresholds

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"


def test_queue_time_by_littles_law_where_the_engine_has_no_histogram() -> None:
    a = analyze(SAMPLES / "llama_slots_saturated")
    q = a.signals["server_queue_time_mean_ms"]
    share = a.signals["server_queue_share_of_ttft_ratio"]
    assert "Little's law" in q.description and "no queue-time histogram" in q.description
    # 14 waiting behind 2 slots: nearly all of the time to first token is the wait, and the wait by Little's
    # law is within the client's TTFT (it cannot be more than the whole)
    assert 0.8 < share.value <= 1.0
    assert q.value <= a.signals["ttft_p99_ms"].value
    assert a.findings[0].rule_id == "SCH001"
    v = analyze(SAMPLES / "vllm_cpu_queue_bound")  # an engine with the histogram keeps its own
    assert "Little" not in v.signals["server_queue_time_mean_ms"].description
    assert v.signals["server_queue_share_of_ttft_ratio"].description == "server mean queue time / server mean TTFT"


def test_cut_outputs_are_counted_from_finish_reasons_and_usage() -> None:
    a = analyze(SAMPLES / "llama_ctx_too_small")
    assert a.signals["output_cut_share_ratio"].value > 0.9  # 128-token prompts in 256-token slots, 256 asked
    assert a.signals["output_tokens_asked_mean"].value == 256
    assert a.signals["output_tokens_mean"].value < 140
    assert a.signals["context_wanted_tokens"].value == pytest.approx((a.signals["prompt_tokens_mean"].value + 256) * 2)
    f = a.findings[0]
    assert f.rule_id == "SCH010" and f.causes[0].status == "supported"
    assert f.causes[0].experiment is not None and f.causes[0].experiment.change.startswith("raise --ctx-size")
    v = analyze(SAMPLES / "vllm_cpu_healthy")
    assert v.signals["output_cut_share_ratio"].value == 0.0  # every output as long as asked


@pytest.mark.parametrize(("change", "kind", "name", "engine", "want"), [
    ("raise --max-num-seqs (to 16) and repeat", "engine_flag", "max_num_seqs", "llamacpp", "raise --parallel (to 16) and repeat"),
    ("raise --max-num-seqs and repeat", "engine_flag", "max_num_seqs", "vllm", "raise --max-num-seqs and repeat"),
    ("raise --max-num-seqs and repeat", "engine_flag", "max_num_seqs", "sglang", "raise --max-running-requests and repeat"),
    ("raise --max-model-len to 768", "engine_flag", "context_length", "llamacpp", "raise --ctx-size to 768"),
    # another flag that merely starts with the same text is left alone
    ("lower --max-num-seqs-x", "engine_flag", "max_num_seqs", "llamacpp", "lower --max-num-seqs-x"),
    # no plain equivalent (a flag to remove), another kind of variable, no engine: unchanged
    ("enable prefix caching (remove --no-enable-prefix-caching)", "engine_flag", "prefix_caching", "sglang",
     "enable prefix caching (remove --no-enable-prefix-caching)"),
    ("halve --output-tokens", "client", "--output-tokens", "llamacpp", "halve --output-tokens"),
    ("raise --max-num-seqs", "engine_flag", "max_num_seqs", None, "raise --max-num-seqs"),
])
def test_an_experiment_names_the_engines_own_flag(change: str, kind: str, name: str, engine: str | None,
                                                  want: str) -> None:
    assert spell_change(change, kind, name, engine) == want


def test_the_report_names_the_settings_read_by_the_engines_flags() -> None:
    manifest = {"target": {"engine": "llamacpp", "engine_config": {"max_num_seqs": 2, "context_size": 4096,
                                                                   "threads": 1, "flash_attention": 1}}}
    t = read_manifest(manifest, "m").target
    named = named_settings(t.engine_config, t.engine)
    assert named == [("--ctx-size", 4096), ("flash_attention", 1), ("--parallel", 2), ("--threads", 1)]
    assert engine_settings(named) == "--ctx-size 4096, flash_attention 1, --parallel 2, --threads 1"
    assert engine_settings(named_settings({"max_num_seqs": 2}, "vllm")) == "--max-num-seqs 2"
    assert engine_settings(named_settings({}, None)) == ""
    # named once by the pipeline, before the view (the page only joins them)
    a = analyze(SAMPLES / "llama_slots_saturated")
    assert a.engine_settings == [("--ctx-size", 4096), ("--parallel", 2), ("--threads", 1)]
    page = render_html(a)
    assert "Engine settings read from the server: --ctx-size 4096, --parallel 2, --threads 1" in page


def test_flash_attention_is_read_from_the_command_line_when_it_is_a_word() -> None:
    assert settings_from_cmdline(["llama-server", "-fa", "on", "-np", "4"]) == {"flash_attention": 1.0,
                                                                               "max_num_seqs": 4.0}
    assert settings_from_cmdline(["llama-server", "--flash-attn=off"]) == {"flash_attention": 0.0}
    assert settings_from_cmdline(["llama-server", "-fa", "auto"]) == {}  # not known until the server decides


def _sig(values: dict[str, float], source: str = "client") -> dict[str, Signal]:
    return {k: Signal(k, v, "", source, "") for k, v in values.items()}  # type: ignore[arg-type]


def test_a_client_near_its_limit_does_not_hold_back_cut_outputs() -> None:
    """VAL006 holds back findings that read only client timings; cut outputs are counted, not timed."""
    sig = _sig({"client_loop_lag_p99_ms": 1.0, "itl_p50_ms": 0.6, "ttft_p50_ms": 20.0, "output_cut_share_ratio": 1.0,
                "output_tokens_mean": 121.0, "output_tokens_asked_mean": 256.0, "prompt_tokens_mean": 128.0})
    res = evaluate(load_rules(), sig, load_thresholds())
    by = {f.rule_id: f for f in res.findings}
    assert "VAL006" in by and "SCH010" in by
    assert not by["SCH010"].held_back
    assert res.findings[0].rule_id == "SCH010"


def test_a_llamacpp_report_speaks_llamacpps_words() -> None:
    """Issue 32: the llama.cpp sample's top cause said 'the batch-size cap (max-num-seqs)' and 'max_num_seqs = 2'
    beside the right experiment (--parallel); every finding's prose now uses the engine map's spelling."""
    from diagnose.engines.experiments import spell_text

    a = analyze(SAMPLES / "llama_slots_saturated")
    texts = [f.title + f.hypothesis for f in a.findings]
    texts += [c.cause + c.confirm + c.refute + c.status_evidence + (c.experiment.change if c.experiment else "")
              for f in a.findings for c in f.causes]
    prose = " ".join(texts)
    assert "max-num-seqs" not in prose and "--parallel" in prose, prose
    assert "max_num_seqs =" not in prose and "max_num_seqs (--parallel) = 2" in prose
    assert a.verdict is not None and "--parallel" in a.verdict.cause
    assert spell_text("raise --max-num-seqs", "vllm") == "raise --max-num-seqs"
    assert spell_text("the cap (max-num-seqs)", "sglang") == "the cap (--max-running-requests)"
    assert spell_text("cap --max-num-seqs, cuda graphs --enforce-eager", None) == "cap --max-num-seqs, cuda graphs --enforce-eager"


def test_prefix_caching_is_switched_with_each_engines_own_flags() -> None:
    """SCH006's cause and experiment name vLLM's --no-enable-prefix-caching; on llama-server the flag that turns
    the prompt cache off is --no-cache-prompt (--cache-reuse, suggested before, is KV shifting and does not undo
    it), on SGLang --disable-radix-cache."""
    from diagnose.engines.experiments import flag_for, spell_text

    change = "enable prefix caching (remove --no-enable-prefix-caching) and repeat the same workload"
    assert spell_text(change, "llamacpp") == "enable prefix caching (remove --no-cache-prompt) and repeat the same workload"
    assert spell_text("disabled (--no-enable-prefix-caching)", "sglang") == "disabled (--disable-radix-cache)"
    assert spell_text(change, "vllm") == change
    assert flag_for("prefix_caching", "llamacpp") == "--cache-prompt"
