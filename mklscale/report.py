"""``mklscale report RUN_DIR``: a static HTML report of a pipeline run, with PNG figures.

:func:`write_report` reads ``RUN_DIR/results.json`` (written by ``mklscale run``; its schema and its
reader: :mod:`mklscale.results`) and writes ``RUN_DIR/report/index.html`` plus one PNG per figure of
:mod:`mklscale.plots`. The page is a static folder (inline CSS, no scripts, nothing fetched from the
network, no links out: it can be zipped and mailed); every string taken from results.json is
HTML-escaped. The report is assembled in a temporary folder inside RUN_DIR and renamed into place, so a
failure never leaves a half-written report and a second run replaces the first one whole.

What it shows, top to bottom: the pipeline's description; the data and the bank; per solver the
test metrics (balanced accuracy, ROC AUC and accuracy, or R^2 and RMSE; the cross-validated score
with its spread across folds where model selection ran), the test confusion matrices, train
metrics and cost; convergence as small multiples (one panel pair per solver); kernel weights as
shares of each solver's total weight (comparable across solvers) in a kernel x solver heatmap and
per solver; baselines with equal weights on every kernel are summarised in one line, not listed;
feature selection stability per solver run with ``stability = N`` (how often each feature was selected
over N subsample refits, with its importance in the fitted model).
Feature indices are shown by name where results.json has the dataset's ``feature_names``.

A solver with converged false is flagged "NOT CONVERGED" (class ``not-converged``) next to its name
in the test table and the kept-kernels section and in the converged column, with the estimator's
warning text (what to change) below the cost table; a constant predictor, or one below the null
model, is flagged beside its name too. The Dask dashboard's address is not shown (it ends with the
run). Every field but ``schema_version`` and ``solvers`` may be missing.
"""

from __future__ import annotations

import datetime
import html
import json
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mklscale import __version__, plots
from mklscale.results import load_results
from mklscale.runtime.atomic import swap_into_place

REPORT_DIR = "report"
DPI = 110
#: kept-kernel tables longer than this are cut (the figure shows the heaviest ones anyway)
MAX_KERNEL_ROWS = 200


# ---- writing the report ---------------------------------------------------------------------------

