"""Synthetic prompts with a requested length in tokens, unique per request unless a shared prefix is asked.

A prompt is a run of common English words separated by spaces. Byte-level BPE tokenizers (GPT-2, Llama 3,
Qwen, and the tiny test model) pre-split text at spaces, so each " word" piece is tokenized on its own: with a
vocabulary of words that are exactly one token each, a prompt of N words is exactly ``base + N`` tokens, where
``base`` is what the server adds (BOS, chat template). Calibration asks the server's ``/tokenize`` once per
candidate word and then checks two whole prompts; when that holds the length is exact (source ``tokenize``).
Without ``/tokenize`` (or when the check fails) the length is an estimate (source ``estimate``, 1 token per
word plus 1 for BOS, or the ratio the check measured); the server's ``usage.prompt_tokens`` is recorded next
to it either way.

Uniqueness: after the shared prefix (``shared_prefix_fraction`` of the words, the same for every request),
each prompt starts with its request number written in base-K digits using the word list itself, then
seeded random words (a window of one seeded pool). Prefix caching therefore cannot hit beyond the shared prefix.

Replay (``make_replay``, docs/workload.md): a prompt of a recorded length whose leading blocks are the seeded
text of the recorded block hashes (the same words for the same hash), then the request number and filler.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

import orjson

from diagnose.probes.http_client import HttpClient, RequestFailed

Source = Literal["tokenize", "estimate"]

_WORDS = (
    "the of and to in is that for it as with was on be by this are or from at an not but have all can "
    "which one if has will their there been more when would so no out up into time other some what only "
    "its new first also any these may such two like then over used value name data file list type line "
    "self return none true false default object class def import test error string path key item result "
    "number set get add make use each where most very well long part make good state make after case"
)
CANDIDATES = tuple(_WORDS.split())
ID_DIGITS = 5  # request numbers up to K**5 are unique (K >= 16: over a million)
CALIBRATE_CONCURRENCY = 8  # /tokenize calls in flight while calibrating (llama-server has few HTTP threads)
CALIBRATE_TRIES = 3  # a failed call is asked again: the words chosen must not depend on dropped calls
FILL_POOL = 1 << 16  # words in the seeded pool the prompts' random filler is cut from


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: int  # planned prompt length (tokenize: exact; estimate: expected)
    source: Source


class PromptFactory:
    """Makes prompt i of a run; :meth:`calibrate` once against the server first (optional)."""

    def __init__(self, input_tokens: int, *, shared_prefix_fraction: float = 0.0, seed: int = 0,
                 api: str = "completions") -> None:
        self.input_tokens = max(1, int(input_tokens))
        self.shared_fraction = min(max(float(shared_prefix_fraction), 0.0), 1.0)
        self.seed = seed
        self.api = api
        self.engine: str | None = None  # the server's engine (diagnose/engines/detect.py), set by calibrate
        self.words: list[str] = list(dict.fromkeys(CANDIDATES))
        self.base = 1  # tokens the server adds around the text (BOS; chat template)
        self.per_word = 1.0
        self.source: Source = "estimate"
        self.note = "not calibrated: 1 token per word + 1 assumed"
        self._shared: list[str] = []
        self._block = functools.lru_cache(maxsize=1024)(self._make_block)
        self._rebuild()

    # -- planning -----------------------------------------------------------------------------
    def _n_words(self) -> int:
        return max(ID_DIGITS + 1, round((self.input_tokens - self.base) / self.per_word))

    def _rebuild(self) -> None:
        n = self._n_words()
        n_shared = min(int(round(self.shared_fraction * n)), n - ID_DIGITS)
        rng = random.Random(f"shared-{self.seed}")
        self._shared = rng.choices(self.words, k=max(0, n_shared))
        # The random filler comes from one seeded pool, each prompt a window of it: seeding a generator
        # per prompt cost ~40 us, and a closed loop's wave makes hundreds of prompts in one event-loop
        # turn (a 10 ms stall at concurrency 256 that delayed every chunk arriving meanwhile).
        self._n_fill = max(0, n - len(self._shared) - ID_DIGITS)
        pool_rng = random.Random(f"fill-{self.seed}")
        self._pool = pool_rng.choices(self.words, k=max(FILL_POOL, 2 * self._n_fill + 1))
        self._prefix = " " + " ".join(self._shared) + " " if self._shared else " "
        self._block.cache_clear()

    def shared_prefix_tokens(self) -> int:
        """Tokens of the prefix every request shares (after what the server adds): 0 without one."""
        return round(len(self._shared) * self.per_word)

    def planned_tokens(self) -> int:
        return self.base + round(self._n_words() * self.per_word)

    def _ident(self, i: int) -> list[str]:
        words = self.words
        k = len(words)
        ident = []
        v = i
        for _ in range(ID_DIGITS):
            ident.append(words[v % k])
            v //= k
        return ident

    def make(self, i: int) -> Prompt:
        ident = self._ident(i)
        m = self._n_fill
        start = (i * 2_654_435_761) % (len(self._pool) - m)  # Knuth's multiplicative hash: spread windows
        text = self._prefix + " ".join(ident + self._pool[start:start + m])
        return Prompt(text=text, tokens=self.planned_tokens(), source=self.source)

    def make_sized(self, i: int, tokens: int) -> Prompt:
        """Prompt ``i`` of a drawn length (``--input-tokens`` a distribution): ``tokens`` long, the shared
        prefix first (as much of it as fits), then the request's number and seeded filler, as :meth:`make`."""
        n = max(1, round((tokens - self.base) / self.per_word))
        shared = self._shared[:max(0, n - ID_DIGITS)]
        rest = n - len(shared)
        out = self._unique(i, rest)
        return Prompt(text=" " + " ".join([*shared, *out]), tokens=self.base + round(n * self.per_word),
                      source=self.source)

    def _unique(self, i: int, n: int) -> list[str]:
        """The ``n`` words unique to request ``i``: its number, then a window of the seeded filler pool (wrapping
        round for prompts longer than the pool)."""
        out = self._ident(i)[:n]
        m = n - len(out)
        pool = self._pool
        start = (i * 2_654_435_761) % len(pool)
        while m > 0:
            part = pool[start:start + m]
            out += part
            m -= len(part)
            start = 0
        return out

    # -- replay: a recorded length and prefix groups ----------------------------------------------------
    def _make_block(self, h: str, n_words: int) -> tuple[str, ...]:
        return tuple(random.Random(f"block-{self.seed}-{h}").choices(self.words, k=n_words))

    def make_replay(self, i: int, tokens: int, prefix: Sequence[str] = (), block_tokens: int = 16) -> Prompt:
        """Prompt ``i`` of a replay: ``tokens`` long; its leading blocks (``block_tokens`` each) are the text of
        the block hashes in ``prefix`` -- the same text for the same hash, so requests that shared a prefix
        share it again -- and the rest is unique to the request (its number, then seeded filler)."""
        n = max(1, round((tokens - self.base) / self.per_word))
        bw = max(1, round(block_tokens / self.per_word))
        out: list[str] = []
        for h in prefix:
            if len(out) >= n:
                break
            out.extend(self._block(h, bw))
        del out[n:]
        rest = n - len(out)
        if rest > 0:
            out += self._unique(i, rest)
        return Prompt(text=" " + " ".join(out), tokens=self.base + round(n * self.per_word), source=self.source)

    # -- calibration against the server ---------------------------------------------------------
    async def _count(self, client: HttpClient, model: str | None, text: str) -> int | None:
        msgs = [{"role": "user", "content": text}] if self.api == "chat" else None
        return await count_tokens(client, tokenize_body(self.engine, model, text, msgs))

    async def _count_words(self, client: HttpClient, model: str | None) -> list[int | None]:
        """Each candidate word's token count, a few at a time, and a word whose /tokenize call failed asked again
        (twice at most): the one-token words chosen must not depend on which calls a busy server dropped, or two
        captures with the same --seed would send different prompts (their outputs could not be paired)."""
        gate = asyncio.Semaphore(CALIBRATE_CONCURRENCY)

        async def one(w: str) -> int | None:
            for _ in range(CALIBRATE_TRIES):
                async with gate:
                    n = await self._count(client, model, " " + w)
                if n is not None:
                    return n
            return None

        return list(await asyncio.gather(*(one(w) for w in self.words)))

    async def calibrate(self, client: HttpClient, model: str | None, engine: str | None = None) -> str:
        """Find one-token words via /tokenize and check whole prompts; returns a note for the manifest.
        ``engine`` picks the /tokenize request's form (llama-server's differs: :func:`tokenize_body`)."""
        self.engine = engine
        base = await self._count(client, model, "")
        if base is None:
            self.note = "server has no usable /tokenize: prompt length estimated (1 token per word + 1)"
            return self.note
        counts = await self._count_words(client, model)
        single = [w for w, c in zip(self.words, counts, strict=True) if c is not None and c - base == 1]
        if len(single) >= 16:
            self.words = single[:64]
            self.base = base
            self.per_word = 1.0
            self._rebuild()
            checks = [self.make(i) for i in (0, 98765)]
            got = await asyncio.gather(*(self._count(client, model, p.text) for p in checks))
            if all(g == p.tokens for g, p in zip(got, checks, strict=True)):
                self.source = "tokenize"
                self.note = (f"exact via /tokenize: {len(self.words)} one-token words, "
                             f"{base} token(s) added by the server")
                return self.note
        # measure the ratio on a long sample and estimate from it
        self.base = base
        sample = self.make(0)
        got_n = await self._count(client, model, sample.text)
        if got_n is not None and got_n > base:
            self.per_word = (got_n - base) / max(1, self._n_words())
            self._rebuild()
        self.source = "estimate"
        self.note = (f"estimated: /tokenize exists but words are not single tokens here "
                     f"({self.per_word:.2f} tokens per word measured)")
        return self.note


