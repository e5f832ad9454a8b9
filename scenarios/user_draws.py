"""Randomised variants of the families from user reports (issue 34; scenarios/user_families*.yaml, the
threads in docs/families-from-users.md), drawn by scenarios/heldout.py with ``--families user``.

The fixed scenarios of user_families*.yaml are the tuning members of these families; a held-back split is
drawn from its own seed with ``--avoid`` naming the tuning file, so no held-back variant repeats one, and is
run once with the final rules and scored before its bundles are opened:

    python -m scenarios.heldout --engine llamacpp --families user --seed S \\
        --avoid scenarios/user_families_llamacpp.yaml -o scenarios/heldout_user_llamacpp.yaml
    python -m scenarios.heldout --families user --seed S --avoid scenarios/user_families.yaml \\
        -o scenarios/heldout_user.yaml
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

Make = Callable[..., dict[str, Any]]

# grammars that never end an output (the load asks for exactly --output-tokens with ignore_eos: a grammar
# whose language ends would leave no token to sample once it is complete)
GRAMMARS = ("root ::= [a-z ]*", "root ::= ([a-z]+ \" \")*", "root ::= [a-zA-Z0-9 .,]*")


def _refused(v: dict[str, Any]) -> dict[str, Any]:
    """Every request refused for its context: the run is invalid (VAL007, critical, first) and its title names
    the context overflow with the sizes; ERR001, the named cause, must be in the top three."""
    v["expect"] = {"top": "VAL007", "top3": ["VAL007", "ERR001"]}
    return v


def draw_llama(r: random.Random, v: Make) -> list[dict[str, Any]]:
    """One variant of each llama.cpp family of user_families_llamacpp.yaml (llama-server on one core, -t 1)."""
    out: list[dict[str, Any]] = []
    np_, n_in = r.choice([2, 3, 4]), r.choice([64, 128, 256])
    out.append(v(f"user_llama_no_cont_batching_np{np_}_in{n_in}",
                 f"-np {np_} --no-cont-batching at c={np_} ({n_in}-token prompts)", "SCH011",
                 ["--concurrency", str(np_), "--input-tokens", str(n_in)],
                 ["-np", str(np_), "-c", str(2048 * np_), "--no-cont-batching"]))
    b, n_in, c = r.choice([16, 32, 64]), r.choice([512, 768, 1024]), r.choice([1, 2])
    out.append(v(f"user_llama_small_batch_b{b}_in{n_in}_c{c}", f"--batch-size {b}, {n_in}-token prompts, c={c}",
                 "SCH004", ["--concurrency", str(c), "--input-tokens", str(n_in), "--output-tokens", "16"], ["-b", str(b)]))
    share, n_in, c = r.choice([0.6, 0.75, 0.9]), r.choice([768, 1024]), r.choice([1, 2])
    out.append(v(f"user_llama_prompt_cache_off_p{int(share * 100)}_in{n_in}_c{c}",
                 f"--no-cache-prompt, {share:.0%} shared prefix of {n_in}-token prompts, c={c}", "SCH006",
                 ["--concurrency", str(c), "--input-tokens", str(n_in), "--output-tokens", "32",
                  "--shared-prefix", str(share)], ["--no-cache-prompt"]))
    n_out, c = r.choice([64, 128, 256]), r.choice([1, 2])
    out.append(v(f"user_llama_top_k_disabled_o{n_out}_c{c}", f"--top-k 0, {n_out}-token outputs at c={c}", "SCH012",
                 ["--concurrency", str(c), "--output-tokens", str(n_out), "--timeout", "120s"], ["--top-k", "0"]))
    g, n_out, c = r.randrange(len(GRAMMARS)), r.choice([64, 128]), r.choice([1, 2])
    out.append(v(f"user_llama_grammar_default_g{g}_o{n_out}_c{c}",
                 f"--grammar '{GRAMMARS[g]}' for every request, {n_out}-token outputs at c={c}", "SCH013",
                 ["--concurrency", str(c), "--output-tokens", str(n_out), "--timeout", "120s"], ["--grammar", GRAMMARS[g]]))
    np_, top = r.choice([2, 3, 4]), r.choice([1024, 1536])
    out.append(v(f"user_llama_long_prompt_stalls_slots_np{np_}_max{top}",
                 f"-np {np_}, prompts of 64 to {top} tokens, 64-token outputs at c={np_}", "SCH007",
                 ["--concurrency", str(np_), "--input-tokens", f"uniform:min=64,max={top}", "--output-tokens", "64"],
                 ["-np", str(np_), "-c", str(2048 * np_)]))
    # llama.cpp rounds a slot's context up to a multiple of 256 (scenarios/README.md), so slots of 256 or 512
    (np_, per), over = r.choice([(1, 256), (2, 256), (1, 512), (2, 512)]), r.choice([128, 256])
    out.append(_refused(v(f"user_llama_prompt_over_slot_np{np_}_ctx{np_ * per}_in{per + over}",
                 f"-np {np_} -c {np_ * per} ({per} tokens a slot) against {per + over}-token prompts", "VAL007",
                 ["--concurrency", str(np_), "--input-tokens", str(per + over), "--output-tokens", "32"],
                 ["-np", str(np_), "-c", str(np_ * per)])))
    turns, n_in, c = r.choice([3, 4, 5]), r.choice([128, 256]), r.choice([1, 2])
    out.append(v(f"user_llama_multiturn_cache_off_t{turns}_in{n_in}_c{c}",
                 f"{turns}-turn conversations ({n_in} new tokens a turn), --no-cache-prompt, c={c}", "SCH006",
                 ["--concurrency", str(c), "--turns", str(turns), "--input-tokens", str(n_in), "--output-tokens", "64"],
                 ["--no-cache-prompt"]))
    return out


def draw_vllm(r: random.Random, v: Make) -> list[dict[str, Any]]:
    """One variant of each vLLM CPU family of user_families.yaml."""
    out: list[dict[str, Any]] = []
    mml, over = r.choice([256, 512]), r.choice([64, 256])
    out.append(_refused(v(f"user_vllm_prompt_over_max_model_len_m{mml}_in{mml + over}",
                 f"--max-model-len {mml} against {mml + over}-token prompts", "VAL007",
                 ["--concurrency", "2", "--input-tokens", str(mml + over), "--output-tokens", "16"],
                 ["--max-model-len", str(mml)])))
    top, budget, c = r.choice([1536, 1792]), r.choice([2048, 4096]), r.choice([4, 6])
    out.append(v(f"user_vllm_long_prompts_stall_decode_max{top}_b{budget}_c{c}",
                 f"prompts of 32 to {top} tokens with 64-token outputs, --max-num-batched-tokens {budget}, c={c}", "SCH007",
                 ["--concurrency", str(c), "--input-tokens", f"uniform:min=32,max={top}", "--output-tokens", "64"],
                 ["--max-num-batched-tokens", str(budget)]))
    turns, n_in, c = r.choice([3, 4, 5]), r.choice([128, 256]), r.choice([2, 4])
    out.append(v(f"user_vllm_multiturn_prefix_cache_off_t{turns}_in{n_in}_c{c}",
                 f"{turns}-turn conversations ({n_in} new tokens a turn), --no-enable-prefix-caching, c={c}", "SCH006",
                 ["--concurrency", str(c), "--turns", str(turns), "--input-tokens", str(n_in), "--output-tokens", "64"],
                 ["--no-enable-prefix-caching"]))
    # the twelfth family (drawn last, so the draws above stay those of the seeds already run); the server's
    # --max-logprobs raised to the alternatives asked (vLLM refuses more, HTTP 400)
    top, c = r.choice([300, 500, 1000]), r.choice([1, 2])
    out.append(v(f"user_vllm_many_logprobs_k{top}_c{c}", f"logprobs {top} with every token, 64-token outputs at c={c}",
                 "SCH014", ["--concurrency", str(c), "--output-tokens", "64", "--logprobs", str(top), "--timeout", "120s"],
                 ["--max-logprobs", str(top)]))
    return out
