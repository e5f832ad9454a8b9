"""An output's fingerprint for the quality guard (attach --greedy; diagnose/compare/quality.py reads it).

The load client keeps, per request, a hash of its prompt (with its max_tokens: two runs with one workload seed
send the same prompts, and this pairs them), a hash of the whole output and hashes of the output's prefixes at
every ``STEP`` tokens, so two runs' outputs can be told identical or not, and where they first part. These are
hashes of the output's **text** as streamed (the servers' OpenAI-compatible streams carry text; token ids only
with engine-specific options): two outputs whose tokens differ but decode to the same text count as identical.
No text is stored (unless --store-text): the shortest prefix hashed is ``STEP`` tokens, too many to guess token
by token from a vocabulary."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

STEP = 8  # tokens between prefix hashes: the first divergence is located to within this many tokens


def _h(data: bytes, size: int = 8) -> str:
    return hashlib.blake2b(data, digest_size=size).hexdigest()


def prompt_hash(text: str, max_tokens: int) -> str:
    return _h(f"{max_tokens}\0{text}".encode("utf-8", "surrogatepass"))


def output_hashes(pieces: Sequence[str], tokens: Sequence[int]) -> dict[str, Any]:
    """``output_hash`` (16 hex digits) of the whole text, and ``output_prefix_hashes``: [tokens so far, hash of
    the text so far (8 hex digits)] each time the streamed tokens pass a multiple of ``STEP`` (one per chunk at
    most; a chunk of several tokens is hashed where it ends)."""
    h = hashlib.blake2b(digest_size=8)
    marks: list[list[Any]] = []
    done = 0
    for piece, n in zip(pieces, tokens, strict=False):
        h.update(piece.encode("utf-8", "surrogatepass"))
        before, done = done, done + int(n)
        if done // STEP > before // STEP:
            marks.append([done, h.copy().hexdigest()[:8]])
    return {"output_hash": h.hexdigest(), "output_prefix_hashes": marks}