class TokenizeBody(TypedDict, total=False):
    """A /tokenize request: llama-server's (content, add_special) or a vLLM-style server's (model, then prompt
    and add_special_tokens, or messages)."""

    content: str
    add_special: bool
    model: str | None
    prompt: str
    messages: list[dict[str, str]]
    add_special_tokens: bool


def tokenize_body(engine: str | None, model: str | None, text: str | None,
                  messages: Sequence[dict[str, str]] | None, special: bool = True) -> TokenizeBody | None:
    """The /tokenize request that counts what the completion would (None: this server cannot count it).
    llama-server reads ``content`` (no chat template); vLLM-style servers read ``prompt`` or ``messages``."""
    if engine == "llamacpp":
        if messages is not None:
            return None
        return {"content": text or "", "add_special": special}
    if messages is not None:
        return {"model": model, "messages": list(messages)}
    body: TokenizeBody = {"model": model, "prompt": text or ""}
    if not special:
        body["add_special_tokens"] = False
    return body


async def count_tokens(client: HttpClient, body: TokenizeBody | None) -> int | None:
    """The server's token count for one /tokenize request (None: no usable answer)."""
    if body is None:
        return None
    try:
        status, raw = await client.request("POST", "/tokenize", body, timeout_s=10.0)
    except RequestFailed:
        return None
    if status != 200:
        return None
    try:
        js = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if isinstance(js, dict):
        if isinstance(js.get("count"), int) and not isinstance(js.get("count"), bool):
            return int(js["count"])
        if isinstance(js.get("tokens"), list):
            return len(js["tokens"])
    return None
