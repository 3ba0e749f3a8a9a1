"""Figures of an MKL run, drawn from the plain data of ``results.json``.

Every function takes lists / dicts / arrays exactly as ``mklscale run`` writes them (never solver
objects), an optional matplotlib ``ax`` to draw into, and returns the Axes it drew on (its figure is
``ax.figure``). Without ``ax`` a new :class:`matplotlib.figure.Figure` is made directly, without
pyplot, so no global figure state is kept and any backend (Agg included) can save it.

Numbers may be JSON numbers or the strings "inf", "-inf", "nan" that results.json uses for
non-finite floats (see :func:`mklscale.solvers.result.json_safe`); :func:`number` reads both.
Points that a log axis cannot show (zero, negative, non-finite) are left out rather than drawn.

matplotlib (a dependency of mklscale) is imported only when a figure is drawn, so importing this
module stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

_NON_FINITE = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan}
#: width of a figure in inches, and the height of one row of a horizontal bar chart
FIG_WIDTH = 7.5
ROW_HEIGHT = 0.26
#: at most this many labelled ticks on a log axis (:func:`_log_axis`)
LOG_TICKS = 5


# ---- plain-data helpers (no matplotlib needed) ---------------------------------------------------

def number(value: Any) -> float | None:
    """A float from a JSON number or "inf"/"-inf"/"nan"; None for anything else (missing, text, bool)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    if isinstance(value, str):
        return _NON_FINITE.get(value.strip().lower())
    return None


