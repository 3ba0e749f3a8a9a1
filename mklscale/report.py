"""``mklscale report RUN_DIR``: a static HTML report of a pipeline run, with PNG figures.

:func:`write_report` reads ``RUN_DIR/results.json`` (written by ``mklscale run``; schema below) and
writes ``RUN_DIR/report/index.html`` plus one PNG per figure of :mod:`mklscale.plots`. The page is
self-contained static HTML (inline CSS, no scripts, nothing fetched from the network); every string
taken from results.json is HTML-escaped. The report is assembled in a temporary folder inside
RUN_DIR and renamed into place, so a failure never leaves a half-written report and a second run
replaces the first one whole. Without matplotlib (the optional extra ``plot``) the page keeps all
its tables and says how to get the figures.

results.json (schema_version 1) holds: pipeline {name, path, config}, started, finished, seconds,
machine, cluster, dataset {name, task, n_train, n_test, n_features, classes}, bank {path, M, n,
dtype, normalize, build_seconds, kernels_computed, families}, and solvers: a list of {name, solver,
params, status, error, metrics, seconds, passes, bytes_read, converged, objective, gap, n_active,
kernels (the kept ones), history, path, convergence_warning, model}. A solver with converged false
is flagged "NOT CONVERGED" (class ``not-converged``) in the converged column of the solver table and
next to its name in the kept-kernels section, with the estimator's warning text (what to change)
below the table. Only ``schema_version`` and ``solvers`` are
required; every other field may be missing. Non-finite floats may be the strings "inf"/"-inf"/"nan".
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
from mklscale.errors import InvalidInputError
from mklscale.runtime.atomic import swap_into_place

SCHEMA_VERSION = 1
RESULTS_FILE = "results.json"
REPORT_DIR = "report"
DPI = 110
#: kept-kernel tables longer than this are cut (the figure shows the heaviest ones anyway)
MAX_KERNEL_ROWS = 200
_RUN_HINT = ("run the pipeline first (`mklscale run PIPELINE.toml`), then give `mklscale report` the "
             "run folder it wrote")


# ---- reading results.json ------------------------------------------------------------------------

def load_results(run_dir: str | Path) -> dict:
    """The parsed ``RUN_DIR/results.json``, checked for the parts the report relies on.

    Raises InvalidInputError (saying which file and what to do) when the folder or file is missing,
    is not valid JSON, or is not a results.json of schema version 1.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InvalidInputError(f"run folder {run_dir} does not exist or is not a folder; {_RUN_HINT}")
    path = run_dir / RESULTS_FILE
    if not path.is_file():
        raise InvalidInputError(f"{path} not found: {run_dir} holds no finished pipeline run; {_RUN_HINT}")
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{path} is not valid JSON ({exc}); the file is damaged or was cut short "
                                f"(an interrupted run?): run the pipeline again") from None
    _check_schema(results, path)
    return results


