"""What the failed requests' answers say: each failure named by a class, from its HTTP status, its error body
and its transport error (issue 34), and the signals the error rules read.

Classes (``classify``), checked in this order:
  connection_lost   the connection was refused, could not be made, or was closed (reset) before the answer ended:
                    the server (or a proxy) died or restarted
  client_timeout    the load client gave up waiting (``--request-timeout``)
  stream_broken     a 200 answer that was not a well-formed event stream
  context_overflow  the request does not fit the context: the body says so (vLLM, llama.cpp, SGLang, TGI forms,
                    whatever the status; :data:`_OVERFLOW`)
  rate_limited      HTTP 429
  auth              HTTP 401 / 403
  model_not_found   HTTP 404, or a 400 whose body says the model does not exist
  server_timeout    HTTP 408 / 504 (the server or a gateway gave up)
  server_error      any other 5xx
  invalid_request   any other 4xx

Signals (client source, over the window's finished requests; only when at least one failed, so a clean run
gains none): ``error_<class>_ratio`` (every class, 0 included: failed with that class / finished) and, for each
class present, ``error_<class>_requests`` (the count; its description is the last answer of that class,
redacted and shortened, which a rule quotes as ``{label.error_<class>_requests}``). A context overflow adds the
sizes its bodies state (``error_context_limit_tokens``, ``error_context_request_tokens``); a rate limit the
longest Retry-After (``error_retry_after_s``); connection losses when the server stopped answering
(``server_lost_at_s``, seconds since the load's first request) and when it answered again (``server_back_at_s``).
``error_main_share_ratio``: the share of the failures in the most common class, described in words (its label).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

import numpy as np
import pandas as pd

from diagnose.capture.redact import Redactor, excerpt
from diagnose.model import Signal
from diagnose.signals.catalog import SIGNALS

CLASSES: tuple[str, ...] = ("context_overflow", "rate_limited", "auth", "model_not_found", "invalid_request",
                            "server_timeout", "server_error", "connection_lost", "client_timeout", "stream_broken")
# what each class is, in the words the label of error_main_share_ratio uses
WORDS: dict[str, str] = {
    "context_overflow": "the request does not fit the server's context",
    "rate_limited": "rate limited (HTTP 429)",
    "auth": "authentication refused (HTTP 401/403)",
    "model_not_found": "model not found",
    "invalid_request": "the request was refused as invalid (HTTP 4xx)",
    "server_timeout": "the server or a gateway timed out (HTTP 408/504)",
    "server_error": "server error (HTTP 5xx)",
    "connection_lost": "the connection was reset or refused (the server stopped answering)",
    "client_timeout": "no answer within the client's request timeout",
    "stream_broken": "the answer was not a well-formed event stream",
}
QUOTE_CHARS = 200  # an error body as a finding quotes it
CONNECTION_ERRORS = frozenset({"reset", "refused", "connect"})

# Context-overflow bodies, as the engines write them (tests/test_errors_taxonomy.py pins each):
#   llama.cpp  request (1034 tokens) exceeds the available context size (256 tokens), try increasing it
#              {..., "type": "exceed_context_size_error", "n_prompt_tokens": 1034, "n_ctx": 256}  (per slot)
#              older builds: the request exceeds the available context size, try increasing it
#   vLLM       This model's maximum context length is 2048 tokens. However, you requested 2148 tokens (2048 in
#              the messages, 100 in the completion). ...
#              'max_tokens' or 'max_completion_tokens' is too large: 100. This model's maximum context length is
#              2048 tokens and your request has 2000 input tokens (100 > 2048 - 2000).
#              ... However, your prompt contains 3000 input tokens, which exceeds this limit ...
#              The decoder prompt (length 3000) is longer than the maximum model length of 2048.
#   SGLang     The input (3000 tokens) is longer than the model's context length (2048 tokens).
#   TGI        Input validation error: `inputs` tokens + `max_new_tokens` must be <= 2048. Given: 2000 `inputs`
#              tokens and 100 `max_new_tokens`
_OVERFLOW = re.compile(
    r"exceeds? the available context size|exceed_context_size_error|maximum context length|"
    r"longer than the maximum model length|longer than the model'?s context length|context length exceeded|"
    r"context_length_exceeded|`inputs` tokens \+ `max_new_tokens` must be|input is larger than the max context size",
    re.I)
_INT = r"(\d[\d,]*)"


def _n(s: str) -> float:
    return float(s.replace(",", ""))


# (pattern, what it gives, whether the need counts the output asked for): limit = the context the request had to
# fit in, need = the tokens the body says it asked for (the prompt alone, or the prompt and max_tokens)
_SIZES: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], tuple[float, float]], bool], ...] = (
    (re.compile(rf"request \({_INT} tokens\) exceeds the available context size \({_INT} tokens\)", re.I),
     lambda m: (_n(m[2]), _n(m[1])), False),
    (re.compile(rf'"n_prompt_tokens"\s*:\s*{_INT}.*?"n_ctx"\s*:\s*{_INT}', re.I | re.S),
     lambda m: (_n(m[2]), _n(m[1])), False),
    (re.compile(rf"maximum context length is {_INT} tokens\. However, you requested {_INT} tokens", re.I),
     lambda m: (_n(m[1]), _n(m[2])), True),
    (re.compile(rf"is too large: {_INT}\. This model's maximum context length is {_INT} tokens and your request "
                rf"has {_INT} input tokens", re.I),
     lambda m: (_n(m[2]), _n(m[3]) + _n(m[1])), True),
    (re.compile(rf"maximum context length is {_INT} tokens\. However, your (?:prompt contains|request has) "
                rf"(?:at least )?{_INT} input tokens", re.I),
     lambda m: (_n(m[1]), _n(m[2])), False),
    (re.compile(rf"prompt \(length {_INT}\) is longer than the maximum model length of {_INT}", re.I),
     lambda m: (_n(m[2]), _n(m[1])), False),
    (re.compile(rf"input \({_INT} tokens\) is longer than the model'?s context length \({_INT} tokens\)", re.I),
     lambda m: (_n(m[2]), _n(m[1])), False),
    (re.compile(rf"must be <= {_INT}\. Given: {_INT} `inputs` tokens and {_INT} `max_new_tokens`", re.I),
     lambda m: (_n(m[1]), _n(m[2]) + _n(m[3])), True),
    (re.compile(rf"input \({_INT} tokens\) is larger than the max context size \({_INT} tokens\)", re.I),
     lambda m: (_n(m[2]), _n(m[1])), False),
)
_NO_MODEL = re.compile(r"model .{0,80}(?:does not exist|not found)|model_not_found", re.I)


def classify(error: object, status: object, detail: object) -> str | None:
    """The class of one finished request's failure (None for a success or a request the capture cut)."""
    err = str(error) if isinstance(error, str) and error else ""
    if not err or err == "incomplete":
        return None
    code = int(status) if isinstance(status, (int, float)) and not isinstance(status, bool) \
        and math.isfinite(status) else 0
    text = _text(detail)
    if err in CONNECTION_ERRORS:
        return "connection_lost"
    if err == "timeout":
        return "client_timeout"
    if err == "malformed_sse" and code in (0, 200):
        return "stream_broken"
    if code >= 400 and _OVERFLOW.search(text):
        return "context_overflow"
    if code == 429 or err == "http_429":
        return "rate_limited"
    if code in (401, 403):
        return "auth"
    if code == 404 or (400 <= code < 500 and _NO_MODEL.search(text)):
        return "model_not_found"
    if code in (408, 504):
        return "server_timeout"
    if code >= 500 or err == "http_5xx":
        return "server_error"
    if code >= 400 or err == "http_4xx":
        return "invalid_request"
    return "server_error" if err.startswith("http") else "stream_broken"


