"""An output's fingerprint for the quality guard (attach --greedy; diagnose/compare/quality.py reads it).

The load client keeps, per request, a hash of its prompt (with its max_tokens: two runs with one workload seed
send the same prompts, and this pairs them), a hash of the whole output and hashes of the output's prefixes at
every ``STEP`` tokens, so two runs' outputs can be told identical or not, and where they first part.

What is hashed (``output_hash_of``): the output's **token ids** where the server streams them (the client asks
with ``return_token_ids``, which vLLM honours; the prefixes are then at exact multiples of ``STEP`` tokens),
else its **text** as streamed (llama.cpp's and OpenAI's streams carry text only): two outputs whose tokens
differ but decode to the same text then count as identical, and a prefix is hashed where the chunk that passes
a multiple of ``STEP`` ends. Two runs are compared only where both hashed the same thing. No text is stored
(unless --store-text): the shortest prefix hashed is ``STEP`` tokens, too many to guess token by token from a
vocabulary."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict

STEP = 8  # tokens between prefix hashes: the first divergence is located to within this many tokens


def _h(data: bytes, size: int = 8) -> str:
    return hashlib.blake2b(data, digest_size=size).hexdigest()


def prompt_hash(text: str, max_tokens: int) -> str:
    return _h(f"{max_tokens}\0{text}".encode("utf-8", "surrogatepass"))


class OutputHashes(TypedDict):
    """A request record's output hashes: the whole output's, [count, prefix hash] marks, and what was hashed
    (``token_ids`` or ``text``; left out by :func:`_text_hashes`, which its caller completes)."""

    output_hash: str
    output_prefix_hashes: list[list[Any]]
    output_hash_of: NotRequired[str]


def output_hashes(pieces: Sequence[str], tokens: Sequence[int],
                  token_ids: Sequence[int] | None = None) -> OutputHashes:
    """The output's hashes (see the module): of its token ids when the stream gave them (a non-empty list),
    else of its text."""
    if token_ids:
        return _id_hashes(token_ids)
    return {**_text_hashes(pieces, tokens), "output_hash_of": "text"}


def _id_hashes(ids: Sequence[int]) -> OutputHashes:
    """``output_hash`` of the token ids (each as 8 little-endian bytes), and a prefix hash at every multiple
    of ``STEP`` ids."""
    h = hashlib.blake2b(digest_size=8)
    marks: list[list[Any]] = []
    for i in range(0, len(ids), STEP):
        h.update(b"".join(int(x).to_bytes(8, "little", signed=True) for x in ids[i:i + STEP]))
        if i + STEP <= len(ids):
            marks.append([i + STEP, h.copy().hexdigest()[:8]])
    return {"output_hash": h.hexdigest(), "output_prefix_hashes": marks, "output_hash_of": "token_ids"}


def _text_hashes(pieces: Sequence[str], tokens: Sequence[int]) -> OutputHashes:
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
