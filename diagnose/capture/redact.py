"""Redaction of secrets and prompt text from everything a capture writes (bundle, JSON, log lines).

Servers and gateways often echo the request back in an error: the ``Authorization`` header, an API key in
the URL, the prompt. None of that may reach disk (issue 12, defects 1 and 2). One :class:`Redactor` per
capture knows the secrets the user gave (the API key, any header value, the URL's userinfo and secret-looking
query values) and replaces them, together with anything that looks like a credential whatever it came from:

* ``Bearer <token>`` / ``Basic <token>`` (an echoed ``Authorization`` header);
* ``sk-...``-style keys (OpenAI, Anthropic and most gateways' format);
* ``key=value`` / ``"key": "value"`` where the key names a secret (api_key, token, password, ...);
* ``scheme://user:password@host`` (basic auth in a URL).

:func:`scrub_text` removes the request's own prompt (which the client generated, so knows exactly) from a
server's echo unless the user asked for ``--store-text``; :func:`excerpt` bounds what is kept of an error body.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from difflib import SequenceMatcher
from typing import Any
from urllib.parse import quote

REDACTED = "[redacted]"
PROMPT_REDACTED = "[prompt text]"
EXCERPT_CHARS = 300  # an error body is kept to this many characters, after redaction
MIN_PROMPT_WORDS = 3  # words of the prompt in a row that count as an echo of it

_SECRET_NAMES = r"(?:api[_-]?key|apikey|access[_-]?token|auth[_-]?token|token|secret|password|passwd|pwd|" \
                r"authorization|x-api-key|api-token|session|signature|sig|key)"
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # an echoed Authorization header, any scheme that carries a credential
    (re.compile(r"\b(Bearer|Basic|Token|Digest)\s+[A-Za-z0-9._~+/=:\-]{4,}", re.I), rf"\1 {REDACTED}"),
    # provider-style keys: sk-..., sk-proj-..., sk-ant-..., pk-..., rk-...
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{6,}"), REDACTED),
    # basic auth in a URL
    (re.compile(r"([a-z][a-z0-9+.\-]*://)[^/\s:@]*:[^/\s@]*@", re.I), rf"\1{REDACTED}@"),
    # key=value in a query string or a log line
    (re.compile(rf"(?<![A-Za-z0-9_])({_SECRET_NAMES})=([^\s&\"',;]+)", re.I), rf"\1={REDACTED}"),
    # "key": "value" in JSON (an echoed header map or request)
    (re.compile(rf"([\"']{_SECRET_NAMES}[\"']\s*:\s*[\"'])([^\"']*)([\"'])", re.I), rf"\1{REDACTED}\3"),
)
_SECRET_QUERY = re.compile(rf"^{_SECRET_NAMES}$|secret|token|passw|api[_-]?key|auth", re.I)


class Redactor:
    """Replaces known secrets (exact strings) and credential-shaped text in strings and JSON-like values."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        # longest first, so that a secret containing another is replaced whole
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def add(self, *secrets: str | None) -> None:
        self.secrets = sorted({*self.secrets, *(s for s in secrets if s and len(s) >= 4)}, key=len, reverse=True)

    def text(self, s: str) -> str:
        for sec in self.secrets:
            if sec in s:
                s = s.replace(sec, REDACTED)
        for pat, repl in _PATTERNS:
            s = pat.sub(repl, s)
        return s

    def value(self, v: Any) -> Any:
        """``v`` with every string in it (keys of mappings included) redacted; other values as they are."""
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {(self.text(k) if isinstance(k, str) else k): self.value(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [self.value(x) for x in v]
        return v


def safe_url(url: str) -> str:
    """``url`` as it may be stored or shown: no userinfo, and the value of every secret-looking query
    parameter replaced (``?api_key=sk-1`` -> ``?api_key=[redacted]``)."""
    from yarl import URL  # here: the parse worker imports this module (via engines), not yarl

    try:
        u = URL(url)
    except (ValueError, TypeError):
        return Redactor().text(url)
    if u.user is not None or u.password is not None:
        u = u.with_user(None)
    if not u.query:
        return str(u)
    query = "&".join(f"{quote(k)}={REDACTED if _SECRET_QUERY.search(k) else quote(v)}" for k, v in u.query.items())
    return f"{u.with_query(None)}?{query}"


def join_url(base_url: str, path: str) -> str:
    """``path`` under ``base_url``'s path, with ``base_url``'s query kept as it is
    (``http://h/p?k=v`` + ``/v1/models`` -> ``http://h/p/v1/models?k=v``, not ``http://h/p?k=v/v1/models``)."""
    from yarl import URL  # here: the parse worker imports this module (via engines), not yarl

    u = URL(base_url)
    joined = str(u.with_path(u.path.rstrip("/") + path).with_query(None))
    return f"{joined}?{u.raw_query_string}" if u.raw_query_string else joined


def url_secrets(url: str) -> list[str]:
    """The secrets a URL carries: its userinfo (user and password) and its secret-looking query values."""
    from yarl import URL  # here: the parse worker imports this module (via engines), not yarl

    try:
        u = URL(url)
    except (ValueError, TypeError):
        return []
    out = [x for x in (u.password, u.user if u.password else None) if x]
    out += [v for k, v in u.query.items() if _SECRET_QUERY.search(k) and v]
    return out


_WORD = re.compile(r"[^\W_]+")


def scrub_text(s: str, texts: Iterable[str], min_words: int = MIN_PROMPT_WORDS) -> str:
    """``s`` with every run of at least ``min_words`` consecutive words of one of ``texts`` (the request's
    prompt, echoed back by the server, whole or cut) replaced by ``[prompt text]``. Words are compared, not
    characters: an echo survives JSON escaping, changed spacing and truncation, and a 2 KiB body against a
    long prompt takes well under a millisecond."""
    for t in texts:
        if not t or not s:
            continue
        b = [w.lower() for w in _WORD.findall(t)]
        if len(b) < min_words:
            continue
        for _ in range(32):  # each pass removes one echo; a body holds a handful at most
            spans = [(m.start(), m.end()) for m in _WORD.finditer(s)]
            a = [s[i:j].lower() for i, j in spans]
            m = SequenceMatcher(None, a, b, autojunk=False).find_longest_match(0, len(a), 0, len(b))
            if m.size < min_words:
                break
            first, last = m.a, m.a + m.size - 1
            # a word cut by truncation at either end of the echo goes with it
            if first > 0 and m.b > 0 and b[m.b - 1].endswith(a[first - 1]):
                first -= 1
            if last + 1 < len(a) and m.b + m.size < len(b) and b[m.b + m.size].startswith(a[last + 1]):
                last += 1
            s = s[:spans[first][0]] + PROMPT_REDACTED + s[spans[last][1]:]
    return s


def excerpt(s: str, limit: int = EXCERPT_CHARS) -> str:
    """One line of at most ``limit`` characters (an error body as it is kept)."""
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 1] + "…"
