"""Datasets from local files for synthetic load (``attach --dataset FILE [--dataset-format sharegpt|prompts]``;
issue 36, docs/workload.md "Datasets").

* **ShareGPT-style conversations**, a JSON array or JSON lines of ``{"conversations": [{"from": "human",
  "value": "..."}, {"from": "gpt", "value": "..."}, ...]}`` (``role``/``content`` items are read too; roles
  human/user, gpt/assistant/chatgpt/bard/bing/model, system). Each conversation's user turns are its requests;
  the answer that follows a user turn in the file sets that request's output length and joins the context of the
  next turn.
* **Prompts**, JSON lines of ``{"prompt": "...", "output_tokens": N}`` (``output_tokens`` or ``max_tokens``
  optional: else ``--output-tokens``).

Read as a stream: JSON lines one line at a time (a line over 16 MiB is skipped without being held whole), a
JSON array one element at a time (ijson), and at most ``keep`` records are kept (the ones the run can send), so
memory grows with the records kept, not with the file. A record that does not fit is skipped and counted, and one
warning names how many and the first (``file:line: why``; in a JSON array ``file: record N: why``). A file with no
usable record is a one-line error (exit status 2) before anything connects.

Only the text the requests need is kept, in memory, for the run; it reaches the bundle only with ``--store-text``
(the request records' ``prompt_text``, as for any prompt). The manifest keeps the dataset's summary (no text).
"""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from diagnose.errors import InputError
from diagnose.io.lines import Skips, open_input, raw_lines

FORMATS = ("sharegpt", "prompts")
KEEP = 500  # records kept when --num-requests does not say how many the run needs (each turn is measured by
# /tokenize before the first phase, 16 at a time: a few seconds on vLLM; a longer run sends them again)
MAX_KEEP = 1_000_000
USER = frozenset({"human", "user"})
ASSISTANT = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing", "model"})
SYSTEM = frozenset({"system"})
CHARS_PER_TOKEN = 4.0  # the estimate where the server has no usable /tokenize (English text, BPE tokenizers)


@dataclass(frozen=True)
class Conversation:
    """One record of a dataset: its user turns, each with the answer the file gives (None: none given)."""

    index: int  # its number among the records kept (0-based)
    where: str  # file:line (or file: record N) for messages
    turns: tuple[tuple[str, str | None], ...]
    system: str | None = None
    output_tokens: int | None = None  # a prompts record's own output length

    def messages(self, turn: int) -> list[dict[str, str]]:
        """The chat API's messages for turn ``turn``: the system text, the earlier turns and their answers from
        the file, then this turn's user text."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        for user, answer in self.turns[:turn]:
            out.append({"role": "user", "content": user})
            out.append({"role": "assistant", "content": answer or ""})
        out.append({"role": "user", "content": self.turns[turn][0]})
        return out

    def prompt(self, turn: int) -> str:
        """The completions API's prompt for turn ``turn``: the same conversation as one text (blank lines between)."""
        return "\n\n".join(m["content"] for m in self.messages(turn))


@dataclass(frozen=True)
class Dataset:
    file: str
    format: str
    conversations: tuple[Conversation, ...]
    skipped: int = 0
    note: str = ""  # the warning about skipped records, "" when none
    truncated: bool = False  # the file had more records than were kept

    def summary(self) -> dict[str, Any]:
        """What the manifest keeps of it (no text)."""
        convs = self.conversations
        return {"file": self.file, "format": self.format, "conversations": len(convs),
                "requests": sum(len(c.turns) for c in convs),
                "multi_turn": sum(1 for c in convs if len(c.turns) > 1), "skipped": self.skipped,
                "truncated": self.truncated}

    def estimate(self, text: str) -> int:
        return max(1, round(len(text) / CHARS_PER_TOKEN))


def _first_byte(fh: IO[bytes]) -> bytes:
    while True:
        chunk = fh.read(1)
        if not chunk or not chunk.isspace():
            return chunk


def _lines(path: Path, skips: Skips) -> Iterator[tuple[str, Any]]:
    """(file:line, decoded value or an exception) of each non-blank line."""
    for n, line in raw_lines(path, skips):
        try:
            yield f"{path}:{n}", orjson.loads(line)
        except orjson.JSONDecodeError as e:
            yield f"{path}:{n}", ValueError(f"not JSON ({str(e).splitlines()[0]})")


def _array(fh: IO[bytes], path: Path) -> Iterator[tuple[str, Any]]:
    """(file: record N, element) of a JSON array, one element at a time; a syntax error ends the file (an
    exception in its place)."""
    import ijson

    n = 0
    try:
        for item in ijson.items(fh, "item", use_float=True):
            n += 1
            yield f"{path}: record {n}", item
    except (ijson.JSONError, ijson.IncompleteJSONError) as e:
        yield f"{path}: after record {n}", EOFError(f"not JSON ({str(e).splitlines()[0][:200]}); the rest of "
                                                    "the file is not read")


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) and v.strip() else None


