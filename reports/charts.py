"""Small inline-SVG chart builders for the self-contained HTML report.

Every builder takes plain data (numbers and strings) and returns one ``<svg>`` element as a string. Every
piece of text that reaches the SVG (titles, labels, series names, frame names) goes through :func:`esc`,
so a captured string can never become markup. The SVGs carry a visible title, axis labels with units, and
a ``<title>`` for screen readers; no external references (no xmlns URL, no href, no url()).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from .formatting import plain
from .view_types import Band, BarSeries, FlameNode, Marker, Series, WaterfallRow

PALETTE = ("#2f6fb0", "#d9822b", "#3a9a5b", "#b33a3a", "#7b5ea7", "#8c6d46", "#c75d9b", "#5f7f8f")
Point = tuple[float, float]


def esc(text: object) -> str:
    """Escape any value for use as SVG/HTML text or attribute content."""
    return html.escape(str(text), quote=True)


def fmt_num(v: float) -> str:
    """Compact human formatting for axis ticks and labels: 0.0012, 1.5, 12, 1.2k, 3.4M."""
    if not math.isfinite(v):
        return "n/a"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    if a >= 100 or v == int(v):
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.3g}"
    return plain(v, 2)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks: list[float] = []
    v = start
    while v <= hi + step * 1e-9 and len(ticks) < 50:
        ticks.append(round(v, 12))
        v += step
    if ticks[-1] < hi:
        ticks.append(round(v, 12))
    return ticks


def downsample(points: Sequence[Sequence[float]], max_points: int) -> list[Point]:
    """Keep at most ``max_points`` points, sorted by x, keeping each bucket's min and max y (spikes survive)."""
    pts = sorted(
        ((float(p[0]), float(p[1])) for p in points
         if len(p) >= 2 and math.isfinite(float(p[0])) and math.isfinite(float(p[1]))),
        key=lambda p: p[0],
    )
    if len(pts) <= max_points:
        return pts
    buckets = max(1, max_points // 2)
    size = len(pts) / buckets
    out: list[Point] = []
    for b in range(buckets):
        chunk = pts[int(b * size): int((b + 1) * size)]
        if not chunk:
            continue
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        out.extend(sorted({lo, hi}, key=lambda p: p[0]))
    return out


def _in_order(points: Sequence[Sequence[float]]) -> list[Point]:
    """The finite points as given (a curve whose x may turn back, such as throughput against latency)."""
    return [(float(p[0]), float(p[1])) for p in points
            if len(p) >= 2 and math.isfinite(float(p[0])) and math.isfinite(float(p[1]))]


class _Frame:
    """Plot area geometry and value -> pixel mapping for one chart."""

    def __init__(self, width: int, height: int, left: int, right: int, top: int, bottom: int) -> None:
        self.width, self.height = width, height
        self.x0, self.x1 = left, width - right
        self.y0, self.y1 = top, height - bottom  # y0 = top pixel, y1 = bottom pixel

    def sx(self, v: float, lo: float, hi: float, log: bool = False) -> float:
        if log:
            v, lo, hi = math.log10(max(v, 1e-12)), math.log10(max(lo, 1e-12)), math.log10(max(hi, 1e-12))
        span = (hi - lo) or 1.0
        return self.x0 + (v - lo) / span * (self.x1 - self.x0)

    def sy(self, v: float, lo: float, hi: float) -> float:
        span = (hi - lo) or 1.0
        return self.y1 - (v - lo) / span * (self.y1 - self.y0)


def _open(width: int, height: int, title: str, css_class: str) -> list[str]:
    return [
        f'<svg class="chart {css_class}" viewBox="0 0 {width} {height}" width="100%" '
        f'preserveAspectRatio="xMinYMin meet" role="img">',
        f"<title>{esc(title)}</title>",
        f'<text class="chart-title" x="{width / 2:.0f}" y="16" text-anchor="middle">{esc(title)}</text>',
    ]


def _legend_rows(names: Sequence[str], x0: float, max_x: float) -> list[tuple[float, int]]:
    """(x, row) of each legend entry, wrapping to a new row when the next entry would pass ``max_x``."""
    out: list[tuple[float, int]] = []
    x, row = x0, 0
    for name in names:
        w = 24 + 6.5 * min(len(name), 40)
        if x > x0 and x + w > max_x:
            x, row = x0, row + 1
        out.append((x, row))
        x += w
    return out


def _legend(names: Sequence[str], colors: Sequence[str], x: float, y: float, max_x: float = 1e9) -> list[str]:
    out: list[str] = []
    for name, color, (lx, row) in zip(names, colors, _legend_rows(names, x, max_x), strict=False):
        ly = y + 14 * row
        out.append(f'<rect x="{lx:.0f}" y="{ly - 8:.0f}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text class="legend" x="{lx + 14:.0f}" y="{ly + 1:.0f}">{esc(name[:60])}</text>')
    return out


def _x_axis(f: _Frame, lo: float, hi: float, label: str, log: bool = False) -> list[str]:
    out = [f'<line class="axis" x1="{f.x0}" y1="{f.y1}" x2="{f.x1}" y2="{f.y1}"/>']
    if log:
        ticks = [10.0 ** e for e in range(math.floor(math.log10(max(lo, 1e-12))),
                                          math.ceil(math.log10(max(hi, 1e-12))) + 1)]
        ticks = [t for t in ticks if lo <= t <= hi] or [lo, hi]
    else:
        ticks = [t for t in nice_ticks(lo, hi) if lo - 1e-9 <= t <= hi + 1e-9]
    for t in ticks:
        x = f.sx(t, lo, hi, log)
        out.append(f'<line class="tick" x1="{x:.1f}" y1="{f.y1}" x2="{x:.1f}" y2="{f.y1 + 4}"/>')
        out.append(f'<text class="tick-label" x="{x:.1f}" y="{f.y1 + 15}" text-anchor="middle">{fmt_num(t)}</text>')
    out.append(f'<text class="axis-label x-label" x="{(f.x0 + f.x1) / 2:.0f}" y="{f.height - 6}" '
               f'text-anchor="middle">{esc(label)}</text>')
    return out


def _y_axis(f: _Frame, lo: float, hi: float, label: str, right: bool = False) -> list[str]:
    x = f.x1 if right else f.x0
    out = [f'<line class="axis" x1="{x}" y1="{f.y0}" x2="{x}" y2="{f.y1}"/>']
    for t in nice_ticks(lo, hi):
        if t > hi + 1e-9:
            continue
        y = f.sy(t, lo, hi)
        if not right:
            out.append(f'<line class="grid" x1="{f.x0}" y1="{y:.1f}" x2="{f.x1}" y2="{y:.1f}"/>')
        anchor, tx = ("start", x + 6) if right else ("end", x - 6)
        out.append(f'<text class="tick-label" x="{tx}" y="{y + 4:.1f}" text-anchor="{anchor}">{fmt_num(t)}</text>')
    lx = f.width - 8 if right else 12
    cy = (f.y0 + f.y1) / 2
    out.append(f'<text class="axis-label y-label" x="{lx}" y="{cy:.0f}" text-anchor="middle" '
               f'transform="rotate({90 if right else -90} {lx} {cy:.0f})">{esc(label)}</text>')
    return out


def _range(values: Sequence[float], zero: bool = True) -> tuple[float, float]:
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return 0.0, 1.0
    lo, hi = min(vals), max(vals)
    if zero:
        lo = min(lo, 0.0)
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    return lo, hi


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str, y2_label: str = "",
               bands: Sequence[Band] = (), width: int = 760, height: int = 280,
               max_points: int = 400) -> str:
    """Lines (or dots, ``style: "dots"``) on a left axis and an optional right axis.

    series: [{"name", "points": [[x, y], ...], "axis": "left"|"right", "style": "line"|"dots"|"step"|"marker",
    "ordered": True (optional: the points joined in the order given, each drawn, instead of sorted by x),
    "labels": [str, ...] (optional, with "ordered": one per point, written beside it)}];
    bands: shaded x ranges with a label (sweep phases): [{"start", "end", "label"}].
    """
    has_right = any(s.get("axis") == "right" for s in series)
    names = [str(s.get("name", "")) + (" (right axis)" if s.get("axis") == "right" else "") for s in series]
    extra = 14 * max((r for _, r in _legend_rows(names, 62, width - 20)), default=0)
    height += extra
    f = _Frame(width, height, 62, 62 if has_right else 20, 44 + extra, 42)
    prepared = [(s, _in_order(s.get("points") or []) if s.get("ordered") else downsample(s.get("points") or [],
                                                                                         max_points))
                for s in series]
    xs = [p[0] for _, pts in prepared for p in pts] + [float(b[k]) for b in bands for k in ("start", "end")]
    xlo, xhi = _range(xs, zero=False)
    left = [p[1] for s, pts in prepared if s.get("axis") != "right" for p in pts]
    right = [p[1] for s, pts in prepared if s.get("axis") == "right" for p in pts]
    ylo, yhi = _range(left)
    ylo2, yhi2 = _range(right)
    yhi, yhi2 = nice_ticks(ylo, yhi)[-1], nice_ticks(ylo2, yhi2)[-1]
    out = _open(width, height, title, "line-chart")
    for i, b in enumerate(bands):
        bx0, bx1 = f.sx(float(b["start"]), xlo, xhi), f.sx(float(b["end"]), xlo, xhi)
        out.append(f'<rect class="band band{i % 2}" x="{bx0:.1f}" y="{f.y0}" width="{max(bx1 - bx0, 0.5):.1f}" '
                   f'height="{f.y1 - f.y0}"><title>{esc(b.get("label", ""))}</title></rect>')
        label = str(b.get("label", ""))
        if bx1 - bx0 >= 6.5 * len(label) + 6:  # only when it fits; the hover title always has it
            out.append(f'<text class="band-label" x="{bx0 + 3:.1f}" y="{f.y0 + 11}">{esc(label)}</text>')
    out += _y_axis(f, ylo, yhi, y_label)
    if has_right:
        out += _y_axis(f, ylo2, yhi2, y2_label, right=True)
    out += _x_axis(f, xlo, xhi, x_label)
    colors: list[str] = []
    for i, (s, pts) in enumerate(prepared):
        color = PALETTE[i % len(PALETTE)]
        colors.append(color)
        lo, hi = (ylo2, yhi2) if s.get("axis") == "right" else (ylo, yhi)
        xy = [(f.sx(x, xlo, xhi), f.sy(y, lo, hi)) for x, y in pts]
        style = s.get("style", "line")
        if style == "marker":  # a few points to point out (a knee, an edge): large rings
            out.append(f'<g fill="none" stroke="{color}" stroke-width="2.2">' + "".join(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="6"><title>{esc(s.get("name", ""))}</title></circle>'
                for x, y in xy) + "</g>")
        elif style == "dots":
            out.append(f'<g fill="{color}" fill-opacity="0.55">' + "".join(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2"/>' for x, y in xy) + "</g>")
        elif xy:
            if style == "step":
                stepped: list[tuple[float, float]] = []
                for j, (x, y) in enumerate(xy):
                    if j:
                        stepped.append((x, xy[j - 1][1]))
                    stepped.append((x, y))
                xy = stepped
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
            dash = ' stroke-dasharray="5 3"' if s.get("axis") == "right" else ""
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6"{dash} points="{path}"/>')
            if s.get("ordered"):  # a curve through a few points (one per level): each point shown
                out.append(f'<g fill="{color}">' + "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.6"/>'
                                                           for x, y in xy) + "</g>")
                labels = s.get("labels") or []
                if labels and len(labels) == len(xy):  # each point named (a level), just above it
                    out.append(f'<g class="point-label" fill="{color}">' + "".join(
                        f'<text class="tick-label" x="{x + 4:.1f}" y="{y - 5:.1f}">{esc(lab)}</text>'
                        for (x, y), lab in zip(xy, labels, strict=True)) + "</g>")
    out += _legend(names, colors, f.x0, 34, width - 20)
    if not any(pts for _, pts in prepared):
        out.append(f'<text class="empty" x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle">no data</text>')
    out.append("</svg>")
    return "\n".join(out)


def histogram(bins: Sequence[Sequence[float]], *, title: str, x_label: str, y_label: str = "count",
              log_x: bool = False, markers: Sequence[Marker] = (), cdf: bool = True,
              width: int = 760, height: int = 260) -> str:
    """Bars from precomputed bins [[lo, hi, count], ...], with an optional CDF line (right axis, %)
    and vertical percentile markers [{"label": "P99", "x": 12.5}]."""
    f = _Frame(width, height, 62, 52 if cdf else 20, 40, 42)
    out = _open(width, height, title, "histogram")
    if not bins:
        out.append(f'<text class="empty" x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle">no data</text>')
        out.append("</svg>")
        return "\n".join(out)
    xlo, xhi = float(bins[0][0]), float(bins[-1][1])
    ymax = nice_ticks(0, max(float(b[2]) for b in bins) or 1.0)[-1]
    out += _y_axis(f, 0, ymax, y_label)
    if cdf:
        out += _y_axis(f, 0, 100, "cumulative share (%)", right=True)
    out += _x_axis(f, xlo, xhi, x_label, log=log_x)
    total = sum(float(b[2]) for b in bins) or 1.0
    cum = 0.0
    line: list[str] = []
    for lo, hi, n in bins:
        x0, x1 = f.sx(float(lo), xlo, xhi, log_x), f.sx(float(hi), xlo, xhi, log_x)
        y = f.sy(float(n), 0, ymax)
        if n:
            out.append(f'<rect class="bar" x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0 - 0.5, 0.5):.1f}" '
                       f'height="{f.y1 - y:.1f}"><title>{fmt_num(float(lo))}–{fmt_num(float(hi))}: '
                       f'{fmt_num(float(n))}</title></rect>')
        cum += float(n)
        line.append(f"{x1:.1f},{f.sy(cum / total * 100, 0, 100):.1f}")
    if cdf:
        out.append(f'<polyline class="cdf" fill="none" points="{" ".join(line)}"/>')
    for i, m in enumerate(markers):
        mx = float(m["x"])
        if not (xlo <= mx <= xhi):
            continue
        x = f.sx(mx, xlo, xhi, log_x)
        out.append(f'<line class="marker" x1="{x:.1f}" y1="{f.y0}" x2="{x:.1f}" y2="{f.y1}"/>')
        right_half = x > (f.x0 + f.x1) / 2
        out.append(f'<text class="marker-label" x="{x - 3 if right_half else x + 3:.1f}" '
                   f'y="{f.y0 + 10 + 11 * (i % 3)}" text-anchor="{"end" if right_half else "start"}">'
                   f'{esc(m.get("label", ""))} {fmt_num(mx)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def stacked_bars(categories: Sequence[str], series: Sequence[BarSeries], *, title: str, unit: str,
                 x_label: str, y_label: str, width: int = 760) -> str:
    """Horizontal stacked bars: one row per category, one segment per series (values in ``unit``)."""
    label_w = min(220, 20 + 7 * max((len(str(c)) for c in categories), default=4))
    names = [str(s.get("name", "")) for s in series]
    extra = 14 * max((r for _, r in _legend_rows(names, label_w, width - 30)), default=0)
    height = 104 + extra + 26 * max(len(categories), 1)
    f = _Frame(width, height, label_w, 30, 62 + extra, 42)
    out = _open(width, height, title, "stacked-bars")
    totals = [sum(float((s.get("values") or [])[i]) if i < len(s.get("values") or []) else 0.0 for s in series)
              for i in range(len(categories))]
    xhi = nice_ticks(0, max(totals, default=1.0) or 1.0)[-1]
    out += _x_axis(f, 0, xhi, f"{x_label} ({unit})" if unit and unit not in x_label else x_label)
    out.append(f'<text class="axis-label y-label" x="6" y="{f.y0 - 6}">{esc(y_label)}</text>')
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(series))]
    for i, cat in enumerate(categories):
        y = f.y0 + 6 + 26 * i
        out.append(f'<text class="tick-label" x="{f.x0 - 6}" y="{y + 13}" text-anchor="end">{esc(cat)}</text>')
        acc = 0.0
        for s, color in zip(series, colors, strict=False):
            vals = s.get("values") or []
            v = float(vals[i]) if i < len(vals) and math.isfinite(float(vals[i])) else 0.0
            if v <= 0:
                continue
            x0, x1 = f.sx(acc, 0, xhi), f.sx(acc + v, 0, xhi)
            out.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 0.5):.1f}" height="18" fill="{color}">'
                       f'<title>{esc(cat)} / {esc(s.get("name", ""))}: {fmt_num(v)} {esc(unit)}</title></rect>')
            acc += v
    out += _legend(names, colors, f.x0, 36, width - 30)
    out.append("</svg>")
    return "\n".join(out)