def _text(detail: object) -> str:
    """An error detail as text (a bundle may hold it as the server's JSON object)."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, dict):
        return json.dumps(detail, default=str)
    return ""


def context_sizes(detail: str, max_tokens: float = math.nan) -> tuple[float, float] | None:
    """(the context the request had to fit in, the tokens it needed) as a context-overflow body states them;
    where the body counts the prompt alone (llama.cpp, vLLM's prompt checks), the request's ``max_tokens`` is
    added when known, since the request asked for both."""
    for pat, get, with_output in _SIZES:
        m = pat.search(detail)
        if m:
            limit, need = get(m)
            if not with_output and math.isfinite(max_tokens) and max_tokens > 0:
                need += max_tokens
            return limit, need
    return None


def quote(detail: object) -> str:
    """An error body as a finding quotes it: credentials removed (again: a bundle may come from elsewhere),
    one line, at most QUOTE_CHARS characters."""
    text = _text(detail)
    return excerpt(Redactor().text(text), QUOTE_CHARS) if text else ""


def _sig(name: str, value: float, unit: str, description: str | None = None) -> Signal:
    return Signal(name=name, value=float(value), unit=unit, source="client",
                  description=SIGNALS.get(name, "") if description is None else description)


def signals(done: pd.DataFrame, all_requests: pd.DataFrame) -> list[Signal]:
    """The error signals of a window's finished requests ``done`` (``all_requests``: the whole table, for the
    load's start); none when none failed."""
    if done.empty or "error" not in done.columns:
        return []
    status = done["http_status"] if "http_status" in done.columns else pd.Series(None, index=done.index)
    detail = done["error_detail"] if "error_detail" in done.columns else pd.Series(None, index=done.index)
    cls = pd.Series([classify(e, s, d) for e, s, d in zip(done["error"], status, detail, strict=True)],
                    index=done.index, dtype=object)
    failed = cls.notna()
    if not failed.any():
        return []
    n = len(done)
    out = [_sig(f"error_{c}_ratio", float((cls == c).sum()) / n, "ratio") for c in CLASSES]
    for c in CLASSES:
        rows = done[cls == c]
        if len(rows):
            last = rows.sort_values("end_s").iloc[-1] if "end_s" in rows.columns else rows.iloc[-1]
            said = quote(last.get("error_detail")) or WORDS[c]
            out.append(_sig(f"error_{c}_requests", float(len(rows)), "requests", said))
    counts = cls[failed].value_counts()
    main = str(counts.index[0])
    over = cls == "context_overflow"
    asked = pd.to_numeric(done["max_tokens"], errors="coerce") if "max_tokens" in done.columns \
        else pd.Series(math.nan, index=done.index)
    sizes = [context_sizes(_text(d), float(a)) for d, a in zip(detail[over], asked[over], strict=True)]
    known = [s for s in sizes if s is not None]
    words = WORDS[main]
    if known:
        limit = float(np.median([s[0] for s in known]))
        need = float(np.median([s[1] for s in known]))
        out.append(_sig("error_context_limit_tokens", limit, "tokens"))
        out.append(_sig("error_context_request_tokens", need, "tokens"))
        if main == "context_overflow":
            words = f"{words} (a request needs {need:,.0f} tokens, the context holds {limit:,.0f})"
    share = float(counts.iloc[0]) / float(failed.sum())
    out.append(_sig("error_main_share_ratio", share, "ratio",
                    words if share >= 1.0 else f"{words}, {int(counts.iloc[0])} of {int(failed.sum())} failures"))
    if "retry_after_s" in done.columns:
        ra = pd.to_numeric(done.loc[cls == "rate_limited", "retry_after_s"], errors="coerce").to_numpy(dtype=float)
        ra = ra[np.isfinite(ra)]
        if ra.size:
            out.append(_sig("error_retry_after_s", float(ra.max()), "s"))
    out.extend(_server_lost(done, cls, all_requests))
    return out


def _server_lost(done: pd.DataFrame, cls: pd.Series, all_requests: pd.DataFrame) -> list[Signal]:
    """When the server stopped answering (the first lost connection's end) and when it answered again (the first
    success sent after that), in seconds since the load's first request."""
    lost = done[cls == "connection_lost"]
    if lost.empty or "end_s" not in done.columns:
        return []
    t0 = float(np.nanmin(all_requests["sent_s"].to_numpy(dtype=float)))
    at = float(np.nanmin(lost["end_s"].to_numpy(dtype=float)))
    if not (math.isfinite(t0) and math.isfinite(at)):
        return []
    out = [_sig("server_lost_at_s", at - t0, "s")]
    ok = done[done["ok"].astype(bool) & (done["sent_s"].to_numpy(dtype=float) >= at)]
    if len(ok):
        out.append(_sig("server_back_at_s", float(ok["sent_s"].min()) - t0, "s"))
    return out