def _check_schema(results: Any, path: Path) -> None:
    """Raise InvalidInputError unless ``results`` is a schema-1 results dict with a list of solvers."""
    if not isinstance(results, dict) or "schema_version" not in results:
        raise InvalidInputError(f"{path} is not an mklscale results file (no schema_version); "
                                f"{_RUN_HINT}")
    version = results["schema_version"]
    if version != SCHEMA_VERSION or isinstance(version, bool):
        newer = isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION
        what = "upgrade mklscale to read it" if newer else "run the pipeline again with this mklscale"
        raise InvalidInputError(f"{path} has schema_version {version!r}; this mklscale {__version__} reads "
                                f"schema_version {SCHEMA_VERSION}: {what}")
    solvers = results.get("solvers")
    if not isinstance(solvers, list) or not all(isinstance(s, dict) for s in solvers):
        raise InvalidInputError(f"{path}: 'solvers' must be a list of objects, one per solver run; the file "
                                f"is damaged: run the pipeline again")


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
        figures = render_figures(results, tmp) if matplotlib_available() else None
        (tmp / "index.html").write_text(render_html(results, figures), encoding="utf-8")
        final = run_dir / REPORT_DIR
        swap_into_place(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    index = final / "index.html"
    if not quiet:
        extra = "" if figures is not None else " (no figures: matplotlib is not installed)"
        print(f"report written to {index}{extra}")
    return index


def matplotlib_available() -> bool:
    """Whether matplotlib (the optional extra ``plot``) can be imported."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        return False
    return True


# ---- figures ----------------------------------------------------------------------------------------

def render_figures(results: Mapping, out_dir: Path) -> dict[str, list[tuple[str, str]]]:
    """Draw every figure the data allows into ``out_dir`` as PNG.

    Returns {section: [(file name, caption)]} with sections "metrics", "convergence", and
    "weights:<i>" / "path:<i>" for solver i.
    """
    solvers = results.get("solvers") or []
    ok = [s for s in solvers if _ok(s)]
    figures: dict[str, list[tuple[str, str]]] = {}
    metric = plots.first_test_metric(ok)
    if metric:
        _save(plots.metrics(ok, metric=metric), out_dir, "metrics.png", figures, "metrics",
              f"{metric} per solver (lighter: the train counterpart)")
    histories = {str(s.get("name")): s["history"] for s in ok if isinstance(s.get("history"), list)}
    tolerances = {str(s.get("name")): (s.get("params") or {}).get("tol") for s in ok}
    if _any_value(histories, "gap"):
        _save(plots.duality_gap(histories, tolerances=tolerances), out_dir, "gap.png", figures,
              "convergence", "relative duality gap versus wall time (dashed: the solver's tolerance)")
    if _any_value(histories, "n_active"):
        _save(plots.active_set(histories), out_dir, "active.png", figures, "convergence",
              "number of kernels with non-zero weight per outer iteration")
    for i, s in enumerate(solvers):
        name = str(s.get("name"))
        if not _ok(s):
            continue
        if s.get("kernels"):
            _save(plots.kernel_weights(s["kernels"], title=f"{name}: kernel weights"), out_dir,
                  f"weights-{i:02d}-{_slug(name)}.png", figures, f"weights:{i}",
                  f"{name}: weights of the kept kernels, grouped by family, labelled parameters [features]")
        if isinstance(s.get("path"), dict) and s["path"].get("kernel_names") and s["path"].get("values"):
            _save(plots.regularisation_path(s["path"]), out_dir, f"path-{i:02d}-{_slug(name)}.png",
                  figures, f"path:{i}", f"{name}: kernel weights along the regularisation path")
    return figures


def _ok(solver: Mapping) -> bool:
    """Whether a solver entry ran to the end (a missing status counts as "ok")."""
    return solver.get("status", "ok") == "ok"


def _save(ax, out_dir: Path, file_name: str, figures: dict, section: str, caption: str) -> None:
    """Save the figure of ``ax`` as ``out_dir/file_name`` and list it under ``section``."""
    ax.figure.savefig(out_dir / file_name, dpi=DPI)
    figures.setdefault(section, []).append((file_name, caption))


def _any_value(histories: Mapping[str, list], key: str) -> bool:
    """Whether some history entry has a numeric ``key``."""
    return any(isinstance(e, dict) and plots.number(e.get(key)) is not None
               for h in histories.values() for e in h)


def _slug(name: str) -> str:
    """A file-name-safe fragment of a solver name (the index in front keeps names unique)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._")[:40] or "solver"


# ---- HTML -----------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.failed td { background: #fdecea; } .error { color: #a00; white-space: pre-wrap; }
.not-converged { color: #a00; font-weight: bold; }
.meta, .note, figcaption { color: #555; font-size: .9em; } .note { background: #fff8e1; padding: .6em; }
figure { margin: 1em 0; } img { max-width: 100%; height: auto; border: 1px solid #eee; }
pre { background: #f7f7f7; padding: .6em; overflow-x: auto; font-size: .85em; }
""".strip()


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
    """``k=v, k=v`` for a params dict (values via :func:`fmt`)."""
    if not isinstance(params, Mapping):
        return fmt(params)
    return ", ".join(f"{k}={fmt(v)}" for k, v in params.items())


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], row_classes: Sequence[str] | None = None) -> str:
    """An HTML table; ``header`` is escaped here, ``rows`` cells must already be HTML (``<td>...``)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join((f'<tr class="{_e(c)}">' if c else "<tr>") + "".join(r) + "</tr>"
                   for r, c in zip(rows, row_classes or [""] * len(rows)))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _td(value: Any, numeric: bool = False, text: str | None = None) -> str:
    """One escaped table cell; ``text`` overrides the formatted ``value``."""
    cls = ' class="num"' if numeric else ""
    return f"<td{cls}>{_e(fmt(value) if text is None else text)}</td>"


def _key_values(title: str, data: Any, bytes_keys: Sequence[str] = ()) -> str:
    """A two-column table of a results.json section (a dict), or a line saying it was not recorded."""
    if not isinstance(data, Mapping) or not data:
        return f"<h3>{_e(title)}</h3><p class=\"meta\">not recorded</p>"
    rows = [[f"<th>{_e(k)}</th>", _td(v, text=fmt_bytes(v) if k in bytes_keys else _section_value(v))]
            for k, v in data.items()]
    body = "".join(f"<tr>{''.join(r)}</tr>" for r in rows)
    return f"<h3>{_e(title)}</h3><table><tbody>{body}</tbody></table>"


def _section_value(value: Any) -> str:
    """Dicts of counts (e.g. bank families) as ``a: 1, b: 2``; anything else via :func:`fmt`."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {fmt(v)}" for k, v in value.items())
    return fmt(value)


def render_html(results: Mapping, figures: Mapping[str, list[tuple[str, str]]] | None) -> str:
    """The whole report page. ``figures`` from :func:`render_figures`, or None without matplotlib."""
    pipeline = results.get("pipeline") if isinstance(results.get("pipeline"), Mapping) else {}
    name = str(pipeline.get("name") or "unnamed pipeline")
    solvers = results.get("solvers") or []
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>mklscale report: {_e(name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>mklscale report: {_e(name)}</h1>",
        _run_summary(results, pipeline),
        _no_plots_note() if figures is None else "",
        "<h2>Data and kernel bank</h2>",
        _key_values("Dataset", results.get("dataset")),
        _key_values("Kernel bank", results.get("bank")),
        "<h2>Solvers</h2>", _metrics_table(solvers), _figures_html(figures, "metrics"),
        _convergence_section(figures),
        "<h2>Kept kernels</h2>", *(_solver_kernels(i, s, figures) for i, s in enumerate(solvers)),
        _paths_section(solvers, figures),
        _environment(results, pipeline),
        f'<p class="meta">generated by mklscale {_e(__version__)} on '
        f"{_e(datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'))}</p>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def _run_summary(results: Mapping, pipeline: Mapping) -> str:
    """One line: pipeline file, start, end, wall time, version of mklscale that ran it."""
    items = [("pipeline file", pipeline.get("path")), ("started", results.get("started")),
             ("finished", results.get("finished")), ("wall time (s)", results.get("seconds")),
             ("mklscale", results.get("mklscale_version"))]
    text = " · ".join(f"{_e(k)}: {_e(fmt(v))}" for k, v in items if v is not None)
    return f'<p class="meta">{text}</p>' if text else ""


def _no_plots_note() -> str:
    return ('<p class="note">matplotlib is not installed, so this report has tables but no figures. '
            "Install the plot extra (<code>pip install 'mklscale[plot]'</code>) and run "
            "<code>mklscale report RUN_DIR</code> again.</p>")


def _metric_keys(solvers: Sequence[Mapping]) -> list[str]:
    """All metric names the solvers report: test_* first, then train_*, then the rest, each sorted."""
    keys = {str(k) for s in solvers if isinstance(s.get("metrics"), Mapping) for k in s["metrics"]}
    return sorted(keys, key=lambda k: (not k.startswith("test_"), not k.startswith("train_"), k))


def _metrics_table(solvers: Sequence[Mapping]) -> str:
    """One row per solver: name, algorithm, params, metrics, kernels, passes, bytes, time, convergence, status."""
    if not solvers:
        return '<p class="meta">no solver was run</p>'
    metric_keys = _metric_keys(solvers)
    header = ["solver", "algorithm", "params", *metric_keys, "active kernels", "passes", "bytes read",
              "seconds", "converged", "gap", "status"]
    rows, classes = [], []
    for s in solvers:
        metrics = s.get("metrics") if isinstance(s.get("metrics"), Mapping) else {}
        failed = not _ok(s)
        status = f"{s.get('status', 'ok')}" + (f": {s.get('error')}" if s.get("error") else "")
        rows.append([
            _td(s.get("name")), _td(s.get("solver")), _td(None, text=_params_text(s.get("params") or {})),
            *(_td(metrics.get(k), numeric=True) for k in metric_keys),
            _td(s.get("n_active"), numeric=True), _td(s.get("passes"), numeric=True),
            _td(None, numeric=True, text=fmt_bytes(s.get("bytes_read"))), _td(s.get("seconds"), numeric=True),
            _converged_cell(s), _td(s.get("gap"), numeric=True),
            f'<td class="error">{_e(status)}</td>' if failed else _td(status),
        ])
        classes.append("failed" if failed else "")
    return _table(header, rows, classes) + _convergence_warnings(solvers)


#: the flag of a solver entry with converged false
NOT_CONVERGED = "NOT CONVERGED"


def _not_converged(solver: Mapping) -> bool:
    """Whether a solver entry that ran to the end says it did not converge (converged is false)."""
    return _ok(solver) and solver.get("converged") is False


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


def _figures_html(figures: Mapping | None, section: str) -> str:
    """The <figure> elements of one section (empty when there are none)."""
    return "".join(f'<figure><img src="{_e(file)}" alt="{_e(caption)}"><figcaption>{_e(caption)}</figcaption>'
                   f"</figure>" for file, caption in (figures or {}).get(section, []))


def _convergence_section(figures: Mapping | None) -> str:
    body = _figures_html(figures, "convergence")
    return f"<h2>Convergence</h2>{body}" if body else ""


def _solver_kernels(i: int, solver: Mapping, figures: Mapping | None) -> str:
    """The weights figure and the kept-kernel table (heaviest first) of solver ``i``."""
    flag = f' <span class="not-converged">{NOT_CONVERGED}</span>' if _not_converged(solver) else ""
    title = f"<h3>{_e(solver.get('name'))} <small>({_e(fmt(solver.get('solver')))})</small>{flag}</h3>"
    if not _ok(solver):
        return f'{title}<p class="error">failed: {_e(fmt(solver.get("error")))}</p>'
    kernels = [k for k in solver.get("kernels") or [] if isinstance(k, Mapping)]
    if not kernels:
        return f'{title}<p class="meta">no kernel kept</p>'
    kernels = sorted(kernels, key=lambda k: -abs(plots.number(k.get("weight")) or 0.0))
    with_head = any(k.get("head") is not None for k in kernels)
    header = ["name", "family", "params", "features", "weight"] + (["head"] if with_head else [])
    rows = [[_td(k.get("name")), _td(k.get("family")), _td(None, text=_params_text(k.get("params") or {})),
             _td(None, text="all" if k.get("features") is None else fmt(k.get("features"))),
             _td(k.get("weight"), numeric=True)] + ([_td(k.get("head"))] if with_head else [])
            for k in kernels[:MAX_KERNEL_ROWS]]
    cut = (f'<p class="meta">the {MAX_KERNEL_ROWS} heaviest of {len(kernels)} kept kernels are listed</p>'
           if len(kernels) > MAX_KERNEL_ROWS else "")
    return title + _figures_html(figures, f"weights:{i}") + _table(header, rows) + cut


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
    """Cluster and machine tables and the pipeline configuration as JSON (collapsed)."""
    config = pipeline.get("config")
    config_html = ("<details><summary>pipeline configuration</summary><pre>"
                   f"{_e(json.dumps(config, indent=2, sort_keys=True))}</pre></details>" if config else "")
    return ("<h2>Environment</h2>" + _key_values("Cluster", results.get("cluster"))
            + _key_values("Machine", results.get("machine"), bytes_keys=("memory", "memory_bytes"))
            + config_html)
