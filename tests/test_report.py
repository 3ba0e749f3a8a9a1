"""``mklscale report``: the HTML report and its PNG figures, from a results.json of real solver runs.

The results.json is built the way ``mklscale run`` writes it, by tests/_report_results.py.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from _report_results import DESCRIPTION, build_results, stability_record

from mklscale.errors import InvalidInputError
from mklscale.report import write_report

INJECTION = '<script>alert("x")</script>&'
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---- fixtures --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run folder with the results.json of real solver runs (built once for the module)."""
    path = tmp_path_factory.mktemp("run")
    build_results(path)
    return path


@pytest.fixture
def results(run_dir):
    return json.loads((run_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def report_index(run_dir):
    """The report of ``run_dir`` (written once for the module)."""
    return write_report(run_dir, quiet=True)


@pytest.fixture
def small_results(results):
    """``results`` with only the first solver (fewer figures to draw: faster tests)."""
    return {**results, "solvers": results["solvers"][:1]}


def _copy_run(results: dict, tmp_path):
    """A fresh run folder holding ``results`` as results.json."""
    (tmp_path / "results.json").write_text(json.dumps(results))
    return tmp_path


def _pngs(report_dir) -> list:
    return sorted(p.name for p in report_dir.glob("*.png"))


def _leftovers(run_dir) -> list:
    """Temporary or moved-aside report folders a report run must not leave behind."""
    return sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".report"))


# ---- the report ------------------------------------------------------------------------------------

def test_report_has_the_tables_and_a_figure_per_section(run_dir, report_index, results):
    import html

    index = report_index
    assert index == run_dir / "report" / "index.html" and index.is_file()
    page = index.read_text()
    assert "<title>mklscale report: report-test</title>" in page
    for solver in results["solvers"]:
        assert f"<td>{html.escape(solver['name'])}</td>" in page
    kept = results["solvers"][0]["kernels"][0]
    assert f"<td>{html.escape(kept['name'])}</td>" in page
    assert "breast_cancer" in page and "gaussian: 17, polynomial: 4" in page
    assert '<tr class="failed">' in page and "C must be &gt; 0 &lt;and&gt; finite" in page
    assert f"{results['solvers'][0]['metrics']['test_accuracy']:.4g}" in page
    assert _pngs(index.parent) == ["convergence.png", "metrics.png", "path-02-pfbs_path.png", "weights-00-spicy_l1.png",
                                   "weights-01-spicy_ovr.png", "weights-02-pfbs_path.png", "weights-heatmap.png"]
    assert sorted(re.findall(r'<img src="([^"]+)"', page)) == _pngs(index.parent)
    # static, nothing fetched, and no link to the run's Dask dashboard (gone once the run ended)
    assert "<script" not in page and "http" not in page.split("</style>")[1] and "dashboard" not in page
    assert "href=" not in page
    assert _leftovers(run_dir) == []


def test_description_comes_first_and_features_are_named(report_index, results):
    page = report_index.read_text()
    body = page.split("<body>")[1]
    assert re.match(rf'\s*<h1>mklscale report: report-test</h1>\s*<p class="description">{re.escape(DESCRIPTION)}</p>',
                    body)
    # a kernel on feature 7 is named by the dataset's column name in the kernel tables
    assert "<td>gaussian(width=4)[mean concave points]</td>" in page and "<td>mean concave points</td>" in page
    assert "<td>gaussian(width=4)[7]</td>" not in page


def test_weights_are_shares_and_the_uniform_baseline_is_one_line(report_index, results):
    """Every weighting solver's shares sum to 100 % (whatever the scale of its weights); the uniform
    baseline is summarised in one line: no figure, no table of its kernels."""
    from mklscale import plots

    page = report_index.read_text()
    M = len(results["solvers"][3]["kernels"])
    assert (f"<li><b>uniform</b> (uniform): the same weight on each of its {M} kernels "
            f"({100 / M:.3g} % each)</li>") in page
    assert "<h3>uniform" not in page and "weights-03-uniform.png" not in page
    assert page.count(f"<td>{1 / M:.4g}</td>") == 0
    for solver in results["solvers"][:3]:
        shares = plots.weight_shares(solver["kernels"])
        heads = {k["head"] for k in solver["kernels"]}
        assert sum(shares) == pytest.approx(len(heads))           # 1 per head
    weighting = {s["name"]: s["kernels"] for s in results["solvers"][:3]}
    ax = plots.weight_heatmap(weighting, feature_names=results["dataset"]["feature_names"])
    grid = np.ma.filled(ax.images[0].get_array(), 0.0)
    assert grid.shape[1] == 3 and np.allclose(grid.sum(axis=0), 100.0)   # every kept kernel shown: 100 %
    assert [t.get_text() for t in ax.get_xticklabels()] == list(weighting)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "gaussian width=4 [mean concave points]" in labels
    ax = plots.kernel_weights(results["solvers"][0]["kernels"], feature_names=results["dataset"]["feature_names"])
    assert sum(p.get_width() for p in ax.patches) == pytest.approx(100.0)
    assert ax.get_xlabel() == "share of the total weight (%)"


