"""Request length distributions for synthetic load (``attach --input-tokens`` / ``--output-tokens``; issue 36).

A length option is a plain integer (every request that long, as before) or a distribution:

* ``fixed:N``
* ``uniform:min=A,max=B`` (every whole length from A to B equally likely)
* ``normal:mean=M,stdev=S[,min=A][,max=B]``
* ``lognormal:mean=M,stdev=S[,min=A][,max=B]`` (M and S are the mean and standard deviation of the lengths
  themselves, not of their logarithm)
* ``histogram:FILE``: a CSV file of ``LENGTH,WEIGHT`` or ``LOW-HIGH,WEIGHT`` rows (a range is drawn uniformly
  within); ``#`` comments, blank lines and one header row are allowed.

``min`` and ``max`` bound the draws (default 1 and 10 million): a draw outside is drawn again, so a bounded
normal or lognormal is the distribution truncated to its bounds (its mean and spread then differ from M and S
by what the bounds cut off; bounds that keep under 1% of it are refused). Draws are whole numbers.

The draws come from a seeded generator (``--seed``): draw ``i`` of a stream is the same for the same seed,
whatever order the requests are set up in (blocks of ``BLOCK`` draws, each from its own seeded generator), so
two captures with one seed send the same lengths. A bad specification is an :class:`InputError` naming the
option and the problem (exit status 2).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagnose.errors import InputError

if TYPE_CHECKING:
    import numpy as np

KINDS = ("fixed", "uniform", "normal", "lognormal", "histogram")
MAX_LENGTH = 10_000_000  # tokens: no model takes more; a larger value is a typo
MIN_MASS = 0.01  # bounds must keep at least this share of a normal or lognormal distribution
MAX_BINS = 100_000  # rows of a histogram file
BLOCK = 4096  # draws made at once, from one generator seeded by (seed, stream, block number)
_KEYS = {"fixed": set(), "uniform": {"min", "max"}, "normal": {"mean", "stdev", "min", "max"},
         "lognormal": {"mean", "stdev", "min", "max"}}
_STREAMS = {"input": 1, "output": 2}


@dataclass(frozen=True)
class LengthDist:
    """One length distribution, as parsed (``text`` is what the user gave)."""

    kind: str
    text: str
    value: int = 0  # fixed
    mean: float | None = None
    stdev: float | None = None
    low: int = 1
    high: int = MAX_LENGTH
    bins: tuple[tuple[int, int, float], ...] = ()  # histogram: (low, high, weight), lengths low..high inclusive
    file: str | None = None

    @property
    def fixed(self) -> bool:
        return self.kind == "fixed"

    def to_json(self) -> dict[str, str | float | list[list[float]] | None]:
        """What the manifest records (``workload.input_lengths`` / ``output_lengths``): the spec as given and its
        parameters; a histogram file's bins inline, so the bundle says what was drawn without the file."""
        d: dict[str, str | float | list[list[float]] | None] = {"kind": self.kind, "spec": self.text}
        if self.kind == "fixed":
            d["value"] = self.value
        elif self.kind == "histogram":
            d.update(file=self.file, bins=[list(b) for b in self.bins], min=self.low, max=self.high)
        else:
            if self.mean is not None:
                d.update(mean=self.mean, stdev=self.stdev)
            d.update(min=self.low, max=self.high)
        return d

    @classmethod
    def from_json(cls, d: Any) -> LengthDist | None:
        """The distribution a manifest recorded (:meth:`to_json`); None for a record that is not one."""
        if not isinstance(d, dict) or d.get("kind") not in KINDS:
            return None
        try:
            bins = tuple((int(b[0]), int(b[1]), float(b[2])) for b in d.get("bins") or ())
            mean, stdev = d.get("mean"), d.get("stdev")
            return cls(kind=str(d["kind"]), text=str(d.get("spec") or ""), value=int(d.get("value") or 0),
                       mean=None if mean is None else float(mean), stdev=None if stdev is None else float(stdev),
                       low=int(d.get("min") or 1), high=int(d.get("max") or MAX_LENGTH), bins=bins,
                       file=None if d.get("file") is None else str(d["file"]))
        except (TypeError, ValueError, IndexError):
            return None

    def describe(self) -> str:
        """One phrase for the workload card: 'lognormal, mean 512, stdev 256, 16 to 2048'."""
        if self.kind == "fixed":
            return f"{self.value} (fixed)"
        if self.kind == "uniform":
            return f"uniform, {self.low} to {self.high}"
        if self.kind == "histogram":
            return f"histogram of {Path(self.file or '').name} ({len(self.bins)} bins, {self.low} to {self.high})"
        bounds = ""
        if self.low > 1 or self.high < MAX_LENGTH:
            bounds = f", {self.low} to {self.high}" if self.high < MAX_LENGTH else f", at least {self.low}"
        return f"{self.kind}, mean {self.mean:g}, stdev {self.stdev:g}{bounds}"

    # -- drawing -----------------------------------------------------------------------------------
    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths (int64), each within [low, high]."""
        import numpy as np

        if self.kind == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)
        if self.kind == "histogram":
            w = np.array([b[2] for b in self.bins], dtype=float)
            pick = rng.choice(len(self.bins), size=n, p=w / w.sum())
            lo = np.array([b[0] for b in self.bins], dtype=np.int64)[pick]
            hi = np.array([b[1] for b in self.bins], dtype=np.int64)[pick]
            return lo + np.floor(rng.random(n) * (hi - lo + 1)).astype(np.int64)
        out = np.empty(0, dtype=np.int64)
        batch = max(16, int(n / max(self._mass(), MIN_MASS) * 1.2) + 16)
        while out.size < n:  # truncated to the bounds: a draw outside them is drawn again
            x = np.rint(self._continuous(rng, batch))
            x = x[(x >= self.low) & (x <= self.high)]
            out = np.concatenate([out, x.astype(np.int64)])
        return out[:n]

    def _continuous(self, rng: np.random.Generator, n: int) -> np.ndarray:
        assert self.mean is not None and self.stdev is not None
        if self.kind == "normal":
            return rng.normal(self.mean, self.stdev, n)
        mu, sigma = _lognormal_params(self.mean, self.stdev)
        return rng.lognormal(mu, sigma, n)

    def _mass(self) -> float:
        """Share of the (rounded) distribution within [low, high]: 1 for a fixed, uniform or histogram one."""
        if self.kind not in ("normal", "lognormal"):
            return 1.0
        assert self.mean is not None and self.stdev is not None
        lo, hi = self.low - 0.5, self.high + 0.5
        if self.stdev == 0:
            return 1.0 if lo <= self.mean <= hi else 0.0
        if self.kind == "normal":
            m, s = self.mean, self.stdev
        else:
            m, s = _lognormal_params(self.mean, self.stdev)
            lo, hi = math.log(max(lo, 1e-12)), math.log(hi)
        return _phi((hi - m) / s) - _phi((lo - m) / s)


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _lognormal_params(mean: float, stdev: float) -> tuple[float, float]:
    """(mu, sigma) of the normal whose exponential has this mean and standard deviation."""
    sigma2 = math.log1p((stdev / mean) ** 2)
    return math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2)


# -- parsing ----------------------------------------------------------------------------------------
_NUM = re.compile(r"^[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?$")


def parse_lengths(text: Any, option: str) -> LengthDist:
    """The distribution ``text`` gives for ``option`` (e.g. ``--input-tokens``); InputError naming both when
    it cannot be used."""
    given = str(text).strip()

    def bad(why: str) -> InputError:
        return InputError(f"{option} {given}: {why}")

    if re.fullmatch(r"[0-9]+", given):
        return LengthDist("fixed", given, value=_length(int(given), "the length", bad))
    kind, sep, rest = given.partition(":")
    kind = kind.strip().lower()
    if not sep or kind not in KINDS:
        raise bad(f"use a length in tokens (e.g. 128) or one of {', '.join(k + ':' for k in KINDS)} "
                  "(e.g. lognormal:mean=512,stdev=256,min=16,max=2048)")
    if kind == "histogram":
        return _histogram(given, rest.strip(), bad)
    if kind == "fixed":
        if not re.fullmatch(r"\s*[0-9]+\s*", rest):
            raise bad("fixed: takes one whole length, e.g. fixed:128")
        return LengthDist("fixed", given, value=_length(int(rest), "the length", bad))
    params: dict[str, float] = {}
    for part in rest.split(","):
        if not part.strip():
            continue
        key, eq, val = (s.strip() for s in part.partition("="))
        key = key.lower()
        if not eq or key not in _KEYS[kind]:
            raise bad(f"{kind} takes {', '.join(sorted(_KEYS[kind]))} as key=value (got {part.strip()!r})")
        if key in params:
            raise bad(f"{key} is given twice")
        if not _NUM.match(val):
            raise bad(f"{key}={val} is not a non-negative number")
        params[key] = float(val)
    for key in ("min", "max"):
        if key in params and params[key] != int(params[key]):
            raise bad(f"{key}={params[key]:g} must be a whole number of tokens")
    low = _length(int(params.get("min", 1)), "min", bad)
    high = _length(int(params.get("max", MAX_LENGTH)), "max", bad)
    if low > high:
        raise bad(f"min={low} is more than max={high}")
    if kind == "uniform":
        if "min" not in params or "max" not in params:
            raise bad("uniform needs min and max, e.g. uniform:min=16,max=2048")
        return LengthDist("uniform", given, low=low, high=high)
    missing = [k for k in ("mean", "stdev") if k not in params]
    if missing:
        raise bad(f"{kind} needs mean and stdev (missing {', '.join(missing)}), "
                  f"e.g. {kind}:mean=512,stdev=256,min=16,max=2048")
    mean, stdev = params["mean"], params["stdev"]
    if not (math.isfinite(mean) and 0 < mean <= MAX_LENGTH):
        raise bad(f"mean={mean:g} must be more than 0 and at most {MAX_LENGTH}")
    if not (math.isfinite(stdev) and stdev <= MAX_LENGTH):
        raise bad(f"stdev={stdev:g} must be 0 to {MAX_LENGTH}")
    if kind == "lognormal" and stdev == 0:
        raise bad("a lognormal needs stdev > 0 (for one length use fixed:N)")
    dist = LengthDist(kind, given, mean=mean, stdev=stdev, low=low, high=high)
    mass = dist._mass()
    if mass < MIN_MASS:
        raise bad(f"min={low} and max={high} keep only {mass:.2%} of that distribution (at least "
                  f"{MIN_MASS:.0%} needed): widen them or move the mean")
    return dist


def _length(v: int, what: str, bad: Any) -> int:
    if not 1 <= v <= MAX_LENGTH:
        raise bad(f"{what} {v} must be 1 to {MAX_LENGTH} tokens")
    return v


def _histogram(given: str, path_text: str, bad: Any) -> LengthDist:
    """A histogram file: ``LENGTH,WEIGHT`` or ``LOW-HIGH,WEIGHT`` rows. Every bad row is the error (a histogram
    is small, and a row left out would change the distribution without a word)."""
    if not path_text:
        raise bad("histogram: needs a file, e.g. histogram:lengths.csv")
    path = Path(path_text)
    if not path.is_file():
        raise bad(f"{path_text} is not a readable file")
    bins: list[tuple[int, int, float]] = []
    rows = 0
    try:
        with path.open(newline="", encoding="utf-8") as f:
            for line_no, row in enumerate(csv.reader(f), start=1):
                if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                    continue
                if len(row) != 2:
                    raise bad(f"{path_text}:{line_no}: expected LENGTH,WEIGHT or LOW-HIGH,WEIGHT")
                first, weight_text = row[0].strip(), row[1].strip()
                rows += 1
                if rows == 1 and not _NUM.match(weight_text) and not re.match(r"^[0-9]", first):
                    continue  # a header row
                m = re.fullmatch(r"([0-9]+)(?:\s*-\s*([0-9]+))?", first)
                if not m:
                    raise bad(f"{path_text}:{line_no}: {first!r} is not a length or a LOW-HIGH range")
                lo = int(m.group(1))
                hi = int(m.group(2)) if m.group(2) else lo
                if not (1 <= lo <= hi <= MAX_LENGTH):
                    raise bad(f"{path_text}:{line_no}: {first} must be lengths from 1 to {MAX_LENGTH}, low first")
                if not _NUM.match(weight_text):
                    raise bad(f"{path_text}:{line_no}: weight {weight_text!r} is not a non-negative number")
                bins.append((lo, hi, float(weight_text)))
                if len(bins) > MAX_BINS:
                    raise bad(f"{path_text}: more than {MAX_BINS} rows")
    except UnicodeDecodeError:
        raise bad(f"{path_text}: not UTF-8 text") from None
    except OSError as e:
        raise bad(f"{path_text}: {e.strerror or e}") from None
    if not bins or sum(w for _, _, w in bins) <= 0:
        raise bad(f"{path_text}: no row with a positive weight")
    bins = [b for b in bins if b[2] > 0]
    return LengthDist("histogram", given, bins=tuple(bins), file=path_text,
                      low=min(b[0] for b in bins), high=max(b[1] for b in bins))


# -- the draws of one run ---------------------------------------------------------------------------
class LengthDraws:
    """Draw ``i`` of ``dist`` for ``seed``: the same for the same seed and stream, in any order of ``i``.
    Keeps two blocks of ``BLOCK`` draws (a request's length is one array read; a block is drawn in well under a
    millisecond)."""

    def __init__(self, dist: LengthDist, seed: int, stream: str) -> None:
        self.dist = dist
        self.seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
        self.stream = _STREAMS[stream]
        self._blocks: dict[int, np.ndarray] = {}

    def block(self, k: int) -> np.ndarray:
        got = self._blocks.get(k)
        if got is None:
            import numpy as np

            got = self.dist.draw(np.random.default_rng([self.seed, self.stream, k]), BLOCK)
            if len(self._blocks) >= 2:
                self._blocks.pop(next(iter(self._blocks)))
            self._blocks[k] = got
        return got

    def __call__(self, i: int) -> int:
        k, j = divmod(int(i), BLOCK)
        return int(self.block(k)[j])

    def nominal(self) -> int:
        """The median of the first block's draws: the length of the baseline phase's requests and of the
        prompt calibration (a fixed distribution: its value)."""
        import numpy as np

        if self.dist.fixed:
            return self.dist.value
        return max(1, int(np.median(self.block(0))))
