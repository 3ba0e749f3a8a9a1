"""Targeted mutation testing of the solver cores (issue 21): does a test fail when a certificate breaks?

Hand-run, not CI (docs/mutation-testing.md). For each target below (a function of a solver module,
optionally only its source lines matching a pattern) every mutation point gets one mutant:

    arithmetic   a + b <-> a - b, a * b <-> a / b, a / b -> a, a * b -> a   (a factor dropped)
    constant     c -> 2c and c -> c/2 (c != 0), 0 -> 1                     (not in subscripts or keywords)
    comparison   < <-> <=, > <-> >=, and each to its negation
    extremum     max <-> min, np.maximum <-> np.minimum
    sign         -x -> x

Each mutant is the module re-written by ``ast.unparse`` with that one change, in a private copy of the
package and its tests (the working tree is never touched), followed by the target's fast test files
(``pytest -x``; a test failure, an error or a timeout kills it). The result (JSON) lists every mutant
with its status; survivors are then judged by hand: equivalent (no behaviour change observable by any
test, e.g. ``<`` vs ``<=`` on a float that is never equal) or a missing test.

    python benchmarks/mutation.py --list                      # the mutants, no tests run (--targets all: every target)
    python benchmarks/mutation.py --out benchmarks/results/mutation_after.json
    python benchmarks/mutation.py --targets gcd_fw_gap,sgd_step --tests-from <rev>   # tests of another revision

``--tests-from REV`` takes tests/ from a git revision (e.g. the commit before the new tests) so that a
before/after pair of runs measures what the new tests add, on the same mutants.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Target:
    name: str
    file: str                      # relative to the repository root
    function: str                  # qualified name: "f" or "Class.method"
    lines: str | None              # regex a mutated line must match (None: the whole function)
    tests: tuple[str, ...]         # pytest arguments (files, -k expressions)


#: the certificate-bearing pieces of the solver cores (issue 21): gaps, duals, bounds, the SGD estimator
TARGETS = (
    Target("duality_relative_gap", "mklscale/solvers/duality.py", "relative_gap", None,
           ("tests/test_certificates.py",)),
    Target("duality_scaled_dual", "mklscale/solvers/duality.py", "scaled_dual", r"s = \(a|return float\(s|s = min|s = a / b",
           ("tests/test_certificates.py", "tests/test_pfbs.py", "-k", "dual or gap or cvxpy")),
    Target("screening_bound", "mklscale/solvers/toolkit/screening.py", "Screening.upper_bounds", None,
           ("tests/test_toolkit.py",)),
    Target("gcd_fw_gap", "mklscale/solvers/gcd.py", "fit_one_stage", r"gap|q_max|aKa",
           ("tests/test_certificates.py", "tests/test_gcd.py", "-k", "gap or gcd1s")),
    Target("gcd_euclidean_gap", "mklscale/solvers/gcd.py", "_euclidean", r"gap = \(",
           ("tests/test_certificates.py", "tests/test_gcd.py", "-k", "gap or euclidean")),
    Target("sgd_step", "mklscale/solvers/sgd.py", "fit", r"state.increase|eta = eta0",
           ("tests/test_certificates.py", "tests/test_sgd.py", "-k",
            "close_to_optimum or family or certificate or gap or polynomial")),
    Target("citi_gap", "mklscale/solvers/citi.py", "fit", r"upper =|lower =|primal =|gap =|stop =",
           ("tests/test_certificates.py", "tests/test_citi.py", "-k", "gap or cvxpy or certificate")),
    Target("citi_primal", "mklscale/solvers/citi.py", "primal_objective", None,
           ("tests/test_certificates.py", "tests/test_citi.py", "-k", "gap or cvxpy or certificate")),
    # the engine's readers and the row-by-row quad-form sweep (session 9): wrong bytes or wrong sums
    Target("reader_direct", "mklscale/bank/storage/local.py", "LocalRange.read_direct", None,
           ("tests/test_engine.py", "-k", "reader or identical or direct or past_the_end")),
    Target("pread_direct", "mklscale/bank/direct_io.py", "pread_direct", None,
           ("tests/test_engine.py", "-k", "reader or identical or direct or past_the_end")),
    Target("reader_view", "mklscale/bank/storage/local.py", "LocalRange.view", None,
           ("tests/test_engine.py", "-k", "reader or identical or direct or past_the_end")),
    Target("quad_stream", "mklscale/engine/kernels.py", "quad_stream", None,
           ("tests/test_engine.py", "-k", "identical")),
    Target("smo_dual", "mklscale/solvers/smo.py", "dual_value", None,
           ("tests/test_certificates.py", "tests/test_smo.py", "-k", "lanckriet or certified or gap")),
)

#: the targets of the recorded runs (docs/mutation-testing.md): 80 mutants, about 45 minutes on 2 cores
DEFAULT_TARGETS = ("duality_relative_gap", "screening_bound", "gcd_fw_gap", "gcd_euclidean_gap", "sgd_step",
                   "citi_gap", "smo_dual")


# ---- mutation points ---------------------------------------------------------------------------------
_ARITH = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
_CMP = {ast.Lt: (ast.LtE, ast.GtE), ast.LtE: (ast.Lt, ast.Gt), ast.Gt: (ast.GtE, ast.LtE),
        ast.GtE: (ast.Gt, ast.Lt)}
_EXTREMA = {"max": "min", "min": "max", "maximum": "minimum", "minimum": "maximum"}


def _functions(tree: ast.Module, qualnames: str):
    wanted = set(qualnames.split("|"))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in wanted:
            yield node
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef) and f"{node.name}.{sub.name}" in wanted:
                    yield sub


def _skipped_constants(fn: ast.AST) -> set[int]:
    """ids of constants that are indices, keyword values or docstrings (mutating them only crashes)."""
    skip = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Subscript):
            skip |= {id(c) for c in ast.walk(node.slice) if isinstance(c, ast.Constant)}
        if isinstance(node, ast.keyword):
            skip |= {id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skip.add(id(node.value))
    return skip


def mutation_points(source: str, target: Target) -> list[tuple[int, str]]:
    """[(index in ast.walk order of the module, description)] for every mutation of ``target``."""
    tree = ast.parse(source)
    lines = source.splitlines()
    points = []
    in_target: dict[int, ast.AST] = {}
    for fn in _functions(tree, target.function):
        skip = _skipped_constants(fn)
        for stmt in fn.body:                       # not the signature's defaults
            for node in ast.walk(stmt):
                if id(node) in skip or not hasattr(node, "lineno"):
                    continue
                if target.lines is None or re.search(target.lines, lines[node.lineno - 1]):
                    in_target[id(node)] = node
    for index, node in enumerate(ast.walk(tree)):
        if id(node) not in in_target:
            continue
        where = f"line {node.lineno}"
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            points.append((index, f"{where}: {ast.unparse(node)} -> op {_ARITH[type(node.op)].__name__}"))
            if isinstance(node.op, (ast.Mult, ast.Div)):
                points.append((index, f"{where}: {ast.unparse(node)} -> drop right factor"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool):
            if node.value == 0:
                points.append((index, f"{where}: constant 0 -> 1"))
            else:
                points.append((index, f"{where}: constant {node.value!r} -> x2"))
                points.append((index, f"{where}: constant {node.value!r} -> /2"))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
            for new in _CMP[type(node.ops[0])]:
                points.append((index, f"{where}: {ast.unparse(node)} -> cmp {new.__name__}"))
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else None
            if name in _EXTREMA:
                points.append((index, f"{where}: {name} -> {_EXTREMA[name]}"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            points.append((index, f"{where}: {ast.unparse(node)} -> drop minus"))
    return points


def mutate(source: str, index: int, description: str) -> str:
    """``source`` with the mutation ``description`` applied at node ``index`` (ast.walk order)."""
    tree = copy.deepcopy(ast.parse(source))
    node = list(ast.walk(tree))[index]
    kind = description.split(" -> ")[-1]
    if isinstance(node, ast.BinOp):
        if kind == "drop right factor":
            replacement = node.left
            _replace(tree, node, replacement)
        else:
            node.op = _ARITH[type(node.op)]()
    elif isinstance(node, ast.Constant):
        node.value = 1 if kind == "1" else (node.value * 2 if kind == "x2" else node.value / 2)
    elif isinstance(node, ast.Compare):
        node.ops = [getattr(ast, kind.split()[-1])()]
    elif isinstance(node, ast.Call):
        if isinstance(node.func, ast.Name):
            node.func.id = _EXTREMA[node.func.id]
        else:
            node.func.attr = _EXTREMA[node.func.attr]
    elif isinstance(node, ast.UnaryOp):
        _replace(tree, node, node.operand)
    return ast.unparse(ast.fix_missing_locations(tree))


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
                        return
    raise RuntimeError("node not found")


# ---- running ---------------------------------------------------------------------------------------------
def _sandbox(tests_from: str | None) -> Path:
    """A private copy of the package and its tests (tests/ from ``tests_from`` when given)."""
    box = Path(tempfile.mkdtemp(prefix="mklscale-mutation-"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    shutil.copytree(ROOT / "mklscale", box / "mklscale", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", box / "pyproject.toml")
    if tests_from is None:
        shutil.copytree(ROOT / "tests", box / "tests", ignore=ignore)
    else:
        (box / "tests").mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", tests_from, "tests"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(box)], input=archive, check=True)
    return box


def _run_tests(box: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, float]:
    start = time.monotonic()
    env = {"PYTHONPATH": str(box), "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(box),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    import os
    env = {**os.environ, **env}
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                               "-m", "not slow", *tests], cwd=box, env=env, capture_output=True, timeout=timeout)
        status = "survived" if proc.returncode == 0 else ("killed" if proc.returncode == 1 else
                                                           f"killed (pytest exit {proc.returncode})")
    except subprocess.TimeoutExpired:
        status = "killed (timeout)"
    return status, time.monotonic() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", help="comma-separated target names, or 'all' (default: DEFAULT_TARGETS)")
    parser.add_argument("--tests-from", help="git revision to take tests/ from (default: the working tree)")
    parser.add_argument("--out", help="JSON file for the results")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's test run")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--survivors-of", help="a results JSON: run only its surviving mutants (a mutant "
                        "killed by a test stays killed when tests are only added), copying the killed rows")
    args = parser.parse_args(argv)
    names = set((args.targets or ",".join(DEFAULT_TARGETS)).split(","))
    targets = [t for t in TARGETS if "all" in names or t.name in names]
    if args.list:
        for t in targets:
            for _, what in mutation_points((ROOT / t.file).read_text(), t):
                print(f"{t.name}: {what}")
        return 0
    box = _sandbox(args.tests_from)
    results = {"tests_from": args.tests_from or "working tree", "targets": {}}
    earlier = json.loads(Path(args.survivors_of).read_text())["targets"] if args.survivors_of else None
    if earlier is not None:
        targets = [t for t in targets if "rows" in earlier.get(t.name, {})]
    try:
        for t in targets:
            path = box / t.file
            original = path.read_text()
            status, seconds = _run_tests(box, t.tests, args.timeout)
            if status != "survived":
                print(f"{t.name}: the tests fail on the unmutated code ({status}); skipped", flush=True)
                results["targets"][t.name] = {"error": "tests fail without a mutation"}
                continue
            rows = []
            for position, (index, what) in enumerate(mutation_points(original, t)):
                before = None if earlier is None else earlier[t.name]["rows"][position]
                assert before is None or before["mutant"] == what, "the mutants differ from the earlier run's"
                if before is not None and before["status"] != "survived":     # killed before: kept as it was
                    rows.append({**before, "from": args.survivors_of})
                    continue
                try:
                    path.write_text(mutate(original, index, what))
                    status, seconds = _run_tests(box, t.tests, args.timeout)
                finally:
                    path.write_text(original)
                rows.append({"mutant": what, "status": status, "seconds": round(seconds, 1)})
                print(f"{t.name}: {what}: {status} ({seconds:.0f} s)", flush=True)
            survived = sum(r["status"] == "survived" for r in rows)
            results["targets"][t.name] = {"tests": list(t.tests), "mutants": len(rows), "survived": survived,
                                          "rows": rows}
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    finally:
        shutil.rmtree(box, ignore_errors=True)
    total = sum(v.get("mutants", 0) for v in results["targets"].values())
    surv = sum(v.get("survived", 0) for v in results["targets"].values())
    results["total"] = {"mutants": total, "survived": surv}
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"{surv} of {total} mutants survived", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