def test_figures_are_valid_non_blank_pngs(report_index):
    from matplotlib.image import imread

    pngs = list(report_index.parent.glob("*.png"))
    assert len(pngs) == 7
    for png in pngs:
        data = png.read_bytes()
        assert data[:8] == PNG_MAGIC, png.name
        assert len(data) > 5000, png.name
        pixels = imread(png)[..., :3]
        assert pixels.shape[0] > 150 and pixels.shape[1] > 600, png.name
        assert pixels.std() > 0.05, png.name                      # not a blank canvas
        assert (pixels.std(axis=2) > 0.1).mean() > 0.005, png.name  # coloured lines/bars were drawn


def test_html_injection_in_results_is_escaped(small_results, tmp_path, capsys):
    results = small_results
    results["solvers"][0]["name"] = INJECTION
    results["solvers"][0]["kernels"][0]["name"] = INJECTION
    results["pipeline"]["name"] = INJECTION
    index = write_report(_copy_run(results, tmp_path))
    assert f"report written to {index}" in capsys.readouterr().out
    page = index.read_text()
    assert "<script>" not in page and "alert(&quot;x&quot;)" in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" in page
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+\.png", p) for p in _pngs(tmp_path / "report"))


def test_second_run_replaces_the_report_whole(small_results, tmp_path, monkeypatch):
    from mklscale import plots

    results = small_results
    run = _copy_run(results, tmp_path)
    write_report(run, quiet=True)
    (run / "report" / "stale.txt").write_text("from the first report")
    results["pipeline"]["name"] = "second-run"
    _copy_run(results, tmp_path)
    page = write_report(run, quiet=True).read_text()
    assert "second-run" in page and not (run / "report" / "stale.txt").exists()
    assert _leftovers(run) == []

    # a failure while drawing leaves the previous report exactly as it was, and no temporary folder
    def broken(*args, **kwargs):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(plots, "kernel_weights", broken)      # the last figure drawn
    results["pipeline"]["name"] = "third-run"
    _copy_run(results, tmp_path)
    with pytest.raises(RuntimeError, match="drawing failed"):
        write_report(run, quiet=True)
    assert "second-run" in (run / "report" / "index.html").read_text()
    assert _pngs(run / "report") == ["convergence.png", "metrics.png", "weights-00-spicy_l1.png"]
    assert _leftovers(run) == []


@pytest.mark.parametrize("content, message", [
    (None, r"results\.json not found.*mklscale run"),
    ("{not json", r"results\.json is not valid JSON.*run the pipeline again"),
    ('{"solvers": []}', r"results\.json is not an mklscale results file"),
    ('{"schema_version": 2, "solvers": []}', r"schema_version 2.*upgrade mklscale"),
    ('{"schema_version": 1, "solvers": {"a": 1}}', r"'solvers' must be a list"),
])
def test_missing_or_bad_results_json_is_a_clear_error(tmp_path, content, message):
    if content is not None:
        (tmp_path / "results.json").write_text(content)
    with pytest.raises(InvalidInputError, match=message) as info:
        write_report(tmp_path, quiet=True)
    assert str(tmp_path / "results.json") in str(info.value)
    assert not (tmp_path / "report").exists() and _leftovers(tmp_path) == []


def test_missing_run_folder_is_a_clear_error(tmp_path):
    with pytest.raises(InvalidInputError, match="does not exist"):
        write_report(tmp_path / "nowhere")


