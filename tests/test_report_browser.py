"""The report in a real browser: headless Chromium renders ``report/index.html`` at desktop sizes.

Chromium is Debian's package (``.ci/setup_chromium.sh`` installs it; ``CHROMIUM`` names another
binary), driven through the ``playwright`` package of the ``test`` extra with that binary (no
``playwright install``), a fresh profile folder and no background networking. Without either the
test skips, saying what to install. Full-page screenshots are saved in the test's tmp folder.

The results hold six weighting solvers (the real runs of tests/_report_results.py under more
names, weights rescaled), a long failure message, model selection, confusion matrices, a feature
stability section and the uniform baseline: what made the page overflow its column before.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest

from _report_results import DESCRIPTION, build_results, stability_record

from mklscale.report import write_report

#: no sandbox (root in CI), no GPU, nothing that phones home (the network is closed)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]
SIZES = [(1366, 900), (1920, 1080)]


def _chromium() -> str | None:
    """The Chromium binary: $CHROMIUM, else chromium on PATH, else Debian's /usr/bin/chromium."""
    for candidate in (os.environ.get("CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium context with a fresh profile (skips without playwright or Chromium)."""
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed: pip install -e '.[test]'")
    executable = _chromium()
    if executable is None:
        pytest.skip("no Chromium binary: run .ci/setup_chromium.sh as root (Debian's chromium package) "
                    "or set CHROMIUM=/path/to/chromium")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def crowded_report(tmp_path_factory):
    """The report of a run with six weighting solvers, model selection and a long failure message."""
    run = tmp_path_factory.mktemp("run")
    results = build_results(run)
    spicy, ovr, pfbs, uniform, broken = results["solvers"]
    extra = []
    for i, (base, scale) in enumerate([(spicy, 1000.0), (pfbs, 0.01), (spicy, 3.0)]):
        twin = copy.deepcopy(base)
        twin["name"] = f"{base['name']}_variant_with_a_long_name_{i}"
        for k in twin["kernels"]:
            k["weight"] *= scale
        extra.append(twin)
    spicy["cv"] = {"parameter": "C", "grid": [0.01, 0.1, 1.0, 10.0], "mean": [0.6, 0.8, 0.85, 0.84],
                   "std": [0.05, 0.04, 0.03, 0.02], "chosen": 1.0, "folds": 5, "metric": "accuracy"}
    spicy["confusion_matrix"] = {"labels": [-1.0, 1.0], "counts": [[12, 3], [2, 23]]}
    spicy["feature_stability"] = stability_record(run, results)
    results["dataset"]["null_model"] = {"kind": "majority_class", "label": 1, "test_accuracy": 0.625}
    broken["error"] = "InvalidInputError: " + "a very long message without spaces_" * 12
    results["solvers"] = [spicy, ovr, pfbs, *extra, uniform, broken]
    (run / "results.json").write_text(json.dumps(results))
    return write_report(run, quiet=True)


@pytest.mark.parametrize("width, height", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_report_renders_within_the_page_in_chromium(browser, crowded_report, tmp_path, width, height):
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": height})
    failed = []
    page.on("requestfailed", lambda request: failed.append(request.url))
    page.goto(crowded_report.as_uri())
    page.wait_for_load_state("load")

    images = page.evaluate("Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])")
    # metrics, model selection, convergence, heatmap, 6 weights (none for uniform), a feature stability figure,
    # 2 paths (pfbs and its twin)
    assert len(images) == 13
    assert all(complete and natural > 0 for _, complete, natural in images), images
    assert failed == []

    # no horizontal scrolling of the page, nothing sticking out of the page column, no table that
    # needs its own scroll bar at desktop size
    assert page.evaluate("document.documentElement.scrollWidth") <= page.evaluate("window.innerWidth")
    sticking_out = page.evaluate("""() => {
        const column = document.body.getBoundingClientRect().right;
        return Array.from(document.querySelectorAll('body > *, body > * > *, .wrap, figure, img'))
            .filter(e => e.getBoundingClientRect().right > column + 0.5)
            .map(e => e.tagName + ': ' + (e.textContent || e.getAttribute('src') || '').slice(0, 60)); }""")
    assert sticking_out == []
    scrolling = page.evaluate("""Array.from(document.querySelectorAll('.wrap'))
        .filter(w => w.scrollWidth > w.clientWidth + 1).map(w => w.textContent.slice(0, 60))""")
    assert scrolling == []

    # the description is the first thing under the title, on the first screen
    first = page.evaluate("document.querySelector('h1').nextElementSibling.outerHTML")
    assert first == f'<p class="description">{DESCRIPTION}</p>'
    assert page.evaluate("document.querySelector('p.description').getBoundingClientRect().bottom") < height

    # a static folder: nothing links out (the run's Dask dashboard is gone once the run ended)
    refs = page.evaluate("Array.from(document.querySelectorAll('[href], [src]'))"
                         ".map(e => e.getAttribute('href') || e.getAttribute('src'))")
    assert refs and all("/" not in r and ":" not in r for r in refs), refs
    assert "dashboard" not in page.content()

    shot = tmp_path / f"report-{width}x{height}.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 50_000
    page.close()
