"""Tasks for the load probe: multi-turn conversations and agentic chains (issue 16, item 4; docs/workload.md).

With ``--turns T`` (T > 1) each closed-loop worker runs one task at a time instead of one request: T requests
in a chain, each sent when the previous one's answer has arrived plus ``--think-time`` (a user reading, or an
agent's tool call). Each turn's prompt is the conversation so far: the previous turn's prompt, a stand-in for
its answer (as many words as the tokens it served: the client keeps no output text unless ``--store-text``),
then ``--input-tokens`` new ones. So the context grows turn by turn, and the engine's prefix cache can reuse
each previous turn's prompt (not its answer, whose text the stand-in does not repeat). A failed turn is sent
again up to ``--retries`` times, as an agent retries a failed step; a turn still failing abandons the task.

Every request record of a task carries ``session`` (the task), ``turn`` (0-based), ``turns`` (planned) and
``attempt`` (0 = first); diagnose/normalize/tasks.py turns them into task-level latency and goodput.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from diagnose.probes.prompts import Prompt, PromptFactory
from diagnose.probes.sse import sleep_until


@dataclass(frozen=True)
class Turn:
    """One request of a task: which task, which turn, which attempt, and its prompt (the conversation so far)."""

    session: str
    turn: int
    turns: int
    attempt: int
    prompt: Prompt
    messages: tuple[dict[str, str], ...] = ()  # the chat API's messages (user, assistant, user, ...)
    max_tokens: int | None = None  # its output length where the turn sets one (a dataset's answer)
    fields: tuple[tuple[str, Any], ...] = ()  # more fields for its request record (a dataset's record number)

    def structure(self) -> dict[str, Any]:
        """Its request record's fields: the task's (none for a single request of a dataset: session "") and
        ``fields``."""
        d = dict(self.fields)
        if self.session:
            d.update(session=self.session, turn=self.turn, turns=self.turns, attempt=self.attempt)
        return d


@dataclass
class Conversation:
    """The growing context of one task."""

    factory: PromptFactory
    session: str
    turns: int
    seed: int
    words: list[str] = field(default_factory=list)  # the prompt so far (user turns and answer stand-ins)
    messages: list[dict[str, str]] = field(default_factory=list)

    def prompt(self, new: Prompt, turn: int, attempt: int) -> Turn:
        """Turn ``turn``'s request: the conversation so far, then the new user text."""
        text = " ".join([*self.words, new.text.strip()])
        extra = round(len(self.words) * self.factory.per_word)
        msgs = (*self.messages, {"role": "user", "content": new.text.strip()})
        return Turn(self.session, turn, self.turns, attempt,
                    Prompt(text=" " + text, tokens=new.tokens + extra, source=new.source), msgs)

    def answered(self, asked: Turn, output_tokens: int) -> None:
        """The turn was answered with ``output_tokens`` tokens: its prompt and a stand-in of the answer's
        length become the context of the next turn."""
        self.words = asked.prompt.text.split()
        rng = random.Random(f"answer-{self.seed}-{self.session}-{asked.turn}")
        n = max(1, round(output_tokens / max(self.factory.per_word, 1e-9)))
        answer = rng.choices(self.factory.words, k=n)
        self.words += answer
        self.messages = [*asked.messages, {"role": "assistant", "content": " ".join(answer)}]


@dataclass(frozen=True)
class TaskPlan:
    turns: int
    think_time_s: float
    retries: int


Send = Callable[[bool, int | None, Turn], Awaitable[Any]]  # (warm-up, intended send time, the turn) -> result


async def run_task(plan: TaskPlan, conv: Conversation, warm: bool, intended_ns: int | None, send: Send,
                   new_prompt: Callable[[], Prompt], stopping: Callable[[], bool],
                   now_ns: Callable[[], int]) -> int | None:
    """One task: its turns in order, each retried up to ``plan.retries`` times. Returns when the next task's
    first request is due (the last answer's end: a closed loop), None when the capture stops meanwhile."""
    due = intended_ns
    end: int | None = None
    for turn in range(plan.turns):
        if turn and stopping():  # the phase ended (or the capture stops): the task is cut, not finished late
            return None
        new = new_prompt()
        for attempt in range(plan.retries + 1):
            asked = conv.prompt(new, turn, attempt)
            res = await send(warm, due, asked)
            end = res.end_ns or now_ns()
            due = end
            if res.error is None:
                break
            if stopping():
                return None
        else:
            return end  # every attempt failed: the task is abandoned, the next one starts
        usage = res.usage or {}
        served = usage.get("completion_tokens")
        conv.answered(asked, served if isinstance(served, int) and served > 0 else max(1, sum(res.tok)))
        if turn + 1 < plan.turns and plan.think_time_s > 0:
            due = end + int(plan.think_time_s * 1e9)
            if await sleep_until(due, stopping, now_ns):
                return None
    return end