def waterfall(rows: Sequence[WaterfallRow], *, title: str, unit: str, y_label: str = "item",
              width: int = 760) -> str:
    """One row per item (a request), segments [{"name", "start", "end"}] placed on a shared time axis."""
    label_w = min(200, 20 + 7 * max((len(str(r.get("label", ""))) for r in rows), default=4))
    segs = [s for r in rows for s in (r.get("segments") or [])]
    names: list[str] = []
    for s in segs:
        if str(s.get("name", "")) not in names:
            names.append(str(s.get("name", "")))
    extra = 14 * max((r for _, r in _legend_rows(names, label_w, width - 30)), default=0)
    height = 104 + extra + 22 * max(len(rows), 1)
    f = _Frame(width, height, label_w, 30, 62 + extra, 42)
    out = _open(width, height, title, "waterfall")
    xlo, xhi = _range([float(s["start"]) for s in segs] + [float(s["end"]) for s in segs], zero=False)
    out += _x_axis(f, xlo, xhi, f"time ({unit})")
    out.append(f'<text class="axis-label y-label" x="6" y="{f.y0 - 6}">{esc(y_label)}</text>')
    color = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    for i, r in enumerate(rows):
        y = f.y0 + 4 + 22 * i
        out.append(f'<text class="tick-label" x="{f.x0 - 6}" y="{y + 12}" text-anchor="end">{esc(r.get("label", ""))}</text>')
        for s in r.get("segments") or []:
            x0, x1 = f.sx(float(s["start"]), xlo, xhi), f.sx(float(s["end"]), xlo, xhi)
            dur = float(s["end"]) - float(s["start"])
            out.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 0.8):.1f}" height="15" '
                       f'fill="{color[str(s.get("name", ""))]}"><title>{esc(s.get("name", ""))}: '
                       f'{fmt_num(dur)} {esc(unit)}</title></rect>')
    out += _legend(names, [color[n] for n in names], f.x0, 36, width - 30)
    out.append("</svg>")
    return "\n".join(out)


