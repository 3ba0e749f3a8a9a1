"""benchmarks/README.md sections of computed banks (issue 31; rendered by make_readme.py)."""

from __future__ import annotations

from readme_common import _load
from readme_common import machine_with_load as _machine
from readme_common import plain_table as _table


def render_computed_pass() -> str:
    title = "\n## A pass over computed kernels (`python benchmarks/bench_computed.py pass`)\n\n"
    r = _load("computed_pass.json")
    if r is None:
        return title + "not recorded yet\n"
    evals = r["evaluations_per_pass"]
    rows = [[f"{r['median_stored_s']:.3f}", f"{r['median_computed_s']:.3f}", f"{r['median_ratio']:.2f}",
             ", ".join(f"{x:.2f}" for x in r["ratios"]), f"{r['compute_floor_s']:.3f}",
             f"{evals / r['compute_floor_s'] / 1e9:.2f}", f"{r['exp_per_s_one_core'] / 1e9:.2f}"]]
    cached = "exp_f32_per_s_one_core_cached" in r
    if cached:
        rows[0] += [f"{r['exp_f32_per_s_one_core_cached'] / 1e9:.2f}", f"{r['numpy_exp_per_s_one_core_cached'] / 1e9:.2f}"]
    return (title +
            f"A `quad_forms` pass (one vector) over M = {r['M']} per_feature kernels (3 Gaussian widths and the linear "
            f"kernel on each of d = {r['d']} features) at n = {r['n']}: stored as a dense float32 bank "
            f"({r['stored_bytes'] / 1e9:.2f} GB, read through its mapping from the page cache) against computed "
            f"inside the tasks, {r['pairs']} pairs A B on {r['threads']} threads, seconds (medians) and each pair's "
            "ratio stored / computed (the computed pass's speed as a share of the stored one's; target >= 0.5). "
            f"The floor: computing every kernel once with no reduction on the same threads ({evals / 1e9:.2f} G "
            "kernel evaluations, the symmetric half"
            + ("; kernel arithmetic 3 computes float32 kernels on few features on whole rows, twice that, "
               "instead of mirroring" if cached else "")
            + "), and one core's numpy float32 exp rate"
            + (" (2^24 values); on 2^14 values in cache, one core's rate of the float32 Gaussian kernel's exp "
               "(kernel arithmetic 3: `_compute.exp_f32_scaled` with the argument's split and the scale) beside "
               "numpy's float32 exp" if cached else "")
            + f". Creation: stored {r['build_stored_s']:.1f} s, computed {r['build_computed_s']:.1f} s (statistics "
            "of every kernel, nothing written).\n\n"
            + _table(["stored (s)", "computed (s)", "median ratio", "ratios", "compute floor (s)",
                      "floor G evals/s", "exp G/s, one core"]
                     + (["kernel exp G/s, one core, cached", "numpy exp G/s, one core, cached"] if cached else []),
                     rows)
            + _cpu_line(r)
            + "\n\n" + _machine(r["machine"]) + "\n")


def _cpu_line(r: dict) -> str:
    """The passes' CPU seconds (recorded since arithmetic 3), medians: less disturbed by other load."""
    if "computed_cpu_s" not in r:
        return ""
    import statistics

    s, c = statistics.median(r["stored_cpu_s"]), statistics.median(r["computed_cpu_s"])
    return (f"\n\nCPU seconds of the process per pass (medians, all threads): stored {s:.3f}, computed {c:.3f} "
            f"(ratio {s / c:.2f}); the floor {r['compute_floor_cpu_s']:.3f}.")


def render_computed_scale() -> str:
    title = "\n## Feature selection on a computed bank (`python benchmarks/bench_computed.py scale`)\n\n"
    r = _load("computed_scale.json")
    if r is None:
        return title + "not recorded yet\n"
    rows = [[r["n"], r["d"], r["M"], f"{r['build_s']:.0f}", f"{r['fit_s']:.0f}", r["passes"], f"{r['gap']:.1e}",
             r["active"], f"{r['peak_rss_GB']:.2f}", ", ".join(map(str, r["relevant_ranks"]))]]
    return (title +
            "Synthetic data: 10 relevant features with nonlinear effects (sin, products of two, a square, cos, |x|) "
            "among d - 10 noise features; per_feature kernels on a computed bank; SpicyMKL (logistic) to tol 1e-3 at "
            f"C = {r['C'] / r['C_max']:.2f} C_max. Seconds for creating the bank (one pass computing every kernel's "
            "statistics) and for the fit, the fit's passes, its gap, the kernels it keeps, the peak resident set, "
            "and the rank of each relevant feature by the summed weight of its kernels (1 = first). The relevant features "
            "are, in order, sin(2 x0), x1 x2, x3^2, cos(x4), |x5|, x6 x7, sin(x8) x9: a product of two independent "
            "centred features (x1 x2, x6 x7) or sin(x8) x9 has no marginal effect in either feature, so no per-feature "
            "kernel can see them (a limit of every marginal method, HSIC Lasso's included; `interactions` kernels on "
            "candidate pairs can); the features with a marginal effect are the ones to rank first.\n\n"
            + _table(["n", "d", "M", "create (s)", "fit (s)", "passes", "gap", "kept", "peak RSS (GB)",
                      "ranks of the 10 relevant features"], rows)
            + "\n\n" + _machine(r["machine"]) + "\n")