def write_report(run_dir: str | Path, quiet: bool = False) -> Path:
    """Write ``RUN_DIR/report/index.html`` and its PNG figures; return the path of index.html.

    The report is built in a temporary folder in RUN_DIR and then renamed to ``report``, replacing
    any earlier report only once the new one is complete. ``quiet`` silences the closing message.
    """
    run_dir = Path(run_dir)
    results = load_results(run_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{REPORT_DIR}-tmp-", dir=run_dir))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the report is meant to be read (and served)
        figures = render_figures(results, tmp)
        (tmp / "index.html").write_text(render_html(results, figures), encoding="utf-8")
        final = run_dir / REPORT_DIR
        swap_into_place(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    index = final / "index.html"
    if not quiet:
        print(f"report written to {index}")
    return index


# ---- reading the solver entries -------------------------------------------------------------------

def _ok(solver: Mapping) -> bool:
    """Whether a solver entry ran to the end (a missing status counts as "ok")."""
    return solver.get("status", "ok") == "ok"


def _kept(solver: Mapping) -> list[Mapping]:
    return [k for k in solver.get("kernels") or [] if isinstance(k, Mapping)]


def is_baseline(solver: Mapping) -> bool:
    """Whether a solver kept every kernel it has with one equal weight (the uniform baseline): the
    report summarises such a solver in one line instead of listing its kernels."""
    return plots.is_uniform(_kept(solver))


def _weighting(solvers: Sequence[Mapping]) -> list[tuple[int, Mapping]]:
    """(index, entry) of the solvers that ran to the end and chose unequal kernel weights."""
    return [(i, s) for i, s in enumerate(solvers) if _ok(s) and _kept(s) and not is_baseline(s)]


def _feature_names(results: Mapping) -> list[str] | None:
    names = (results.get("dataset") or {}).get("feature_names") if isinstance(results.get("dataset"), Mapping) else None
    return [str(n) for n in names] if isinstance(names, list) else None


def _iterative(history: Any) -> bool:
    """Whether a history has something to draw: at least two iterations."""
    return isinstance(history, list) and sum(isinstance(e, Mapping) for e in history) >= 2


def _selection(solver: Mapping) -> Mapping | None:
    """The solver's cross-validation entry ("cv"), when its C was chosen by model selection."""
    ms = solver.get("cv")
    return ms if isinstance(ms, Mapping) and ms else None


def _stability(solver: Mapping) -> Mapping | None:
    """The solver's feature_stability record ([[solver]] stability = N), when it ran to the end."""
    record = solver.get("feature_stability")
    if _ok(solver) and isinstance(record, Mapping) and not record.get("error") and isinstance(record.get("names"), list):
        return record
    return None


def _null_model(results: Mapping) -> Mapping:
    """``dataset.null_model``: the majority-class or training-mean predictor's scores (or {})."""
    dataset = results.get("dataset") if isinstance(results.get("dataset"), Mapping) else {}
    null = dataset.get("null_model")
    return null if isinstance(null, Mapping) else {}


# ---- figures ----------------------------------------------------------------------------------------

def render_figures(results: Mapping, out_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """Draw every figure the data allows into ``out_dir`` as PNG.

    Returns {section: [(file name, caption)]} with sections "metrics", "selection", "convergence",
    "heatmap" and "weights:<i>" / "stability:<i>" / "path:<i>" for solver i.
    """
    solvers = results.get("solvers") or []
    ok = [s for s in solvers if _ok(s)]
    names = _feature_names(results)
    figures: dict[str, list[tuple[str, str]]] = {}
    metric = plots.main_test_metric(ok)
    if metric:
        ref, ref_label = _constant_score(results, metric)
        _save(plots.metrics(ok, metric=metric, reference=ref, reference_label=ref_label, label=_metric_label(metric)),
              out_dir, "metrics.png", figures, "metrics", f"{_metric_label(metric)} on the test rows per solver (lighter: "
              "on the training rows; dotted: what a constant prediction scores)")
    selections = {str(s.get("name")): _selection(s) for s in ok if _selection(s)}
    if selections:
        _save(plots.model_selection(selections), out_dir, "model-selection.png", figures, "selection",
              "cross-validated score per grid value (error bars: one standard deviation across folds; dotted: "
              "the value chosen)")
    histories = {str(s.get("name")): s["history"] for s in ok if _iterative(s.get("history"))}
    tolerances = {str(s.get("name")): (s.get("params") or {}).get("tol") for s in ok}
    if histories:
        _save(plots.convergence_panels(histories, tolerances), out_dir, "convergence.png", figures,
              "convergence", "per solver: the relative duality gap versus wall time (dashed: the solver's "
              "tolerance) and the number of kernels with non-zero weight per outer iteration")
    weighting = _weighting(solvers)
    if len(weighting) > 1:
        _save(plots.weight_heatmap({str(s.get("name")): _kept(s) for _, s in weighting}, feature_names=names),
              out_dir, "weights-heatmap.png", figures, "heatmap",
              "each kept kernel's share of a solver's total weight, in %: comparable across solvers (blank: "
              "dropped by that solver)")
    for i, s in weighting:
        name = str(s.get("name"))
        _save(plots.kernel_weights(_kept(s), title=f"{name}: kernel weights", feature_names=names), out_dir,
              f"weights-{i:02d}-{_slug(name)}.png", figures, f"weights:{i}",
              f"{name}: each kept kernel's share of the total weight, grouped by family, labelled parameters "
              "[features]")
    for i, s in enumerate(solvers):
        record = _stability(s)
        if record is not None:
            name = str(s.get("name"))
            _save(plots.feature_stability(record, title=f"{name}: feature selection frequency"), out_dir,
                  f"stability-{i:02d}-{_slug(name)}.png", figures, f"stability:{i}",
                  f"{name}: how often each feature was selected (some kept kernel uses it) when refitted on "
                  "subsamples of the training rows")
    for i, s in enumerate(solvers):
        if _ok(s) and isinstance(s.get("path"), dict) and s["path"].get("kernel_names") and s["path"].get("values"):
            name = str(s.get("name"))
            _save(plots.regularisation_path(s["path"]), out_dir, f"path-{i:02d}-{_slug(name)}.png",
                  figures, f"path:{i}", f"{name}: kernel weights along the regularisation path")
    return figures


def _constant_score(results: Mapping, metric: str) -> tuple[Any, str]:
    """What predicting one class (or the training mean) for every row scores on ``metric``: 1/K for
    balanced accuracy (K classes), else the null model's score when recorded; else (None, "")."""
    classes = (results.get("dataset") or {}).get("classes") if isinstance(results.get("dataset"), Mapping) else None
    if metric == "test_balanced_accuracy" and isinstance(classes, list) and len(classes) >= 2:
        return 1.0 / len(classes), "constant prediction"
    null = _null_model(results)
    if null.get(metric) is not None:
        return null[metric], "majority class" if null.get("kind") == "majority_class" else "training mean"
    return None, ""


def _save(drawn, out_dir: Path, file_name: str, figures: dict, section: str, caption: str) -> None:
    """Save ``drawn`` (a Figure, or Axes on one) as ``out_dir/file_name`` and list it under ``section``."""
    figure = getattr(drawn, "figure", None) or drawn
    figure.savefig(out_dir / file_name, dpi=DPI)
    figures.setdefault(section, []).append((file_name, caption))


def _slug(name: str) -> str:
    """A file-name-safe fragment of a solver name (the index in front keeps names unique)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")[:40] or "solver"


# ---- HTML -----------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: .3em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
p.description { font-size: 1.1em; margin: .2em 0 .6em; max-width: 60em; }
.wrap { max-width: 100%; overflow-x: auto; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top;
         overflow-wrap: break-word; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.params { font-size: .85em; color: #444; min-width: 12em; max-width: 18em; overflow-wrap: anywhere; }
tr.failed td { background: #fdecea; } .error { color: #a00; white-space: pre-wrap; }
td.error { min-width: 16em; overflow-wrap: anywhere; }
.not-converged, .constant { color: #a00; font-weight: bold; }
.meta, .note, figcaption { color: #555; font-size: .9em; } .note { background: #fff8e1; padding: .6em; }
.side { display: flex; flex-wrap: wrap; gap: 0 2.5em; align-items: flex-start; }
.side > div { min-width: 0; max-width: 100%; }
table.kv th { white-space: nowrap; } table.kv td { max-width: 24em; }
table.confusion td { min-width: 3em; } table.confusion td.hit { background: #e3f0e3; }
figure { margin: 1em 0; } img { max-width: 100%; height: auto; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: .6em; overflow-x: auto; font-size: .85em; white-space: pre-wrap; }
details { margin: .4em 0 1em; } summary { cursor: pointer; color: #333; }
""".strip()

#: how the report names metrics (results.json keys without their test_/train_ prefix)
_METRIC_LABELS = {"balanced_accuracy": "balanced accuracy", "roc_auc": "ROC AUC", "accuracy": "accuracy",
                  "r2": "R²", "rmse": "RMSE"}
#: metrics in the order the tables show them (others follow, sorted)
_METRIC_ORDER = ("balanced_accuracy", "roc_auc", "accuracy", "r2", "rmse")


def _e(value: Any) -> str:
    """HTML-escaped text of any value."""
    return html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    """Text of a results.json value for a table cell: numbers to 4 significant digits, bools as yes/no,
    "inf"/"nan" as they are, missing as a dash, lists and dicts compactly. Not yet escaped."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        text = json.dumps(value, separators=(",", ":"))
        return text if len(text) <= 60 else text[:57] + "..."
    return str(value)


def fmt_bytes(value: Any) -> str:
    """Bytes in decimal units (kB, MB, GB, TB)."""
    x = plots.number(value)
    if x is None:
        return fmt(value)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(x) < 1000.0:
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1000.0
    return f"{x:.1f} TB"


def _params_text(params: Any) -> str:
    """``k=v, k=v`` for a params dict (values via :func:`fmt`; unset ones left out)."""
    if not isinstance(params, Mapping):
        return fmt(params)
    return ", ".join(f"{k}={fmt(v)}" for k, v in params.items() if v is not None)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], row_classes: Sequence[str] | None = None,
           cls: str = "") -> str:
    """An HTML table in a wrapper that scrolls rather than widening the page; ``header`` is escaped
    here, ``rows`` cells must already be HTML (``<td>...``)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join((f'<tr class="{_e(c)}">' if c else "<tr>") + "".join(r) + "</tr>"
                   for r, c in zip(rows, row_classes or [""] * len(rows)))
    table_class = f' class="{cls}"' if cls else ""
    return f'<div class="wrap"><table{table_class}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _td(value: Any, numeric: bool = False, text: str | None = None, cls: str = "") -> str:
    """One escaped table cell; ``text`` overrides the formatted ``value``."""
    classes = " ".join(c for c in ("num" if numeric else "", cls) if c)
    attr = f' class="{classes}"' if classes else ""
    return f"<td{attr}>{_e(fmt(value) if text is None else text)}</td>"


def _key_values(title: str, data: Any, bytes_keys: Sequence[str] = (), skip: Sequence[str] = ()) -> str:
    """A two-column table of a results.json section (a dict), or a line saying it was not recorded."""
    if not isinstance(data, Mapping) or not data:
        return f"<div><h3>{_e(title)}</h3><p class=\"meta\">not recorded</p></div>"
    rows = [[f"<th>{_e(k)}</th>", _td(v, text=fmt_bytes(v) if k in bytes_keys else _section_value(v))]
            for k, v in data.items() if k not in skip]
    body = "".join(f"<tr>{''.join(r)}</tr>" for r in rows)
    return f'<div><h3>{_e(title)}</h3><div class="wrap"><table class="kv"><tbody>{body}</tbody></table></div></div>'


def _section_value(value: Any) -> str:
    """Dicts of counts (e.g. bank families) as ``a: 1, b: 2``; lists of names joined by commas
    (cut after 8); anything else via :func:`fmt`."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {fmt(v)}" for k, v in value.items())
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        more = f", ... ({len(value)} in all)" if len(value) > 8 else ""
        return ", ".join(value[:8]) + more
    return fmt(value)


def render_html(results: Mapping, figures: Mapping[str, list[tuple[str, str]]] | None) -> str:
    """The whole report page. ``figures`` from :func:`render_figures` (None: tables only)."""
    pipeline = results.get("pipeline") if isinstance(results.get("pipeline"), Mapping) else {}
    name = str(pipeline.get("name") or "unnamed pipeline")
    solvers = results.get("solvers") or []
    names = _feature_names(results)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>mklscale report: {_e(name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>mklscale report: {_e(name)}</h1>",
        _description(pipeline),
        _run_summary(results, pipeline),
        "<h2>Data and kernel bank</h2>",
        '<div class="side">', _key_values("Dataset", results.get("dataset")),
        _key_values("Kernel bank", results.get("bank")), "</div>",
        "<h2>Solvers</h2>", "<h3>Test rows</h3>" if solvers else "", _quality_table(solvers, results),
        _flags(solvers, results),
        _figures_html(figures, "metrics"), _confusion_matrices(solvers), _model_selection(solvers, figures),
        _cost_table(solvers),
        _convergence_section(solvers, figures),
        _weights_section(solvers, figures, names),
        _stability_section(solvers, figures),
        _paths_section(solvers, figures),
        _environment(results, pipeline),
        f'<p class="meta">generated by mklscale {_e(__version__)} on '
        f"{_e(datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'))}</p>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def _description(pipeline: Mapping) -> str:
    """The pipeline's description (recorded, or from its configuration), first on the page."""
    config = pipeline.get("config") if isinstance(pipeline.get("config"), Mapping) else {}
    text = pipeline.get("description") or config.get("description")
    return f'<p class="description">{_e(text)}</p>' if text else ""


def _run_summary(results: Mapping, pipeline: Mapping) -> str:
    """One line: pipeline file, start, end, wall time, version of mklscale that ran it."""
    items = [("pipeline file", pipeline.get("path")), ("started", results.get("started")),
             ("finished", results.get("finished")), ("wall time (s)", results.get("seconds")),
             ("mklscale", results.get("mklscale_version"))]
    text = " · ".join(f"{_e(k)}: {_e(fmt(v))}" for k, v in items if v is not None)
    return f'<p class="meta">{text}</p>' if text else ""


def _metric_keys(solvers: Sequence[Mapping], prefix: str) -> list[str]:
    """The metric names with ``prefix`` the solvers report, in :data:`_METRIC_ORDER`, then sorted."""
    keys = {str(k) for s in solvers if isinstance(s.get("metrics"), Mapping) for k in s["metrics"]
            if str(k).startswith(prefix)}
    order = {f"{prefix}{m}": i for i, m in enumerate(_METRIC_ORDER)}
    return sorted(keys, key=lambda k: (order.get(k, len(order)), k))


def _metric_label(key: str) -> str:
    bare = key.split("_", 1)[1] if key.startswith(("test_", "train_")) else key
    return _METRIC_LABELS.get(bare, bare.replace("_", " "))


def _metrics_of(solver: Mapping) -> Mapping:
    return solver.get("metrics") if isinstance(solver.get("metrics"), Mapping) else {}


def _name_cell(solver: Mapping) -> str:
    """The solver's name, with the flags of an unconverged run or a constant predictor."""
    flags = (f' <span class="not-converged">{NOT_CONVERGED}</span>' if _not_converged(solver) else "") + \
            (f' <span class="constant">{CONSTANT}</span>' if _constant(solver) else "") + \
            (f' <span class="constant">{BELOW_NULL}</span>' if _below_null(solver) else "")
    return f"<td>{_e(solver.get('name'))}{flags}</td>"


def _quality_table(solvers: Sequence[Mapping], results: Mapping) -> str:
    """Test metrics per solver: name, algorithm, params, test metrics, the CV score, kept kernels."""
    if not solvers:
        return '<p class="meta">no solver was run</p>'
    keys = _metric_keys(solvers, "test_")
    with_cv = any(_selection(s) for s in solvers)
    M = (results.get("bank") or {}).get("M") if isinstance(results.get("bank"), Mapping) else None
    header = ["solver", "algorithm", "parameters", *(f"test {_metric_label(k)}" for k in keys),
              *(["CV score (mean ± std)"] if with_cv else []), "kept kernels"]
    rows, classes = [], []
    for s in solvers:
        metrics = _metrics_of(s)
        kept = s.get("n_active")
        kept_text = fmt(kept) if kept is None or M is None else f"{fmt(kept)} / {fmt(M)}"
        rows.append([_name_cell(s), _td(s.get("solver")),
                     _td(None, text=_params_text(s.get("params") or {}), cls="params"),
                     *(_td(metrics.get(k), numeric=True) for k in keys),
                     *([_td(None, numeric=True, text=_cv_text(s))] if with_cv else []),
                     _td(None, numeric=True, text=kept_text)])
        classes.append("" if _ok(s) else "failed")
    return _table(header, rows, classes)


def _cv_text(solver: Mapping) -> str:
    """``mean ± std`` of the cross-validated score at the chosen value (a dash without model selection)."""
    ms = _selection(solver)
    if ms is None:
        return fmt(None)
    table = plots.selection_table(ms)
    at = next((j for j, v in enumerate(table["values"]) if v == table["chosen"]), None)
    if at is None:
        return fmt(None)
    mean, std = table["mean"][at], table["std"][at]
    return fmt(mean) + ("" if plots.number(std) is None else f" ± {fmt(std)}")


def _cost_table(solvers: Sequence[Mapping]) -> str:
    """Train metrics, convergence and cost per solver."""
    if not solvers:
        return ""
    keys = _metric_keys(solvers, "train_")
    header = ["solver", *(f"train {_metric_label(k)}" for k in keys), "converged", "gap", "passes", "bytes read",
              "seconds", "status"]
    rows, classes = [], []
    for s in solvers:
        metrics = _metrics_of(s)
        failed = not _ok(s)
        status = f"{s.get('status', 'ok')}" + (f": {s.get('error')}" if s.get("error") else "")
        rows.append([_td(s.get("name")), *(_td(metrics.get(k), numeric=True) for k in keys),
                     _converged_cell(s), _td(s.get("gap"), numeric=True), _td(s.get("passes"), numeric=True),
                     _td(None, numeric=True, text=fmt_bytes(s.get("bytes_read"))), _td(s.get("seconds"), numeric=True),
                     f'<td class="error">{_e(status)}</td>' if failed else _td(status)])
        classes.append("failed" if failed else "")
    return "<h3>Training rows, convergence and cost</h3>" + _table(header, rows, classes) + _convergence_warnings(solvers)


#: the flag of a solver entry with converged false
NOT_CONVERGED = "NOT CONVERGED"
#: the flag of a solver whose model predicts one value for every row
CONSTANT = "CONSTANT PREDICTOR"
#: the flag of a solver whose test score is below the null model's
BELOW_NULL = "BELOW THE NULL MODEL"


def _not_converged(solver: Mapping) -> bool:
    """Whether a solver entry that ran to the end says it did not converge (converged is false)."""
    return _ok(solver) and solver.get("converged") is False


def _constant(solver: Mapping) -> bool:
    """Whether the solver's model predicts one class / one value for every row (constant_predictor)."""
    flag = solver.get("constant_predictor")
    return _ok(solver) and isinstance(flag, Mapping) and flag.get("constant") is True


def _below_null(solver: Mapping) -> bool:
    """Whether the solver scores below the null model on the test rows (null_model.at_least_null false)."""
    null = solver.get("null_model")
    return _ok(solver) and isinstance(null, Mapping) and null.get("at_least_null") is False


def _flags(solvers: Sequence[Mapping], results: Mapping) -> str:
    """The null model's scores (majority class or training mean), and which solvers are constant
    predictors or below the null model."""
    null = _null_model(results)
    items = []
    if null.get("kind") == "majority_class":
        items.append(f"null model: always predicting the training majority class {_e(fmt(null.get('label')))} "
                     f"scores test accuracy {_e(fmt(null.get('test_accuracy')))} (the majority-class rate)")
    elif null.get("kind") == "mean":
        items.append(f"null model: predicting the training mean {_e(fmt(null.get('value')))} for every row scores "
                     f"test R² {_e(fmt(null.get('test_r2')))}, test RMSE {_e(fmt(null.get('test_rmse')))}")
    below = [str(s.get("name")) for s in solvers if _below_null(s)]
    if below:
        items.append(f'<span class="constant">{BELOW_NULL}</span>: {_e(", ".join(below))}')
    constant = [(str(s.get("name")), s["constant_predictor"].get("value")) for s in solvers if _constant(s)]
    for name, value in constant:
        items.append(f'<span class="constant">{CONSTANT}</span>: {_e(name)} predicts {_e(fmt(value))} for every '
                     "row; its metrics are those of a constant (a smaller regularisation, or C chosen by "
                     "cross-validation, usually helps)")
    return f'<p class="note">{"<br>".join(items)}</p>' if items else ""


def _converged_cell(solver: Mapping) -> str:
    """The converged column: "yes", or the flag (with the warning text as tooltip) when it did not."""
    if not _not_converged(solver):
        return _td(solver.get("converged"))
    tip = solver.get("convergence_warning")
    title = f' title="{_e(tip)}"' if tip else ""
    return f'<td class="not-converged"{title}>no: {NOT_CONVERGED}</td>'


def _convergence_warnings(solvers: Sequence[Mapping]) -> str:
    """A list under the solver table: each unconverged solver's name, flag and what to change."""
    items = [f"<li><b>{_e(s.get('name'))}</b>: {NOT_CONVERGED}"
             + (f" &mdash; {_e(s['convergence_warning'])}" if s.get("convergence_warning") else
                f" (gap {_e(fmt(s.get('gap')))})") + "</li>"
             for s in solvers if _not_converged(s)]
    return f'<ul class="not-converged">{"".join(items)}</ul>' if items else ""


def _confusion_matrices(solvers: Sequence[Mapping]) -> str:
    """The test rows' confusion matrix of each classifier, side by side (rows: true, columns: predicted)."""
    blocks = []
    for s in solvers:
        cm = s.get("confusion_matrix")
        if not _ok(s) or not isinstance(cm, Mapping) or not cm.get("counts"):
            continue
        labels = [fmt(lab) for lab in cm.get("labels") or range(len(cm["counts"]))]
        rows = [[f"<th>{_e(labels[i]) if i < len(labels) else i}</th>"]
                + [_td(c, numeric=True, cls="hit" if i == j else "") for j, c in enumerate(row)]
                for i, row in enumerate(cm["counts"])]
        table = _table(["true \\ predicted", *labels], rows, cls="confusion")
        blocks.append(f"<div><b>{_e(s.get('name'))}</b>{table}</div>")
    if not blocks:
        return ""
    return ('<h3>Confusion matrices (test rows)</h3><p class="meta">rows: the true class, columns: the predicted '
            f'class; the diagonal holds the correct predictions</p><div class="side">{"".join(blocks)}</div>')


def _model_selection(solvers: Sequence[Mapping], figures: Mapping | None) -> str:
    """Per solver with a cv entry: its grid, the mean and std of the CV score per value
    and the value chosen, in a collapsed table, below the figure of all of them."""
    blocks = []
    for s in solvers:
        ms = _selection(s)
        if ms is None:
            continue
        table = plots.selection_table(ms)
        rows = [[_td(v, numeric=True), _td(m, numeric=True), _td(sd, numeric=True),
                 _td("chosen" if v == table["chosen"] else "")]
                for v, m, sd in zip(table["values"], table["mean"], table["std"])]
        score = f"CV {table['score_name']}" if table["score_name"] else "CV score"
        folds = f", {fmt(table['folds'])} folds" if table["folds"] is not None else ""
        blocks.append(f"<details><summary>{_e(s.get('name'))}: {_e(table['parameter'])} = "
                      f"{_e(fmt(table['chosen']))} chosen{_e(folds)}</summary>"
                      + _table([str(table["parameter"]), f"{score} mean", "std", ""], rows) + "</details>")
    if not blocks:
        return ""
    return "<h3>Model selection by cross-validation</h3>" + _figures_html(figures, "selection") + "".join(blocks)


def _figures_html(figures: Mapping | None, section: str) -> str:
    """The <figure> elements of one section (empty when there are none)."""
    return "".join(f'<figure><img src="{_e(file)}" alt="{_e(caption)}"><figcaption>{_e(caption)}</figcaption>'
                   f"</figure>" for file, caption in (figures or {}).get(section, []))


def _convergence_section(solvers: Sequence[Mapping], figures: Mapping | None) -> str:
    body = _figures_html(figures, "convergence")
    single = [str(s.get("name")) for s in solvers if _ok(s) and not _iterative(s.get("history"))]
    note = (f'<p class="meta">not shown (a single step, nothing to converge): {_e(", ".join(single))}</p>'
            if body and single else "")
    return f"<h2>Convergence</h2>{body}{note}" if body else ""


def _weights_section(solvers: Sequence[Mapping], figures: Mapping | None, names: list[str] | None) -> str:
    """The heatmap of all solvers' shares, the baselines in one line each, then each solver's kernels."""
    if not solvers:
        return ""
    baselines = [_baseline_line(s) for s in solvers if _ok(s) and is_baseline(s)]
    return ("<h2>Kernel weights</h2>"
            '<p class="meta">weights are shown as each kernel\'s share of the solver\'s total weight (per class '
            "for one-vs-rest), since solvers scale their weights differently</p>"
            + _figures_html(figures, "heatmap")
            + (f"<h3>Baselines</h3><ul>{''.join(baselines)}</ul>" if baselines else "")
            + "".join(_solver_kernels(i, s, figures, names) for i, s in enumerate(solvers)
                      if not (_ok(s) and is_baseline(s))))


def _baseline_line(solver: Mapping) -> str:
    kernels = _kept(solver)
    n = len({str(k.get("name")) for k in kernels})
    return (f"<li><b>{_e(solver.get('name'))}</b> ({_e(fmt(solver.get('solver')))}): the same weight on each of "
            f"its {n} kernels ({_e(f'{100.0 / n:.3g}')} % each)</li>")


def _solver_kernels(i: int, solver: Mapping, figures: Mapping | None, names: list[str] | None) -> str:
    """The shares figure and the kept-kernel table (heaviest first, collapsed) of solver ``i``."""
    flag = f' <span class="not-converged">{NOT_CONVERGED}</span>' if _not_converged(solver) else ""
    title = f"<h3>{_e(solver.get('name'))} <small>({_e(fmt(solver.get('solver')))})</small>{flag}</h3>"
    if not _ok(solver):
        return f'{title}<p class="error">failed: {_e(fmt(solver.get("error")))}</p>'
    kernels = _kept(solver)
    if not kernels:
        return f'{title}<p class="meta">no kernel kept</p>'
    shares = plots.weight_shares(kernels)
    order = sorted(range(len(kernels)), key=lambda j: -(shares[j] or 0.0))
    with_head = any(k.get("head") is not None for k in kernels)
    from mklscale.bank.spec import features_text

    header = ["name", "family", "params", "features", "weight", "share (%)"] + (["class"] if with_head else [])
    rows = []
    for j in order[:MAX_KERNEL_ROWS]:
        k = kernels[j]
        feats = k.get("features")
        feats = features_text(feats if isinstance(feats, list) or feats is None else [feats], names)
        rows.append([_td(k.get("name")), _td(k.get("family")), _td(None, text=_params_text(k.get("params") or {})),
                     _td(None, text=feats), _td(k.get("weight"), numeric=True),
                     _td(None, numeric=True, text="–" if shares[j] is None else f"{100 * shares[j]:.3g}")]
                    + ([_td(k.get("head"))] if with_head else []))
    cut = (f'<p class="meta">the {MAX_KERNEL_ROWS} heaviest of {len(kernels)} kept kernels are listed</p>'
           if len(kernels) > MAX_KERNEL_ROWS else "")
    return (title + _figures_html(figures, f"weights:{i}")
            + f"<details><summary>the {len({str(k.get('name')) for k in kernels})} kept kernels and their weights"
            + (" (per class)" if with_head else "") + "</summary>"
            + _table(header, rows) + cut + "</details>")


#: rows of a solver's feature stability table (the figure shows the top 30)
MAX_FEATURE_ROWS = 100


def _stability_section(solvers: Sequence[Mapping], figures: Mapping | None) -> str:
    """Per solver with a feature_stability record: its figure, a note where kernels over all features
    were kept (they select every feature) and a collapsed table of the most often selected features."""
    blocks = []
    for i, s in enumerate(solvers):
        failed = s.get("feature_stability")
        if isinstance(failed, Mapping) and failed.get("error"):
            blocks.append(f"<h3>{_e(s.get('name'))}</h3><p class=\"error\">feature stability failed: "
                          f"{_e(failed['error'])}</p>")
        record = _stability(s)
        if record is None:
            continue
        fits = sum(int(f) for f in record.get("fits") or [])
        wide = sum(int(f) for f in record.get("all_feature_fits") or [])
        note = (f'<p class="note">{wide} of {fits} fits kept a kernel over all features: such a kernel uses, hence '
                "selects, every feature, so those fits count for every feature; kernels on feature subsets "
                "(per-feature families) make the frequencies tell the features apart</p>" if wide else "")
        names, freq = record.get("names") or [], record.get("frequency") or []
        importance = record.get("importance") or []
        rows = [[_td(name), _td(freq[j] if j < len(freq) else None, numeric=True),
                 _td(None, numeric=True, text=fmt(None) if j >= len(importance) or importance[j] is None
                     else f"{100 * importance[j]:.3g}")]
                for j, name in enumerate(names[:MAX_FEATURE_ROWS])]
        how = (f"{_e(fmt(record.get('n_resamples')))} subsamples of {_e(fmt(record.get('fraction')))} of the training "
               f"rows at {_e(fmt(record.get('parameter')))} = {_e(', '.join(fmt(v) for v in record.get('values') or []))}")
        blocks.append(f"<h3>{_e(s.get('name'))}</h3><p class=\"meta\">{how}; {_e(fmt(record.get('n_selected')))} of "
                      f"{_e(fmt(record.get('n_features')))} features selected at least once</p>"
                      + _figures_html(figures, f"stability:{i}") + note
                      + "<details><summary>the most often selected features</summary>"
                      + _table(["feature", "selection frequency", "importance in the fitted model (%)"], rows)
                      + "</details>")
    if not blocks:
        return ""
    return ("<h2>Feature selection</h2><p class=\"meta\">a feature is selected by a fit when some kept kernel uses "
            "it; its importance is the kept kernels' shares of the weight, each split evenly among the kernel's "
            "features</p>" + "".join(blocks))


def _paths_section(solvers: Sequence[Mapping], figures: Mapping | None) -> str:
    """Per solver with a "path": its figure and a table of parameter value, kernels, score."""
    blocks = []
    for i, s in enumerate(solvers):
        path = s.get("path")
        if not isinstance(path, Mapping):
            continue
        values = list(path.get("values") or [])
        n_active = list(path.get("n_active") or [])
        scores = list(path.get("scores") or [])
        score_name = str(path.get("score_name") or "score")
        header = [str(path.get("parameter") or "parameter"), "active kernels"] + ([score_name] if scores else [])
        rows = [[_td(v, numeric=True), _td(n_active[j] if j < len(n_active) else None, numeric=True)]
                + ([_td(scores[j] if j < len(scores) else None, numeric=True)] if scores else [])
                for j, v in enumerate(values)]
        table = (f"<details><summary>path values</summary>{_table(header, rows)}</details>" if rows
                 else '<p class="meta">no path values recorded</p>')
        blocks.append(f"<h3>{_e(s.get('name'))}</h3>{_figures_html(figures, f'path:{i}')}{table}")
    return "<h2>Regularisation paths</h2>" + "".join(blocks) if blocks else ""


def _environment(results: Mapping, pipeline: Mapping) -> str:
    """Cluster and machine tables and the pipeline configuration as JSON (collapsed). The Dask
    dashboard's address is left out: the dashboard ends with the run, so a link would be dead."""
    config = pipeline.get("config")
    config_html = ("<details><summary>pipeline configuration</summary><pre>"
                   f"{_e(json.dumps(config, indent=2, sort_keys=True))}</pre></details>" if config else "")
    return ('<h2>Environment</h2><div class="side">'
            + _key_values("Cluster", results.get("cluster"), skip=("dashboard",))
            + _key_values("Machine", results.get("machine"), bytes_keys=("memory", "memory_bytes"))
            + "</div>" + config_html)
