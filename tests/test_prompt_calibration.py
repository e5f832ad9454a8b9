"""The one-token words a prompt builder calibrates on do not depend on which /tokenize calls a busy server
dropped: two captures with the same --seed then send the same prompts (the quality guard pairs outputs by
prompt). Found by the quality-guard work: a second llama-server calibrated on 26 words instead of 64."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from diagnose.probes.prompts import CALIBRATE_TRIES, PromptFactory


class Tokenizer:
    """A stand-in HttpClient for /tokenize: one token per word plus BOS; the first ``drop`` calls for each word
    in ``flaky`` answer 503 (a server short of HTTP threads)."""

    def __init__(self, flaky: set[str] = frozenset(), drop: int = 1) -> None:  # type: ignore[assignment]
        self.flaky, self.drop, self.seen = set(flaky), drop, {}  # type: dict[str, int]

    async def request(self, method: str, path: str, body: dict[str, Any], timeout_s: float = 10.0
                      ) -> tuple[int, bytes]:
        text = str(body.get("prompt", body.get("content", "")))
        word = text.strip()
        self.seen[word] = self.seen.get(word, 0) + 1
        if word in self.flaky and self.seen[word] <= self.drop:
            return 503, b"busy"
        return 200, orjson.dumps({"count": len(text.split()) + 1, "tokens": list(range(len(text.split()) + 1))})


def _words(client: Tokenizer) -> list[str]:
    b = PromptFactory(64, seed=7)
    asyncio.run(b.calibrate(client, "m", "vllm"))  # type: ignore[arg-type]
    return b.words


def test_dropped_tokenize_calls_are_asked_again_and_the_words_do_not_change() -> None:
    steady = _words(Tokenizer())
    flaky = _words(Tokenizer(flaky=set(steady[:40]), drop=CALIBRATE_TRIES - 1))
    assert len(steady) == 64 and flaky == steady


def test_a_word_whose_every_call_fails_is_left_out() -> None:
    steady = _words(Tokenizer())
    lost = _words(Tokenizer(flaky={steady[0]}, drop=CALIBRATE_TRIES))
    assert steady[0] not in lost and len(lost) == 64