def _sharegpt(obj: Any, index: int, where: str) -> Conversation | str:
    if not isinstance(obj, dict):
        return "not a JSON object"
    conv = obj.get("conversations", obj.get("conversation"))
    if not isinstance(conv, list):
        return "no conversations list"
    system: str | None = None
    turns: list[tuple[str, str | None]] = []
    for i, m in enumerate(conv):
        if not isinstance(m, dict):
            return f"conversations[{i}] is not an object"
        role = m.get("from", m.get("role"))
        text = m.get("value", m.get("content"))
        if not isinstance(role, str) or not isinstance(text, str):
            return f"conversations[{i}] needs from/value (or role/content) as text"
        role = role.lower()
        if role in SYSTEM:
            if system is None and not turns and text.strip():
                system = text
        elif role in USER:
            if not text.strip():
                continue
            if turns and turns[-1][1] is None:  # two user messages in a row: one turn
                turns[-1] = (turns[-1][0] + "\n\n" + text, None)
            else:
                turns.append((text, None))
        elif role in ASSISTANT:
            if turns and turns[-1][1] is None and text.strip():
                turns[-1] = (turns[-1][0], text)
        else:
            return f"conversations[{i}]: unknown role {role[:40]!r}"
    if not turns:
        return "no user turn with text"
    return Conversation(index, where, tuple(turns), system)


def _prompts(obj: Any, index: int, where: str) -> Conversation | str:
    if not isinstance(obj, dict):
        return "not a JSON object"
    text = _text(obj.get("prompt"))
    if text is None:
        return "no prompt (a non-empty text)"
    out = obj.get("output_tokens", obj.get("max_tokens"))
    if out is not None and (isinstance(out, bool) or not isinstance(out, int) or not 1 <= out <= 10_000_000):
        return "output_tokens must be a whole number from 1 to 10000000"
    return Conversation(index, where, ((text, None),), output_tokens=out)


def _detect(obj: Any) -> str | None:
    if isinstance(obj, dict):
        if "conversations" in obj or "conversation" in obj:
            return "sharegpt"
        if "prompt" in obj:
            return "prompts"
    return None


def read_dataset(path: Path, fmt: str | None = None, keep: int = KEEP) -> Dataset:
    """The first ``keep`` usable records of ``path`` (format ``fmt``, else detected from the first record)."""
    if fmt is not None and fmt not in FORMATS:
        raise InputError(f"--dataset-format {fmt}: use {' or '.join(FORMATS)}")
    if not path.exists():
        raise InputError(f"--dataset {path}: no such file")
    if not path.is_file():
        raise InputError(f"--dataset {path}: not a regular file")
    keep = max(1, min(int(keep), MAX_KEEP))
    skips = Skips(path)
    convs: list[Conversation] = []
    truncated = False
    try:
        with open_input(path) as fh:
            first = _first_byte(fh)
            if not first:
                raise InputError(f"--dataset {path}: empty file")
            fh.seek(0)
            records = _array(fh, path) if first == b"[" else _lines(path, skips)
            for where, obj in records:
                if len(convs) >= keep:
                    truncated = True
                    break
                if isinstance(obj, EOFError):
                    skips.add(where, str(obj))
                    break
                if isinstance(obj, Exception):
                    skips.add(where, str(obj))
                    continue
                if fmt is None:
                    fmt = _detect(obj)
                    if fmt is None:
                        skips.add(where, "neither a ShareGPT conversation (conversations) nor a prompt (prompt)")
                        continue
                got = (_sharegpt if fmt == "sharegpt" else _prompts)(obj, len(convs), where)
                if isinstance(got, str):
                    skips.add(where, got)
                else:
                    convs.append(got)
            with contextlib.suppress(AttributeError):
                records.close()  # type: ignore[attr-defined]
    except UnicodeDecodeError:
        raise InputError(f"--dataset {path}: not UTF-8 text") from None
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise InputError(f"--dataset {path}: {getattr(e, 'strerror', None) or e}") from None
    if not convs:
        raise InputError(f"--dataset {skips.first or f'{path}: no record in it'}" + (
            f" ({skips.n} record(s), none usable as {fmt or 'sharegpt or prompts'})" if skips.n > 1 else ""))
    note = (f"{path}: skipped {skips.n} unreadable record(s) (first: {skips.first})" if skips.n else "")
    return Dataset(file=str(path), format=fmt or "prompts", conversations=tuple(convs), skipped=skips.n, note=note,
                   truncated=truncated)
