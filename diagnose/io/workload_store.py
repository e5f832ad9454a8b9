"""Compact storage for the requests of a workload file (docs/workload.md), and the bounds a replay keeps.

A workload file can hold millions of requests. Kept as one Python object each (a ``ReplayRequest`` with a
tuple of prefix-hash strings), a 1 GB Mooncake file took 2.1 GB of memory. Here each request is a few numbers
in flat arrays (offset, lengths, session, turn, its file line) and its prefix a run of integers (4 bytes each
while they fit, else 8): an integer hash itself (Mooncake's), or an index into one table of the distinct
string hashes (requests that share a prefix share its entries):
memory grows with the requests kept, not with the size of the file or of the fields it ignores.
``RequestStore`` is a read-only ``Sequence[ReplayRequest]`` sorted by offset, offsets relative to the
earliest request; each item is built when asked for.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from diagnose.capture.workload import ReplayRequest

# A replay lasts at most this long, --speed and --loop applied (one outlier offset such as 1e9 s, a Mooncake
# timestamp of 1e12 ms or an Azure date in another century would otherwise plan a replay of years, silently),
# and waits at most MAX_GAP_S between two arrivals.
MAX_REPLAY_SPAN_S = 7 * 86400.0
MAX_GAP_S = 3600.0


def human_s(s: float) -> str:
    """A duration as people read it: 90 s, 2.5 h, 3.0 days, 31.7 years."""
    if s < 120:
        return f"{s:.3g} s"
    if s < 2 * 3600:
        return f"{s / 60:.3g} min"
    if s < 2 * 86400:
        return f"{s / 3600:.3g} h"
    if s < 2 * 365.25 * 86400:
        return f"{s / 86400:.3g} days"
    return f"{s / (365.25 * 86400):.3g} years"


class RequestStore(Sequence[ReplayRequest]):
    """Requests appended in file order (:meth:`add`), then :meth:`freeze` sorts them by offset."""

    def __init__(self) -> None:
        self._off = array("d")
        self._inp = array("i")  # tokens: at most MAX_TOKENS (10 million)
        self._out = array("i")
        self._line = array("i")  # the request's line in its file
        # made on the first request that has one (an Azure trace has none): index into _sessions (-1: none),
        # turn (-1: none), and where each request's prefix starts: _pids[_pstart[i]:_pstart[i + 1]]
        self._sess: array[int] | None = None
        self._turn: array[int] | None = None
        self._pstart: array[int] | None = None
        self._pids = array("i")
        self._hash_id: dict[str, int] = {}
        self._hashes: list[str] = []
        self._sess_id: dict[str, int] = {}
        self._sessions: list[str] = []
        self._order: Any = None  # sorted position -> file position (numpy), after freeze
        self._t0 = 0.0

    def add(self, line: int, offset_s: float, input_tokens: int, output_tokens: int, session: str | None = None,
            turn: int | None = None, prefix: Iterable[Any] = ()) -> None:
        n = len(self._off)
        self._off.append(offset_s)
        self._inp.append(input_tokens)
        self._out.append(output_tokens)
        self._line.append(line)
        if session is not None:
            sid = self._sess_id.get(session)
            if sid is None:
                sid = self._sess_id[session] = len(self._sessions)
                self._sessions.append(session)
            if self._sess is None:
                self._sess = array("i", [-1]) * n
            self._sess.append(sid)
        elif self._sess is not None:
            self._sess.append(-1)
        if turn is not None and self._turn is None:
            self._turn = array("i", [-1]) * n
        if self._turn is not None:
            self._turn.append(-1 if turn is None else turn)
        if not prefix and self._pstart is None:
            return
        if self._pstart is None:
            self._pstart = array("q", [0]) * (n + 1)
        ids = self._hash_id
        for h in prefix:
            if type(h) is int and 0 <= h < 1 << 62:  # an integer hash (Mooncake's) is kept as it is
                v = h
            else:  # a string one is kept once, its entries an index into the table (negative)
                key = str(h)
                hid = ids.get(key)
                if hid is None:
                    hid = ids[key] = len(self._hashes)
                    self._hashes.append(key)
                v = -1 - hid
            try:
                self._pids.append(v)
            except OverflowError:  # 4 bytes an entry while every value fits (Mooncake's do), else 8
                self._pids = array("q", self._pids)
                self._pids.append(v)
        self._pstart.append(len(self._pids))

    def freeze(self) -> RequestStore:
        """Sorted by offset (stable: file order among equal offsets), offsets relative to the earliest."""
        off = np.frombuffer(self._off, dtype=np.float64) if len(self._off) else np.zeros(0)
        self._order = np.argsort(off, kind="stable")
        self._t0 = float(off[self._order[0]]) if len(off) else 0.0
        return self

    def __len__(self) -> int:
        return len(self._off)

    def _at(self, i: int) -> ReplayRequest:
        j = int(self._order[i])
        s = -1 if self._sess is None else self._sess[j]
        t = -1 if self._turn is None else self._turn[j]
        hs = self._hashes
        ps = self._pstart
        prefix = () if ps is None else tuple(str(k) if k >= 0 else hs[-1 - k] for k in self._pids[ps[j]:ps[j + 1]])
        return ReplayRequest(offset_s=self._off[j] - self._t0, input_tokens=self._inp[j], output_tokens=self._out[j],
                             session=None if s < 0 else self._sessions[s], turn=None if t < 0 else t, prefix=prefix)

    @overload
    def __getitem__(self, i: int) -> ReplayRequest: ...

    @overload
    def __getitem__(self, i: slice) -> list[ReplayRequest]: ...

    def __getitem__(self, i: int | slice) -> ReplayRequest | list[ReplayRequest]:
        if isinstance(i, slice):
            return [self._at(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("request index out of range")
        return self._at(i)

    def __iter__(self) -> Iterator[ReplayRequest]:
        for i in range(len(self)):
            yield self._at(i)

    def offsets(self) -> Any:
        """The sorted offsets (numpy, seconds from the earliest request)."""
        return np.frombuffer(self._off, dtype=np.float64)[self._order] - self._t0

    def line(self, i: int) -> int:
        """The file line of the request at sorted position ``i``."""
        return int(self._line[int(self._order[i])])

    def lengths(self) -> tuple[Sequence[int], Sequence[int]]:
        """Input and output lengths, file order (for medians)."""
        return self._inp, self._out


def check_span(path: str, reqs: RequestStore, speed: float, loop: int, what: str, *, span: bool = True) -> None:
    """Refuses (one line naming the file and the record's line) a replay that would last longer than
    ``MAX_REPLAY_SPAN_S`` or wait longer than ``MAX_GAP_S`` between two arrivals, --speed and --loop applied.
    ``what`` names the offset field as the file has it (offset_s, timestamp, TIMESTAMP). Without ``span``
    (the replay is bounded by --duration or --num-requests) only the gap is checked."""
    from diagnose.errors import InputError

    n = len(reqs)
    if n == 0:
        return
    off = reqs.offsets()
    last = float(off[-1])
    period = last + (last / (n - 1) if n > 1 else 1.0)
    total = ((loop - 1) * period + last) / speed
    how = f"--speed {speed:g}" + (f", --loop {loop}" if loop != 1 else "")
    if span and total > MAX_REPLAY_SPAN_S:
        # name the record farthest from the median arrival: the outlier, when one record is the cause
        med = float(off[(n - 1) // 2])
        i = 0 if med - float(off[0]) > last - med else n - 1
        raise InputError(f"{path}:{reqs.line(i)}: this record's {what} makes the replay last {human_s(total)} "
                         f"({how}); a replay lasts at most {human_s(MAX_REPLAY_SPAN_S)}: fix or drop the record, "
                         "or raise --speed")
    if n > 1:
        gaps = np.diff(off) / speed
        k = int(np.argmax(gaps))
        if float(gaps[k]) > MAX_GAP_S:
            # name the record on the side of the gap with fewer requests: the outlier, when one is the cause
            i, side = (k, "before the next request") if k + 1 <= n - k - 1 else (k + 1, "after the previous one")
            raise InputError(f"{path}:{reqs.line(i)}: this record's {what} is {human_s(float(gaps[k]))} {side} "
                             f"({how}); a replay waits at most {human_s(MAX_GAP_S)} between two requests: fix "
                             "or drop the record, or raise --speed")