def test_missing_optional_fields_still_give_a_report(tmp_path):
    results = {"schema_version": 1, "solvers": [
        {"name": "bare"},
        {"name": "no_gap", "status": "ok", "history": [{"iteration": 1, "n_active": 3, "seconds": 0.1},
                                                        {"iteration": 2, "n_active": 2}],
         "kernels": [{"name": "linear()[all]", "family": "linear", "weight": "inf"},
                     {"name": "k2", "weight": 0.5}], "path": {"parameter": "tau", "values": []}},
    ]}
    page = write_report(_copy_run(results, tmp_path), quiet=True).read_text()
    assert "mklscale report: unnamed pipeline" in page and "not recorded" in page
    assert "<td>bare</td>" in page and "<td>k2</td>" in page
    assert "no path values recorded" in page
    # no gap recorded and an empty path: no figure for either
    assert _pngs(tmp_path / "report") == ["convergence.png", "weights-01-no_gap.png"]


def test_unconverged_solver_is_flagged_next_to_its_name(tmp_path):
    """converged false: the flag in the converged column (warning text as tooltip), next to the solver's
    name in the kept-kernels section and, with what to change, in a list under the solver table."""
    from mklscale.report import render_html

    advice = "MKLClassifier: solver 'smo' did not converge: ... raise max_steps (now 5) <b>"
    results = {"schema_version": 1, "solvers": [
        {"name": "stuck", "solver": "smo", "status": "ok", "converged": False, "gap": 0.4,
         "convergence_warning": advice, "kernels": [{"name": "k1", "weight": 1.0}]},
        {"name": "fine", "solver": "uniform", "status": "ok", "converged": True, "gap": 0.0,
         "kernels": [{"name": "k1", "weight": 1.0}]},
        {"name": "broken", "solver": "spicy", "status": "failed", "converged": False, "error": "x"},
    ]}
    page = render_html(results, None)
    escaped = "MKLClassifier: solver &#x27;smo&#x27; did not converge: ... raise max_steps (now 5) &lt;b&gt;"
    assert f'<td class="not-converged" title="{escaped}">no: NOT CONVERGED</td>' in page
    assert '<h3>stuck <small>(smo)</small> <span class="not-converged">NOT CONVERGED</span></h3>' in page
    assert f"<li><b>stuck</b>: NOT CONVERGED &mdash; {escaped}</li>" in page
    assert '<td>stuck <span class="not-converged">NOT CONVERGED</span></td>' in page    # in the metrics table
    assert page.count("NOT CONVERGED") == 4  # not for the converged solver nor the failed one
    assert "<h3>fine <small>(uniform)</small></h3>" in page


def test_feature_stability_gets_a_section_a_figure_and_a_table(run_dir, small_results, tmp_path):
    """A solver with a feature_stability record (real refits on the run's bank): the Feature selection
    section, its figure (bars of the frequencies, the most often selected feature on top), the table of
    features by name, and the note that kernels over all features select every feature."""
    from matplotlib.image import imread

    from mklscale import plots

    record = stability_record(run_dir, small_results)
    assert all(0.0 <= f <= 1.0 for f in record["frequency"]) and record["fits"] == [3]
    small_results["solvers"][0]["feature_stability"] = record
    index = write_report(_copy_run(small_results, tmp_path), quiet=True)
    page = index.read_text()
    assert "<h2>Feature selection</h2>" in page and 'src="stability-00-spicy_l1.png"' in page
    assert f"<td>{record['names'][0]}</td>" in page
    assert ("kept a kernel over all features" in page) == (sum(record["all_feature_fits"]) > 0)
    pixels = imread(index.parent / "stability-00-spicy_l1.png")[..., :3]
    assert pixels.shape[0] > 150 and pixels.shape[1] > 600 and (pixels.std(axis=2) > 0.1).mean() > 0.005
    ax = plots.feature_stability(record, top=5)
    bars = [p.get_width() for p in ax.patches]
    assert bars == pytest.approx(record["frequency"][:len(bars)]) and 0 < len(bars) <= 5
    assert [t.get_text() for t in ax.get_yticklabels()] == record["names"][:len(bars)]