def flamegraph(root: FlameNode, *, title: str, unit: str, width: int = 1000, row_h: int = 17) -> str:
    """An icicle graph (root on top): box width is proportional to ``value``; hover shows name and share.

    Expects a tree already pruned to a reasonable size (see view_model.prune_tree)."""
    total = float(root.get("value") or 0.0)
    depth = _depth(root)
    height = 48 + row_h * depth + 10
    out = _open(width, height, title, "flamegraph")
    out.append(f'<text class="axis-label x-label" x="{width / 2:.0f}" y="32" text-anchor="middle">'
               f'box width = share of {esc(unit)} (root = {fmt_num(total)} {esc(unit)}); '
               f'depth = call stack, caller above callee; click a frame to zoom, the root to reset</text>')
    if total <= 0:
        out.append(f'<text class="empty" x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle">no samples</text>')
        out.append("</svg>")
        return "\n".join(out)
    scale = (width - 2) / total
    stack: list[tuple[FlameNode, float, int]] = [(root, 1.0, 0)]
    while stack:
        node, x, d = stack.pop()
        v = float(node.get("value") or 0.0)
        w = v * scale
        y = 42 + d * row_h
        name = str(node.get("name", ""))
        hue = (sum(map(ord, name[:12])) * 7) % 50
        out.append(f'<g class="fg"><title>{esc(name)}\n{fmt_num(v)} {esc(unit)} ({v / total:.1%})</title>'
                   f'<rect x="{x:.1f}" y="{y}" width="{max(w - 0.4, 0.3):.1f}" height="{row_h - 1}" '
                   f'fill="hsl({hue + 10},75%,{62 if d % 2 else 58}%)"/>')
        chars = int((w - 6) / 6.3)
        if chars >= 3:
            shown = name if len(name) <= chars else name[: max(chars - 1, 1)] + "…"
            out.append(f'<text class="frame" x="{x + 3:.1f}" y="{y + row_h - 5}">{esc(shown)}</text>')
        out.append("</g>")
        cx = x
        for child in node.get("children") or []:
            stack.append((child, cx, d + 1))
            cx += float(child.get("value") or 0.0) * scale
    out.append("</svg>")
    return "\n".join(out)


def _depth(node: FlameNode) -> int:
    best, stack = 0, [(node, 1)]
    while stack:
        n, d = stack.pop()
        best = max(best, d)
        stack.extend((c, d + 1) for c in n.get("children") or [])
    return best
