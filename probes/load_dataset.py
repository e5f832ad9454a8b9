"""A dataset's requests for the load probe (``attach --dataset``; diagnose/capture/datasets.py reads the file).

Before the first phase every turn the run may send is measured by the server's tokenizer where it offers one
(``/tokenize``: vLLM takes the completions prompt or the chat messages; llama-server takes ``content``, with
no chat template, so its chat prompts are estimated): the prompt as it will be sent, and the file's answer that
sets the turn's output length. Without a usable ``/tokenize`` both are estimated (4 characters a token), and
the request records (``prompt_tokens_source`` "estimate") and the load probe's status (``dataset_lengths``)
say so. The measurements run ``TOKENIZE_AT_ONCE`` at a time, before any phase.

Each conversation is a session: its turns in order, each sent when the previous answer has arrived (its
context: the file's earlier turns and answers, not the server's answers, whose text the client does not keep).
"""

from __future__ import annotations

import asyncio

from diagnose.capture.datasets import Conversation, Dataset
from diagnose.probes.http_client import HttpClient
from diagnose.probes.prompts import count_tokens, tokenize_body

TOKENIZE_AT_ONCE = 16


class DatasetLengths:
    """Each turn's planned prompt length and the file's answer length, measured once before the run."""

    def __init__(self, ds: Dataset, chat: bool) -> None:
        self.ds = ds
        self.chat = chat
        self.prompt: dict[tuple[int, int], int] = {}
        self.answer: dict[tuple[int, int], int] = {}
        self.exact: set[tuple[int, int]] = set()  # turns whose prompt /tokenize measured
        self.source = "estimate"
        self.note = ""

    def _estimate(self, conv: Conversation, j: int) -> None:
        text = conv.prompt(j)
        self.prompt[(conv.index, j)] = self.ds.estimate(text)
        ans = conv.turns[j][1]
        if ans:
            self.answer[(conv.index, j)] = self.ds.estimate(ans)

    async def measure(self, client: HttpClient, engine: str | None, model: str | None) -> str:
        """Measures every turn (or estimates them all); returns the note for the probe's status."""
        convs = self.ds.conversations
        turns = [(c, j) for c in convs for j in range(len(c.turns))]
        c0 = turns[0][0]
        probe = tokenize_body(engine, model, None if self.chat else c0.prompt(0), c0.messages(0) if self.chat else None)
        if await count_tokens(client, probe) is None:
            for c, j in turns:
                self._estimate(c, j)
            self.note = ("estimated (4 characters a token): the server has no usable /tokenize"
                         + (" for chat prompts" if self.chat and engine == "llamacpp" else ""))
            return self.note
        failed = 0
        sem = asyncio.Semaphore(TOKENIZE_AT_ONCE)

        async def one(c: Conversation, j: int) -> None:
            nonlocal failed
            async with sem:
                body = tokenize_body(engine, model, None if self.chat else c.prompt(j),
                                     c.messages(j) if self.chat else None)
                n = await count_tokens(client, body)
                ans = c.turns[j][1]
                a = await count_tokens(client, tokenize_body(engine, model, ans, None, special=False)) if ans else None
            if n is None:
                failed += 1
                self._estimate(c, j)
                return
            self.prompt[(c.index, j)] = n
            self.exact.add((c.index, j))
            if ans:
                self.answer[(c.index, j)] = a if a is not None and a > 0 else self.ds.estimate(ans)

        await asyncio.gather(*(one(c, j) for c, j in turns))
        self.source = "tokenize" if not failed else "estimate"
        self.note = (f"measured by /tokenize: {len(turns)} prompts" if not failed else
                     f"measured by /tokenize except {failed} of {len(turns)} prompts (estimated: 4 characters a token)")
        return self.note
