"""Generate benchmarks/README.md from the recorded JSON results: no figure is typed by hand.

    python benchmarks/make_readme.py

Each benchmark has a renderer that turns its JSON into a markdown section; a missing result file
renders as "not recorded yet". The renderers, with the prose around their tables, live in
``readme_*.py`` by topic (the engine and platform, the solvers, the comparisons with peers, the
first hour, reliability); this file orders them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from readme_engine import (render_build, render_checkpoint, render_hosts_scaling, render_objstore,  # noqa: E402
                           render_pass, render_pass_big, render_scaling)
from readme_computed import (render_computed_lambda, render_computed_million, render_computed_pass,  # noqa: E402
                             render_computed_peer, render_computed_scale)
from readme_factor_fits import render_profile_bcd, render_profile_factor, render_skglm  # noqa: E402
from readme_first_hour import render_cv_path, render_defaults, render_quickstart  # noqa: E402
from readme_peers import (render_ab_fits, render_compare_versions, render_mutation, render_peers,  # noqa: E402
                          render_peers_factor)
from readme_reliability import render_read_integrity  # noqa: E402
from readme_solvers import (render_factor, render_lowrank_floor, render_pfbs, render_sgd_gcd,  # noqa: E402
                            render_smo_citi, render_smo_factor, render_spicy, render_spicy_newton, render_spicy_ooc,
                            render_spicy_uci)

RENDERERS: list[Callable[[], str]] = [render_quickstart, render_defaults, render_cv_path, render_read_integrity, render_build, render_pass, render_pass_big, render_spicy, render_spicy_uci,
                                      render_spicy_ooc, render_smo_citi, render_pfbs, render_sgd_gcd,
                                      render_peers, render_scaling, render_checkpoint, render_compare_versions,
                                      render_ab_fits, render_factor, render_lowrank_floor, render_spicy_newton,
                                      render_smo_factor, render_peers_factor, render_profile_factor, render_profile_bcd,
                                      render_skglm,
                                      render_objstore, render_mutation, render_computed_pass, render_computed_scale,
                                      render_computed_peer, render_computed_lambda, render_computed_million,
                                      render_hosts_scaling]

HEADER = """# Benchmarks

Every figure below is generated from the JSON files in `results/` by `python benchmarks/make_readme.py`;
re-run a benchmark, then that script, to update this page. Timings are medians on the machine
described in each section; performance is reported as ratios measured in the same run (ours versus
reading or writing the same bytes with numpy; ours versus a peer on the same bank), because the
machines are shared and noisy.

"""


def main() -> None:
    text = HEADER + "\n".join(render() for render in RENDERERS)
    (HERE / "README.md").write_text(text)
    print(f"wrote {HERE / 'README.md'}")


if __name__ == "__main__":
    main()