def test_stability_over_several_values_is_a_heatmap_and_a_failure_is_shown(run_dir, small_results):
    from mklscale import plots
    from mklscale.report import render_html

    record = stability_record(run_dir, small_results, values=(1.0, 0.3), n_resamples=2)
    ax = plots.feature_stability(record)
    grid = np.asarray(ax.images[0].get_array())
    assert grid.shape == (min(len(record["names"]), 30), 2) and np.all((grid >= 0) & (grid <= 1))
    assert [float(t.get_text()) for t in ax.get_xticklabels()] == pytest.approx(record["values"], rel=1e-2)
    assert plots.feature_stability({"names": []}).texts[0].get_text() == "no feature was selected"
    failed = {**small_results["solvers"][0], "feature_stability": {"error": "InvalidInputError: <no rows>"}}
    page = render_html({**small_results, "solvers": [failed]}, None)
    assert "feature stability failed: InvalidInputError: &lt;no rows&gt;" in page


def test_matplotlib_is_a_runtime_dependency():
    """The report (the main job's output) has figures on a plain install: no extra needed."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert any(re.match(r"matplotlib\b", d) for d in project["dependencies"])


CLASSIFICATION_EXTRAS = {
    "metrics": {"train_accuracy": 0.99, "test_accuracy": 0.62, "test_balanced_accuracy": 0.5, "test_roc_auc": 0.71,
                "train_balanced_accuracy": 0.98, "train_roc_auc": 0.99},
    "confusion_matrix": {"labels": [-1.0, 1.0], "counts": [[0, 15], [0, 25]]},
    # the fields of docs/design.md, "Model selection and the null model"
    "cv": {"key": "C", "parameter": "C", "requested": "auto", "grid": [0.01, 0.1, 1.0, 10.0],
           "mean": [0.6, 0.8, 0.85, 0.84], "std": [0.05, 0.04, 0.031, 0.02], "metric": "accuracy", "folds": 5,
           "seed": 0, "chosen": 1.0},
    "null_model": {"metric": "test_accuracy", "solver": 0.62, "null": 0.625, "at_least_null": False},
    "constant_predictor": {"constant": True, "value": 1.0},
}
NULL_CLASSIFIER = {"kind": "majority_class", "label": 1.0, "train_accuracy": 0.63, "test_accuracy": 0.625}


def test_classification_metrics_model_selection_and_a_constant_predictor(tmp_path):
    """Balanced accuracy, ROC AUC, the confusion matrix, the CV spread of the chosen value, the
    majority-class rate and the constant-predictor flag are shown when results.json has them."""
    results = {"schema_version": 1, "dataset": {"task": "classification", "classes": [-1.0, 1.0],
                                                "null_model": NULL_CLASSIFIER}, "solvers": [
        {"name": "picked", "solver": "spicy", "status": "ok", "converged": True,
         "kernels": [{"name": "a", "weight": 2.0}, {"name": "b", "weight": 6.0}], **CLASSIFICATION_EXTRAS}]}
    index = write_report(_copy_run(results, tmp_path), quiet=True)
    page = index.read_text()
    for header in ("test balanced accuracy", "test ROC AUC", "test accuracy", "CV score (mean ± std)",
                   "train balanced accuracy"):
        assert f"<th>{header}</th>" in page, header
    assert '<td class="num">0.85 ± 0.031</td>' in page
    assert "C = 1 chosen, 5 folds" in page and "<td>chosen</td>" in page
    assert ('<tr><th>-1</th><td class="num hit">0</td><td class="num">15</td></tr>'
            '<tr><th>1</th><td class="num">0</td><td class="num hit">25</td></tr>') in page
    assert ("null model: always predicting the training majority class 1 scores test accuracy 0.625 "
            "(the majority-class rate)") in page
    assert ('<td>picked <span class="constant">CONSTANT PREDICTOR</span> '
            '<span class="constant">BELOW THE NULL MODEL</span></td>') in page
    assert '<span class="constant">CONSTANT PREDICTOR</span>: picked predicts 1 for every row' in page
    assert _pngs(tmp_path / "report") == ["metrics.png", "model-selection.png", "weights-00-picked.png"]
    from mklscale import plots

    fig = plots.model_selection({"picked": CLASSIFICATION_EXTRAS["cv"]})
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_title() == "picked"
    assert [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"] == [1.0]


def test_regression_shows_r2_rmse_and_the_mean_predictor_error(tmp_path):
    null = {"kind": "mean", "value": 151.2, "train_r2": 0.0, "test_r2": -0.01, "train_rmse": 77.0, "test_rmse": 77.5}
    results = {"schema_version": 1, "dataset": {"task": "regression", "null_model": null}, "solvers": [
        {"name": "ridge", "solver": "pfbs", "status": "ok",
         "metrics": {"train_r2": 0.6, "test_r2": 0.45, "train_rmse": 50.1, "test_rmse": 57.25},
         "null_model": {"metric": "test_r2", "solver": 0.45, "null": -0.01, "at_least_null": True},
         "constant_predictor": {"constant": False, "value": None}}]}
    page = write_report(_copy_run(results, tmp_path), quiet=True).read_text()
    assert "<th>test R²</th><th>test RMSE</th>" in page and '<td class="num">57.25</td>' in page
    assert "predicting the training mean 151.2 for every row scores test R² -0.01, test RMSE 77.5" in page
    assert "CONSTANT PREDICTOR" not in page and "BELOW THE NULL MODEL" not in page


# ---- the figures, from plain data ------------------------------------------------------------------

def test_convergence_figures_draw_one_line_per_solver_and_head(results):
    from mklscale import plots

    histories = {s["name"]: s["history"] for s in results["solvers"][:3]}
    ax = plots.duality_gap(histories)
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "spicy_l1", "spicy_ovr [1]", "spicy_ovr [-1]", "pfbs_path"]
    assert all(np.all(line.get_ydata() > 0) for line in ax.get_lines())
    ax = plots.active_set(histories)
    assert len(ax.get_lines()) == 4
    n_active = [e["n_active"] for e in results["solvers"][0]["history"]]
    np.testing.assert_array_equal(ax.get_lines()[0].get_ydata(), n_active)
    fig = plots.convergence_panels(histories, {"spicy_l1": 1e-4}, ncols=2)   # small multiples
    assert len(fig.axes) == 6 and [a.get_title() for a in fig.axes[::2]] == list(histories)
    assert [len(a.get_lines()) for a in fig.axes] == [1 + 1, 1, 2, 2, 1, 1]   # spicy_l1: gap + its tolerance


def test_log_axes_skip_zero_negative_and_non_finite_values():
    from mklscale import plots

    history = [{"seconds": t, "gap": g} for t, g in
               [(0.1, "inf"), (0.2, 0.5), (0.3, 0.0), (0.4, "nan"), (0.5, -1e-3), (0.6, 1e-4), ("inf", 1e-5)]]
    ax = plots.duality_gap({"s": history})
    np.testing.assert_array_equal(ax.get_lines()[0].get_xdata(), [0.2, 0.6])
    ax = plots.duality_gap({"s": [{"seconds": 1.0, "gap": 0.0}]})
    assert not ax.get_lines() and "no duality gap recorded" in ax.texts[0].get_text()
    path = {"parameter": "tau", "values": [1.0, 0.1, 0.0], "kernel_names": ["a"], "weights": [[0], [2], [3]]}
    ax = plots.regularisation_path(path)
    assert ax.get_xscale() == "log"
    np.testing.assert_array_equal(ax.get_lines()[0].get_xdata(), [1.0, 0.1])


def test_path_figure_has_a_line_per_ever_active_kernel(results):
    from mklscale import plots

    path = results["solvers"][2]["path"]
    ax = plots.regularisation_path(path)
    assert ax.get_xscale() == "log" and len(ax.get_lines()) == len(path["kernel_names"]) > 1
    assert {t.get_text() for t in ax.get_legend().get_texts()} == set(path["kernel_names"])
    ax = plots.regularisation_path(path, max_legend=3)
    assert len(ax.get_legend().get_texts()) == 3 and len(ax.get_lines()) == len(path["kernel_names"])


def test_weights_figure_groups_by_family_and_caps_the_rows(results):
    from mklscale import plots

    kernels = results["solvers"][2]["kernels"]
    ax = plots.kernel_weights(kernels)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(ax.patches) == len(labels) == len(kernels)
    families = [k["family"] for k in sorted(kernels, key=lambda k: labels.index(plots.kernel_label(k)))]
    assert families == sorted(families)                          # one block per family
    widths = [float(k["params"]["width"]) for k in kernels if k["family"] == "gaussian"]
    assert [float(lab.split("=")[1].split()[0]) for lab in labels[:len(widths)]] == sorted(widths)
    heaviest = max(kernels, key=lambda k: k["weight"])
    ax = plots.kernel_weights(kernels, max_kernels=3)
    assert len(ax.patches) == 3 and plots.kernel_label(heaviest) in [t.get_text() for t in ax.get_yticklabels()]
    assert f"{len(kernels)} kept, 3 largest shown" in ax.get_title()
    ovr = plots.kernel_weights(results["solvers"][1]["kernels"])
    assert len(ovr.patches) == 2 * len(ovr.get_yticklabels())   # one bar per head in each row


# ---- readable log axes (issue 28) ------------------------------------------------------------------

def _drawn_labels(axis) -> list:
    """The tick labels (major and minor) ``axis`` draws: non-empty, at a tick inside the view."""
    lo, hi = sorted(axis.get_view_interval())
    pairs = [*zip(axis.get_majorticklocs(), axis.get_majorticklabels()),
             *zip(axis.get_minorticklocs(), axis.get_minorticklabels())]
    return [t for loc, t in pairs if lo * (1 - 1e-9) <= loc <= hi * (1 + 1e-9) and t.get_visible() and t.get_text()]


def _overlapping_tick_labels(fig) -> list:
    """(axes title, label, label) of drawn tick labels whose boxes overlap, over every axis of ``fig``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    bad = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = _drawn_labels(axis)
            boxes = [t.get_window_extent(renderer) for t in labels]
            bad += [(ax.get_title(), a.get_text(), b.get_text()) for i, (a, p) in enumerate(zip(labels, boxes))
                    for b, q in zip(labels[i + 1:], boxes[i + 1:]) if p.overlaps(q)]
    return bad