def positive_points(xs: Iterable[Any], ys: Iterable[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The (x, y) pairs a log-y axis can show: x and y finite, y > 0."""
    pairs = [(number(x), number(y)) for x, y in zip(xs, ys)]
    keep = [(x, y) for x, y in pairs
            if x is not None and y is not None and math.isfinite(x) and math.isfinite(y) and y > 0]
    if not keep:
        return np.zeros(0), np.zeros(0)
    x, y = zip(*keep)
    return np.array(x, dtype=float), np.array(y, dtype=float)


def series_by_head(label: str, history: Sequence[Mapping]) -> dict[str, list[Mapping]]:
    """Split a solver's history by ``head`` (one-vs-rest) into {"label" or "label [head]": entries}."""
    groups: dict[str, list[Mapping]] = {}
    for entry in history or ():
        if not isinstance(entry, Mapping):
            continue
        head = entry.get("head")
        key = label if head is None else f"{label} [{head}]"
        groups.setdefault(key, []).append(entry)
    return groups


def kernel_label(kernel: Mapping, feature_names: Sequence[str] | None = None, family: bool = False,
                 max_features: int = 28) -> str:
    """A short row label for a kept kernel: its parameters and feature subset, e.g. ``width=2 [3,5]``,
    or ``width=2 [mean radius]`` with ``feature_names`` (one per data column).

    The family is left out unless ``family`` (the weights figure groups rows by family); a kernel
    without parameters (linear, or unknown) falls back to its name. A feature list longer than
    ``max_features`` characters is cut.
    """
    from mklscale.bank.spec import features_text

    params = kernel.get("params") or {}
    if not isinstance(params, Mapping) or not params:
        if kernel.get("family") == "linear":
            params = {}
        else:
            return str(kernel.get("name", "?"))
    args = ", ".join(f"{k}={_short(v)}" for k, v in params.items() if k != "offset" or number(v) != 1.0)
    feats = features_text(_features(kernel), feature_names)
    if len(feats) > max_features:
        feats = feats[:max_features - 3] + "..."
    head = " ".join(t for t in (_family(kernel) if family else "", args) if t)
    return f"{head} [{feats}]"


def weight_shares(kernels: Sequence[Mapping]) -> list[float | None]:
    """Each kernel entry's share of its head's total weight, |d_m| / sum_k |d_k| (None when the
    weight is not a finite number). Shares are comparable across solvers whose weights live on
    different scales (SpicyMKL's are unnormalised, SMO-MKL's sum to one)."""
    totals: dict = {}
    weights = []
    for k in kernels:
        w = number(k.get("weight"))
        w = abs(w) if w is not None and math.isfinite(w) else None
        weights.append(w)
        totals[k.get("head")] = totals.get(k.get("head"), 0.0) + (w or 0.0)
    return [None if w is None else (w / totals[k.get("head")] if totals[k.get("head")] > 0 else 0.0)
            for k, w in zip(kernels, weights)]


def share_lines(kernels: Sequence[Mapping], top: int = 5, rest: bool = True) -> list[str]:
    """Console lines of kept kernels by their share of the total weight (:func:`weight_shares`, as the
    report shows them), largest first: ``41.2%  gaussian(width=2)[mean radius]``, with
    ``  (class c)`` for a one-vs-rest head. The ``top`` largest get a line each; with ``rest``, one
    more line counts the others (and, for one head, their share together)."""
    shares = weight_shares(kernels)
    order = sorted((i for i, share in enumerate(shares) if share is not None), key=lambda i: -shares[i])
    lines = []
    for i in order[:top]:
        head = kernels[i].get("head")
        lines.append(f"{_percent(shares[i])}  {kernels[i].get('name')}" + ("" if head is None else f"  (class {head})"))
    others = order[top:]
    if rest and others:
        together = sum(shares[i] for i in others)
        one_head = len({kernels[i].get("head") for i in order}) == 1
        lines.append(f"... {len(others)} more kernel(s)" + (f", {_percent(together).strip()} together" if one_head else ""))
    return lines


def _percent(share: float) -> str:
    """A share as a percentage: one decimal, right-aligned ('41.2%', '  0.8%'); under 0.1 % two
    significant digits ('0.032%')."""
    value = 100.0 * share
    return f"{value:5.1f}%" if value >= 0.1 or value == 0.0 else f"{value:.2g}%"


def is_uniform(kernels: Sequence[Mapping], rel_tol: float = 1e-9) -> bool:
    """Whether every kept kernel (at least two) carries the same weight: a uniform baseline."""
    ws = [number(k.get("weight")) for k in kernels]
    if len(ws) < 2 or any(w is None or not math.isfinite(w) for w in ws):
        return False
    return max(ws) - min(ws) <= rel_tol * max(abs(w) for w in ws)


def _features(kernel: Mapping) -> list | None:
    """The kernel's feature subset as a list, or None for all features."""
    features = kernel.get("features")
    if features is None or isinstance(features, list):
        return features
    return list(features) if isinstance(features, tuple) else [features]


def _numbers(values: Iterable[Any]) -> tuple[float, ...]:
    """Sortable numbers (non-numbers sort last)."""
    return tuple(x if (x := number(v)) is not None else math.inf for v in values)


def _short(value: Any) -> str:
    x = number(value)
    if x is None:
        return str(value)
    return f"{x:g}"


def _family(kernel: Mapping) -> str:
    return str(kernel.get("family") or "other")


def _sort_key(kernel: Mapping) -> tuple:
    """Order kernels by family, then by the numeric value of their parameters, then by features."""
    params = kernel.get("params")
    values = _numbers(v for _, v in sorted(params.items())) if isinstance(params, Mapping) else ()
    features = _features(kernel)
    return (_family(kernel), values, features is not None, _numbers(features or ()))


# ---- matplotlib plumbing ---------------------------------------------------------------------------

def _new_axes(figsize: tuple[float, float], ax=None):
    """``ax`` itself, or the Axes of a fresh pyplot-free Figure of size ``figsize`` (inches)."""
    if ax is not None:
        return ax
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    return fig.add_subplot()


def _colors(count: int) -> list:
    """``count`` distinct colours: tab10, then tab20, then a sampled colormap."""
    from matplotlib import colormaps

    if count <= 10:
        return [colormaps["tab10"](i) for i in range(count)]
    if count <= 20:
        return [colormaps["tab20"](i) for i in range(count)]
    return [colormaps["turbo"](x) for x in np.linspace(0.05, 0.95, count)]


def _styles(count: int) -> list[dict]:
    """``count`` distinguishable line styles: the 10 tab10 colours, then again dashed, dotted, dash-dotted."""
    colors = _colors(min(count, 10))
    dashes = ("-", "--", ":", "-.")
    return [{"color": colors[i % 10], "linestyle": dashes[(i // 10) % len(dashes)]} for i in range(count)]


def _log_axis(ax, which: str) -> None:
    """Make the ``which`` ("x" or "y") axis of ``ax`` logarithmic, with labels that do not overlap.

    Called once the axes hold their data (the choice reads the view limits). Only major ticks are
    labelled, and the first of these that puts 2 to ``LOG_TICKS`` ticks in view is used: powers of
    ten (10^k labels, thinned to every second or third decade on long axes), then 1-2-5 steps,
    then 1..9 steps (plain labels: 20, 50, 0.002), then evenly spaced plain labels for a range
    within a factor of two. Matplotlib's default labels the minor ticks of an axis spanning about
    one decade (2x10^1, 3x10^1, ...), which run into each other in the report's small panels.
    """
    from matplotlib.ticker import FuncFormatter, LogFormatterSciNotation, LogLocator, MaxNLocator, NullFormatter

    getattr(ax, f"set_{which}scale")("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = sorted(getattr(ax, f"get_{which}lim")())
    if not (0.0 < lo < hi < math.inf):
        return
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    choices = [(LogLocator(base=10.0, numticks=LOG_TICKS), LogFormatterSciNotation()),
               (LogLocator(base=10.0, subs=(1.0, 2.0, 5.0), numticks=LOG_TICKS), plain),
               (LogLocator(base=10.0, subs=tuple(range(1, 10)), numticks=LOG_TICKS), plain),
               (MaxNLocator(nbins=LOG_TICKS - 1), plain)]
    for locator, formatter in choices:
        shown = [t for t in locator.tick_values(lo, hi) if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]
        if 2 <= len(shown) <= LOG_TICKS:
            break
    axis.set_major_locator(locator)
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(NullFormatter())


def _empty(ax, message: str):
    """Say on the axes that there is nothing to draw (instead of an empty frame)."""
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])
    return ax


def _legend(ax, count: int, max_entries: int = 14, below: bool = False, **kwargs) -> None:
    """A legend outside the plot (right, or ``below`` it) when there are few enough entries to read."""
    if not 0 < count <= max_entries:
        return
    size = "small" if count <= 14 else "x-small"
    if below:  # a figure legend under everything: constrained layout makes room for it
        handles, labels = ax.get_legend_handles_labels()
        ax.figure.legend(handles, labels, loc="outside lower center", ncols=min(count, 6), fontsize=size,
                         frameon=False, **kwargs)
    else:
        ax.legend(fontsize=size, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0, **kwargs)


# ---- (1) kernel weights ---------------------------------------------------------------------------

def kernel_weights(kernels: Sequence[Mapping], ax=None, title: str | None = None, max_kernels: int = 50,
                   feature_names: Sequence[str] | None = None):
    """Horizontal bars of the kept kernels' shares of the total weight (%), grouped by family and
    sorted by parameter.

    ``kernels`` are results.json kernel entries (name, family, params, features, weight, head).
    One row per kernel, labelled with its parameters and feature subset (named by
    ``feature_names`` when given); rows of one family share a colour and are named by family right
    of the axes. Shares (:func:`weight_shares`) make solvers comparable. One-vs-rest entries
    (``head`` set) get one bar per head in each row, coloured by head, each head's shares summing
    to 100 %. Only the ``max_kernels`` largest shares are drawn (the title then says how many were
    left out).
    """
    rows, heads = _weight_rows(kernels, max_kernels)
    height = 1.3 + ROW_HEIGHT * max(len(rows), 2) * (1 if len(heads) <= 1 else 1 + 0.25 * len(heads))
    ax = _new_axes((FIG_WIDTH, min(height, 30.0)), ax)
    shown = len(rows)
    total = len({str(k.get("name")) for k in kernels})
    head_text = f" ({total} kept" + (f", {shown} largest shown)" if shown < total else ")")
    ax.set_title((title or "kernel weights") + head_text)
    if not rows:
        return _empty(ax, "no kernel kept")
    _draw_weight_bars(ax, rows, heads, feature_names)
    _label_families(ax, rows)
    ax.set_xlabel("share of the total weight (%)")
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.grid(True, axis="x", alpha=0.3)
    return ax


def _weight_rows(kernels: Sequence[Mapping], max_kernels: int) -> tuple[list[dict], list]:
    """One row per kernel name (shares in % per head), the ``max_kernels`` heaviest, in family order."""
    by_name: dict[str, dict] = {}
    heads: list = []
    kernels = list(kernels or ())
    for k, share in zip(kernels, weight_shares(kernels)):
        if share is None:
            continue
        weight = 100.0 * share
        head = k.get("head")
        if head not in heads:
            heads.append(head)
        row = by_name.setdefault(str(k.get("name")), {"kernel": k, "weights": {}})
        row["weights"][head] = weight
    heaviest = sorted(by_name.values(), key=lambda r: -max(abs(w) for w in r["weights"].values()))
    return sorted(heaviest[:max_kernels], key=lambda r: _sort_key(r["kernel"])), heads


def _draw_weight_bars(ax, rows: list[dict], heads: list, feature_names=None) -> None:
    """Bars for every row: one colour per family (single head) or per head (one-vs-rest)."""
    y = np.arange(len(rows))
    if len(heads) <= 1:
        families = sorted({_family(r["kernel"]) for r in rows})
        color = dict(zip(families, _colors(len(families))))
        widths = [next(iter(r["weights"].values())) for r in rows]
        ax.barh(y, widths, height=0.7, color=[color[_family(r["kernel"])] for r in rows])
        for yi, w in zip(y, widths):
            ax.annotate(f"{w:.0f}" if w >= 10 else f"{w:.2g}", (w, yi), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize="x-small")
    else:
        bar = 0.8 / len(heads)
        for i, (head, c) in enumerate(zip(heads, _colors(len(heads)))):
            widths = [r["weights"].get(head, 0.0) for r in rows]
            ax.barh(y - 0.4 + bar * (i + 0.5), widths, height=bar, color=c, label=f"class {head}")
        _legend(ax, len(heads), max_entries=20, below=True)
    ax.set_yticks(y, [kernel_label(r["kernel"], feature_names) for r in rows], fontsize="small")
    ax.margins(x=0.12)


def _label_families(ax, rows: list[dict]) -> None:
    """Separate the families by a line and name each one right of the axes, beside its block of rows."""
    blocks: list[tuple[str, int, int]] = []
    for i, r in enumerate(rows):
        family = _family(r["kernel"])
        if blocks and blocks[-1][0] == family:
            blocks[-1] = (family, blocks[-1][1], i)
        else:
            blocks.append((family, i, i))
    for family, first, last in blocks:
        if first > 0:
            ax.axhline(first - 0.5, color="0.5", linewidth=0.8)
        ax.annotate(family, xy=(1.0, (first + last) / 2), xycoords=("axes fraction", "data"),
                    xytext=(4, 0), textcoords="offset points", rotation=270 if last - first >= 5 else 0,
                    ha="left", va="center", fontsize="small", fontweight="bold", color="0.3")


def weight_heatmap(solvers: Mapping[str, Sequence[Mapping]], ax=None, max_kernels: int = 40,
                   feature_names: Sequence[str] | None = None):
    """A kernel x solver heatmap of the shares of the total weight (%), so solvers can be compared.

    ``solvers`` maps a solver label to its results.json kernel entries; a one-vs-rest solver's
    heads are added up (each kernel's share of the weight of all heads). Rows are the kernels kept
    by some solver, the ``max_kernels`` with the largest share anywhere, in family and parameter
    order; a blank cell means the solver dropped that kernel. Cells of 0.5 % or more are labelled.
    """
    columns = {label: _kernel_shares(ks) for label, ks in solvers.items()}
    entries: dict[str, Mapping] = {}
    for ks in solvers.values():
        for k in ks:
            entries.setdefault(str(k.get("name")), k)
    best = {name: max(col.get(name, 0.0) for col in columns.values()) for name in entries}
    names = sorted(best, key=lambda n: -best[n])[:max_kernels]
    names.sort(key=lambda n: _sort_key(entries[n]))
    labels = list(columns)
    height = 1.6 + 0.24 * max(len(names), 3)
    ax = _new_axes((FIG_WIDTH, min(height, 30.0)), ax)
    total = len(entries)
    ax.set_title(f"share of each solver's total kernel weight (%): {total} kernels kept"
                 + (f", the {len(names)} largest shown" if len(names) < total else ""), fontsize="medium")
    if not names or not labels:
        return _empty(ax, "no kernel kept")
    grid = np.array([[100.0 * columns[c][n] if n in columns[c] else np.nan for c in labels] for n in names])
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="Blues", vmin=0.0, vmax=max(np.nanmax(grid), 1e-12),
                      aspect="auto", interpolation="nearest")
    for (i, j), v in np.ndenumerate(grid):
        if np.isfinite(v) and v >= 0.5:
            ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize="x-small",
                    color="white" if v > 0.6 * np.nanmax(grid) else "black")
    short = [lab if len(lab) <= 24 else lab[:23] + "…" for lab in labels]
    ax.set_xticks(range(len(labels)), short, rotation=30 if len(labels) > 3 else 0, ha="right" if len(labels) > 3
                  else "center", fontsize="small")
    ax.set_yticks(range(len(names)), [kernel_label(entries[n], feature_names, family=True) for n in names],
                  fontsize="small")
    ax.set_xticks(np.arange(len(labels) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(names) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="0.9", linewidth=0.6)
    ax.tick_params(which="minor", length=0)
    ax.figure.colorbar(image, ax=ax, label="share (%)", shrink=min(1.0, 8.0 / max(len(names), 1)) if len(names) > 8
                       else 1.0)
    return ax


# ---- feature selection stability ---------------------------------------------------------------------

def feature_stability(record: Mapping, ax=None, title: str | None = None, top: int = 30):
    """How often each feature was selected over refits (a results.json ``feature_stability`` record, or
    ``FeatureStability.to_record()``): horizontal bars of the selection frequency (0 to 1) of the ``top``
    most often selected features, the most often first, each bar annotated with the feature's importance
    in the model fitted on all rows (%, where recorded and non-zero). With several regularisation values, a heatmap of
    features x values (frequency per value) instead, the most regularised value first.
    """
    names = [str(n) for n in record.get("names") or []][:top]
    freq = [number(f) for f in record.get("frequency") or []][:len(names)]
    by_value = record.get("frequency_by_value") or []
    values = [number(v) for v in record.get("values") or []]
    importance = record.get("importance") or []
    several = len(values) > 1 and len(by_value) == len(values)
    height = 1.4 + ROW_HEIGHT * max(len(names), 2)
    ax = _new_axes((FIG_WIDTH, min(height, 30.0)), ax)
    fits = sum(int(f) for f in record.get("fits") or [] if number(f) is not None)
    resamples = record.get("n_resamples")
    how = f"{fits} fits on {resamples} subsamples" if resamples else f"{fits} fits along the path"
    total = record.get("n_selected")
    shown = f", the {len(names)} most often selected of {total} shown" if total is not None and len(names) < total else ""
    ax.set_title((title or "feature selection frequency") + f" ({how}{shown})", fontsize="medium")
    if not names:
        return _empty(ax, "no feature was selected")
    y = np.arange(len(names))
    if several:
        grid = np.array([[number(row[j]) if j < len(row) else np.nan for row in by_value] for j in range(len(names))],
                        dtype=float)
        image = ax.imshow(grid, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(len(values)), [f"{v:.3g}" for v in values], rotation=30, ha="right", fontsize="small")
        ax.set_xlabel(f"{record.get('parameter') or 'C'} (most regularised first)")
        ax.figure.colorbar(image, ax=ax, label="selection frequency")
    else:
        ax.barh(y, freq, height=0.7, color=_colors(1)[0])
        for yi, j in zip(y, range(len(names))):
            imp = number(importance[j]) if j < len(importance) else None
            if imp is not None and imp > 0:      # features the fitted model does not use stay unlabelled
                ax.annotate(f"{100 * imp:.2g}%", (freq[j] or 0.0, yi), xytext=(3, 0), textcoords="offset points",
                            va="center", fontsize="x-small", color="0.3")
        ax.set_xlim(0.0, 1.15)
        ax.set_xlabel("selection frequency" + (" (labels: importance in the fitted model)" if importance else ""))
        ax.grid(True, axis="x", alpha=0.3)
    ax.set_yticks(y, names, fontsize="small")
    ax.set_ylim(len(names) - 0.5, -0.5)
    return ax


def _kernel_shares(kernels: Sequence[Mapping]) -> dict[str, float]:
    """{kernel name: share of the weight of all heads together} for one solver's kept kernels."""
    weights: dict[str, float] = {}
    for k in kernels:
        w = number(k.get("weight"))
        if w is not None and math.isfinite(w):
            weights[str(k.get("name"))] = weights.get(str(k.get("name")), 0.0) + abs(w)
    total = sum(weights.values())
    return {n: (w / total if total > 0 else 0.0) for n, w in weights.items()}


# ---- (2) and (3) convergence ----------------------------------------------------------------------

def duality_gap(histories: Mapping[str, Sequence[Mapping]], ax=None, tolerances: Mapping[str, Any] | None = None,
                title: str = "duality gap versus time"):
    """Relative duality gap versus wall time (log y), one line per solver, or per head (one-vs-rest).

    ``histories`` maps a solver label to its results.json history (entries with "seconds" and
    "gap"; entries without them, and gaps <= 0 or non-finite, are skipped). ``tolerances``
    optionally maps solver labels to their stopping tolerance, drawn as a dashed line.
    """
    ax = _new_axes((FIG_WIDTH, 4.2), ax)
    ax.set_title(title)
    lines = [(label, key, positive_points([e.get("seconds") for e in entries], [e.get("gap") for e in entries]))
             for label, h in histories.items() for key, entries in series_by_head(label, h).items()]
    lines = [line for line in lines if line[2][1].size]
    if not lines:
        return _empty(ax, "no duality gap recorded")
    tolerances = tolerances or {}
    for (label, key, (t, gap)), style in zip(lines, _styles(len(lines))):
        ax.plot(t, gap, marker="." if gap.size < 60 else None, label=key, **style)
        tol = number(tolerances.get(label))
        if tol is not None and math.isfinite(tol) and tol > 0:
            ax.axhline(tol, color=style["color"], linestyle="--", linewidth=0.8)
    _log_axis(ax, "y")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("relative duality gap")
    ax.grid(True, which="both", alpha=0.3)
    if len(lines) > 1:
        _legend(ax, len(lines))
    return ax


def active_set(histories: Mapping[str, Sequence[Mapping]], ax=None, title: str = "active-set size per iteration"):
    """Number of active kernels per iteration, one step line per solver (or per head).

    Uses each entry's "iteration" (else its position) and "n_active". The y axis turns
    logarithmic when the sizes span more than two decades (zeros are then left out), the x axis
    when some runs are over 20 times longer than others.
    """
    ax = _new_axes((FIG_WIDTH, 4.2), ax)
    ax.set_title(title)
    lines = [(key, _iteration_points(entries)) for label, h in histories.items()
             for key, entries in series_by_head(label, h).items()]
    lines = [(key, pts) for key, pts in lines if pts.size]
    if not lines:
        return _empty(ax, "no active-set sizes recorded")
    sizes = np.concatenate([pts[:, 1] for _, pts in lines])
    log_y = sizes.max() > 100 * max(sizes[sizes > 0].min(initial=1.0), 1.0)
    for (key, pts), style in zip(lines, _styles(len(lines))):
        pts = pts[pts[:, 1] > 0] if log_y else pts
        ax.step(pts[:, 0], pts[:, 1], where="post", label=key, marker="." if len(pts) < 60 else None, **style)
    if log_y:
        _log_axis(ax, "y")
    else:
        ax.set_ylim(bottom=0)
        ax.yaxis.get_major_locator().set_params(integer=True)
    lengths = [pts[:, 0].max() for _, pts in lines]
    if min(lengths) >= 1 and max(lengths) > 20 * min(lengths):
        _log_axis(ax, "x")
    ax.set_xlabel("iteration")
    ax.set_ylabel("active kernels")
    ax.grid(True, which="both", alpha=0.3)
    if len(lines) > 1:
        _legend(ax, len(lines))
    return ax


def convergence_panels(histories: Mapping[str, Sequence[Mapping]], tolerances: Mapping[str, Any] | None = None,
                       ncols: int = 3):
    """Small multiples: one column of two panels per solver (wrapped after ``ncols`` solvers), the
    duality gap versus wall time above (:func:`duality_gap`, its tolerance dashed) and the
    active-set size per iteration below (:func:`active_set`). Each solver gets its own axes, so
    runs of very different lengths stay readable. Returns the figure."""
    from matplotlib.figure import Figure

    labels = list(histories)
    ncols = max(1, min(ncols, len(labels)))
    nrows = -(-len(labels) // ncols)
    fig = Figure(figsize=(FIG_WIDTH if ncols > 1 else FIG_WIDTH * 0.6, 4.6 * nrows), layout="constrained")
    grid = fig.add_gridspec(2 * nrows, ncols)
    tolerances = tolerances or {}
    for i, label in enumerate(labels):
        r, c = divmod(i, ncols)
        one = {label: histories[label]}
        title = label if len(label) <= 24 else label[:23] + "…"
        gap = duality_gap(one, fig.add_subplot(grid[2 * r, c]), {label: tolerances.get(label)}, title=title)
        active = active_set(one, fig.add_subplot(grid[2 * r + 1, c]), title="")
        for ax in (gap, active):
            ax.xaxis.label.set_fontsize("small")
            ax.yaxis.label.set_fontsize("small")
            ax.tick_params(labelsize="small")
            if ax.get_legend() is not None:   # one-vs-rest heads: a small legend inside, on the gap panel only
                ax.get_legend().remove()
                if ax is gap:
                    handles, keys = ax.get_legend_handles_labels()
                    ax.legend(handles, [k.split(" [", 1)[-1].rstrip("]") for k in keys], title="class",
                              fontsize="x-small", title_fontsize="x-small", frameon=False)
        gap.title.set_fontweight("bold")
        gap.title.set_fontsize("medium")
    return fig


def _iteration_points(entries: Sequence[Mapping]) -> np.ndarray:
    """(k, 2) array of finite (iteration, n_active) pairs; the position stands in for a missing iteration."""
    pts = [(number(e.get("iteration", i + 1)), number(e.get("n_active"))) for i, e in enumerate(entries)]
    pts = [p for p in pts if None not in p and math.isfinite(p[0]) and math.isfinite(p[1])]
    return np.array(pts, dtype=float).reshape(-1, 2)


# ---- (4) regularisation path ------------------------------------------------------------------------

def regularisation_path(path: Mapping, ax=None, title: str | None = None, max_legend: int = 24):
    """Weight of every ever-active kernel versus the path parameter (log x), from a results.json "path".

    ``path`` has "parameter" (e.g. "tau"), "values", "kernel_names" and "weights" (one list per
    value, one weight per kernel name). Non-positive parameter values cannot go on the log axis
    and are left out. With ``scores`` (e.g. cross-validated R^2) the best value is marked. The
    legend names the ``max_legend`` kernels with the largest weights.
    """
    ax = _new_axes((FIG_WIDTH, 4.5), ax)
    parameter = str(path.get("parameter") or "parameter")
    names = [str(n) for n in path.get("kernel_names") or ()]
    values = np.array([_finite_or_nan(v) for v in path.get("values") or ()], dtype=float)
    weights = np.array([[_finite_or_nan(w) for w in row] for row in path.get("weights") or ()], dtype=float)
    ax.set_title(title or f"regularisation path over {parameter}: {len(names)} kernels ever active")
    keep = np.isfinite(values) & (values > 0)
    if not names or weights.ndim != 2 or weights.shape != (values.size, len(names)) or not keep.any():
        return _empty(ax, "no path recorded")
    labelled = set(np.argsort(-np.nanmax(np.abs(weights), axis=0), kind="stable")[:max_legend].tolist())
    for j, (name, style) in enumerate(zip(names, _styles(len(names)))):
        ax.plot(values[keep], weights[keep, j], marker=".", linewidth=1.2, label=name if j in labelled else None,
                **style)
    _mark_best(ax, values, path.get("scores"), path.get("score_name"))
    _log_axis(ax, "x")
    ax.set_xlabel(parameter)
    ax.set_ylabel("kernel weight d_m")
    ax.set_ylim(bottom=0)
    ax.grid(True, which="both", alpha=0.3)
    title = None if len(names) <= max_legend else f"{max_legend} largest of {len(names)}"
    _legend(ax, len(ax.get_legend_handles_labels()[1]), max_legend + 1, title=title, title_fontsize="small")
    return ax


def _finite_or_nan(value: Any) -> float:
    x = number(value)
    return math.nan if x is None or not math.isfinite(x) else x


def _mark_best(ax, values: np.ndarray, scores, score_name) -> None:
    """A dotted vertical line at the parameter value with the best score (higher is better,
    except for names containing "rmse", "mse", "error" or "loss")."""
    if not scores or len(scores) != values.size:
        return
    s = np.array([_finite_or_nan(v) for v in scores])
    ok = np.isfinite(s) & np.isfinite(values) & (values > 0)
    if not ok.any():
        return
    name = str(score_name or "score")
    lower_better = any(w in name.lower() for w in ("rmse", "mse", "error", "loss"))
    pick = np.where(ok, s if not lower_better else -s, -np.inf)
    best = int(np.argmax(pick))
    ax.axvline(values[best], color="0.3", linestyle=":", linewidth=1.2,
               label=f"best {name} = {s[best]:.4g}")


# ---- (5) metrics ----------------------------------------------------------------------------------

def metrics(solvers: Sequence[Mapping], ax=None, metric: str | None = None, reference: Any = None,
            reference_label: str = "constant predictor", label: str | None = None):
    """Horizontal bars of a test metric per solver (and its train counterpart in a lighter shade).

    ``solvers`` are results.json solver entries; entries without the metric (e.g. failed runs) are
    left out. ``metric`` defaults to :func:`main_test_metric`. ``reference`` (e.g. the majority-class
    rate for accuracy) is drawn as a dotted vertical line labelled ``reference_label``. ``label``
    names the metric in the title, axis and legend (default: its key, e.g. "test_r2").
    """
    metric = metric or main_test_metric(solvers)
    rows = [(str(s.get("name")), (s.get("metrics") or {})) for s in solvers]
    rows = [(name, m) for name, m in rows if math.isfinite(_finite_or_nan(m.get(metric)))]
    ax = _new_axes((FIG_WIDTH, 1.3 + 0.45 * max(len(rows), 2)), ax)
    name = label or metric or "metric"
    ax.set_title(f"{name} per solver")
    if metric is None or not rows:
        return _empty(ax, "no metric recorded")
    train = "train_" + metric[5:] if metric.startswith("test_") else None
    test_label, train_label = ("test rows", "training rows") if label else (metric, train)
    y = np.arange(len(rows))
    test_values = [_finite_or_nan(m.get(metric)) for _, m in rows]
    train_values = [_finite_or_nan(m.get(train)) for _, m in rows] if train else []
    has_train = any(math.isfinite(v) for v in train_values)
    h = 0.38 if has_train else 0.7
    bars = ax.barh(y - (h / 2 if has_train else 0), test_values, height=h, color="C0", label=test_label)
    ax.bar_label(bars, fmt="%.4g", padding=3, fontsize="x-small")
    if has_train:
        bars = ax.barh(y + h / 2, np.nan_to_num(train_values), height=h, color="C0", alpha=0.4, label=train_label)
        ax.bar_label(bars, labels=[f"{v:.4g}" if math.isfinite(v) else "" for v in train_values], padding=3,
                     fontsize="x-small")
    ref = number(reference)
    if ref is not None and math.isfinite(ref):
        ax.axvline(ref, color="0.3", linestyle=":", linewidth=1.2, label=f"{reference_label} {ref:.3g}")
    if has_train or (ref is not None and math.isfinite(ref)):
        _legend(ax, len(ax.get_legend_handles_labels()[1]))
    ax.set_yticks(y, [name for name, _ in rows], fontsize="small")
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.margins(x=0.15)
    ax.set_xlabel(name)
    ax.grid(True, axis="x", alpha=0.3)
    return ax


#: the test metric the report's bar chart shows first, when solvers report it
MAIN_METRICS = ("test_balanced_accuracy", "test_r2", "test_accuracy")


def main_test_metric(solvers: Sequence[Mapping]) -> str | None:
    """Balanced accuracy (classification) or R^2 (regression) when recorded, else the first "test_*"."""
    keys = {str(k) for s in solvers for k in (s.get("metrics") or {})}
    return next((m for m in MAIN_METRICS if m in keys), None) or first_test_metric(solvers)


def first_test_metric(solvers: Sequence[Mapping]) -> str | None:
    """The first metric named "test_*" that any solver entry reports, else None."""
    for s in solvers:
        for key in (s.get("metrics") or {}):
            if str(key).startswith("test_"):
                return str(key)
    return None


# ---- (6) model selection ---------------------------------------------------------------------------

def model_selection(selections: Mapping[str, Mapping], ncols: int = 3):
    """Small multiples of cross-validated scores: one panel per solver, the mean score per grid
    value with +-1 standard deviation across folds as error bars and the chosen value marked.

    ``selections`` maps a solver label to its results.json ``cv`` entry (see
    :func:`selection_table`). A grid of positive numbers spanning more than a decade gets a log
    axis. Returns the figure.
    """
    from matplotlib.figure import Figure

    labels = list(selections)
    ncols = max(1, min(ncols, len(labels)))
    nrows = -(-len(labels) // ncols)
    fig = Figure(figsize=(FIG_WIDTH if ncols > 1 else FIG_WIDTH * 0.6, 2.9 * nrows + 0.3), layout="constrained")
    for i, label in enumerate(labels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        table = selection_table(selections[label])
        ax.set_title(label, fontsize="medium", fontweight="bold")
        points = [(x, m, s) for x, m, s in zip(table["values"], table["mean"], table["std"])
                  if number(x) is not None and number(m) is not None]
        if not points:
            _empty(ax, "no CV scores recorded")
            continue
        x = np.array([number(p[0]) for p in points])
        mean = np.array([number(p[1]) for p in points])
        std = np.array([number(p[2]) if number(p[2]) is not None else 0.0 for p in points])
        ax.errorbar(x, mean, yerr=std, marker="o", markersize=3, capsize=2, linewidth=1.2)
        chosen = number(table["chosen"])
        if chosen is not None:
            ax.axvline(chosen, color="C3", linestyle=":", linewidth=1.2, label=f"chosen {chosen:g}")
            ax.legend(fontsize="x-small", frameon=False)
        if np.all(x > 0) and x.max() > 10 * x.min():
            _log_axis(ax, "x")
        ax.set_xlabel(str(table["parameter"]), fontsize="small")
        ax.set_ylabel(f"CV {table['score_name']}" if table["score_name"] else "CV score", fontsize="small")
        ax.tick_params(labelsize="small")
        ax.grid(True, which="both", alpha=0.3)
    return fig


def selection_table(selection: Mapping) -> dict:
    """A results.json ``cv`` entry (model selection by cross-validation; docs/design.md, "Model
    selection and the null model") read leniently: {parameter, values, mean, std, chosen, folds,
    score_name}, missing parts as None or empty lists. Read from ``grid`` (the tried values),
    ``mean`` and ``std`` (one per value, over the folds), ``chosen``, ``folds``, ``metric`` and
    ``parameter`` (also accepted: ``values``, ``mean_score``, ``std_score``, ``score_name``)."""
    def first(*keys, default=None):
        return next((selection[k] for k in keys if selection.get(k) is not None), default)

    values = list(first("grid", "values", default=[]) or [])
    mean = list(first("mean_score", "mean", "scores", "mean_scores", default=[]) or [])
    std = list(first("std_score", "std", "std_scores", default=[]) or [])
    mean += [None] * (len(values) - len(mean))
    std += [None] * (len(values) - len(std))
    return {"parameter": first("parameter", "param", default="value"), "values": values,
            "mean": mean[:len(values)], "std": std[:len(values)], "chosen": first("chosen", "best", "selected"),
            "folds": first("folds", "cv_folds", "n_folds"), "score_name": first("score_name", "metric", "scoring")}