def _labelled(axis) -> list[str]:
    return [t.get_text() for t in _drawn_labels(axis)]


@pytest.mark.parametrize("grid", [[2.1, 5.0, 8.0, 12.0, 25.0], [21.0, 66.0, 210.0, 660.0], [0.0031, 0.01, 0.031, 0.1],
                                  [1e-6, 1e-4, 1e-2, 1.0, 100.0], [0.0021, 0.005, 0.008, 0.012, 0.025]])
def test_log_axes_of_the_cv_figure_have_readable_labels(grid):
    """The CV panels' log axes label 2 to 5 ticks that do not overlap, whatever the grid's span (a span
    of about a decade used to label every minor tick: 2x10^1, 3x10^1, ... on top of each other)."""
    from mklscale import plots

    cv = {"parameter": "C", "grid": grid, "mean": np.linspace(0.6, 0.9, len(grid)).tolist(),
          "std": [0.02] * len(grid), "metric": "accuracy", "chosen": grid[1]}
    fig = plots.model_selection({"a": cv, "b": cv, "c": cv})
    assert _overlapping_tick_labels(fig) == []
    for ax in fig.axes:
        assert ax.get_xscale() == "log" and 2 <= len(_labelled(ax.xaxis)) <= plots.LOG_TICKS


def test_every_log_axis_of_the_report_has_readable_labels():
    from mklscale import plots

    history = [{"seconds": 0.1 * i, "gap": g, "iteration": i, "n_active": a}
               for i, (g, a) in enumerate([(5e-3, 1), (3e-3, 40), (2.2e-3, 300), (1.4e-3, 500), (1.1e-3, 480)], 1)]
    long = [{"seconds": 0.1 * i, "gap": 10.0 ** -i, "iteration": i, "n_active": 3} for i in range(1, 60)]
    fig = plots.convergence_panels({"narrow": history, "long": long, "short": long[:2]})
    path = {"parameter": "tau", "values": [0.31, 0.2, 0.12, 0.08, 0.05, 0.03], "kernel_names": ["a", "b"],
            "weights": [[0, 0], [1, 0], [2, 1], [3, 2], [4, 2], [5, 3]]}
    both = plots.active_set({"long": long, "short": long[:2], "narrow": history})   # 59 iterations against 2: log x
    axes = [*fig.axes, plots.regularisation_path(path), both]
    assert [a.get_yscale() for a in fig.axes[:2]] == ["log", "log"] and axes[-2].get_xscale() == "log"
    assert both.get_xscale() == "log" and both.get_yscale() == "log"
    for ax in axes:
        assert _overlapping_tick_labels(ax.figure) == []
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log":
                assert 2 <= len(_labelled(axis)) <= plots.LOG_TICKS, (ax.get_title(), _labelled(axis))
