"""The ``mklscale`` command.

    mklscale --version
    mklscale run pipelines/quickstart.toml [--cluster cluster/slurm.toml] [--out runs/quickstart] [--quiet]
    mklscale fit --dataset breast_cancer --family simplemkl --solver spicy --C 0.05 --out model/
    mklscale predict model/ --features X_new.npy [--proba] [--out predictions.npy]
    mklscale report runs/quickstart
    mklscale bank build --dataset breast_cancer --family simplemkl --out bank.zarr
    mklscale bank build --features X.npy --family gaussian --widths 0.5 1 2 --out bank.zarr
    mklscale bank build --features X.npy --family random_subsets --rank 64 [--method nystrom|cholesky]
                        [--landmarks kmeans++|uniform] [--tol 1e-6] [--max-error 0.05] --out bank.zarr
    mklscale bank info PATH
    mklscale bank verify PATH
    mklscale bank repair PATH [--quiet]
    mklscale cache info|clear [--dir DIR]

Exit codes: 0 success; 1 ``verify`` found problems (it marks bad kernels unfinished in the bank;
``bank repair`` recomputes them and exits 0 only when the bank verifies afterwards) or a pipeline solver failed (see results.json);
2 bad input, a bad config or a bank/model/cluster that cannot be used (the message says what to do);
75 stopped by SIGTERM/SIGINT after saving a checkpoint (``mklscale run ... --resume`` continues).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

from mklscale import __version__
from mklscale.errors import InvalidInputError, MKLScaleError

FAMILY_CHOICES = ("simplemkl", "gaussian", "polynomial", "linear", "random_subsets")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except MKLScaleError as exc:
        print(f"mklscale: error: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mklscale", description="Multiple kernel learning over kernel banks on Dask.")
    p.add_argument("--version", action="version", version=f"mklscale {__version__}")
    sub = p.add_subparsers(title="commands")

    r = sub.add_parser("run", help="run a pipeline: dataset -> bank -> solvers -> evaluation -> report")
    r.add_argument("pipeline", type=Path, help="a pipeline TOML file (see pipelines/)")
    r.add_argument("--cluster", type=Path, default=None, help="a cluster TOML file (see cluster/); default: "
                   "an embedded LocalCluster with 2 worker processes")
    r.add_argument("--out", type=Path, default=None, help="run directory (default: runs/<pipeline name>)")
    r.add_argument("--quiet", action="store_true", help="no progress bars, per-iteration lines or kernel lists "
                   "(each solver's result line and where the results went are still printed)")
    r.add_argument("--resume", action="store_true", help="continue an interrupted run in --out from its checkpoints")
    r.set_defaults(func=_cmd_run)

    f = sub.add_parser("fit", help="fit one MKL model on a dataset or on features and labels, and save it")
    src = f.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="an offline dataset name (see mklscale.datasets.available())")
    src.add_argument("--features", type=Path, help="a .npy file with an (n, d) feature matrix (needs --labels)")
    f.add_argument("--labels", type=Path, help="a .npy file with the n labels or targets")
    f.add_argument("--task", choices=("classification", "regression"), default=None,
                   help="default: the dataset's task; required with --features")
    _family_arguments(f)
    f.add_argument("--solver", default="spicy", help="solver name (mklscale.solvers.registry)")
    f.add_argument("--C", type=float, default=None, help="the solver's main regularisation")
    f.add_argument("--rank", type=int, default=None,
                   help="store every kernel as a rank-R factor (Nystrom; for n in the tens of thousands) "
                        "instead of n x n; the model keeps only the kept kernels' landmarks")
    f.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a solver parameter; VALUE is read as JSON when it parses, else as a string")
    f.add_argument("--cache-dir", type=Path, default=None, help="where banks are kept for reuse")
    f.add_argument("--out", type=Path, required=True, help="model directory to write")
    f.add_argument("--quiet", action="store_true")
    f.set_defaults(func=_cmd_fit)

    pr = sub.add_parser("predict", help="predict with a saved model")
    pr.add_argument("model", type=Path, help="a model directory written by fit / run / save()")
    src = pr.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="an offline dataset name: predict on all its rows")
    src.add_argument("--features", type=Path, help="a .npy file with an (n, d) feature matrix")
    pr.add_argument("--proba", action="store_true", help="class probabilities (logistic-loss models only)")
    pr.add_argument("--out", type=Path, default=None, help=".npy or .csv file (default: print)")
    pr.set_defaults(func=_cmd_predict)

    rep = sub.add_parser("report", help="write RUN_DIR/report/index.html with plots from RUN_DIR/results.json")
    rep.add_argument("run_dir", type=Path)
    rep.set_defaults(func=_cmd_report)
    bank = sub.add_parser("bank", help="build, inspect, verify and repair kernel banks").add_subparsers(title="bank commands")

    b = bank.add_parser("build", help="compute a bank of Gram matrices from features")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="an offline dataset name (see mklscale.datasets.available())")
    src.add_argument("--features", type=Path, help="a .npy file with an (n, d) feature matrix")
    _family_arguments(b)
    b.add_argument("--rows", type=int, default=None, help="use only the first ROWS rows (default: all)")
    b.add_argument("--normalize", choices=("trace", "diag", "none"), default="trace")
    b.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    b.add_argument("--rank", type=int, default=None, help="a factor bank: every kernel stored as L (n x RANK), "
                   "K~ = L L^T (default: dense, n x n)")
    b.add_argument("--method", default="nystrom", help="factor banks: nystrom (default) or cholesky (pivoted, to --tol)")
    b.add_argument("--landmarks", default="kmeans++", help="factor banks, nystrom: kmeans++ (default) or uniform")
    b.add_argument("--tol", type=float, default=1e-6, help="factor banks, cholesky: relative residual trace to stop at")
    b.add_argument("--max-error", type=float, default=0.05, help="factor banks: warn when a kernel's relative trace "
                   "error (tr K - tr K~) / tr K exceeds this")
    b.add_argument("--cluster", type=Path, default=None, help="a cluster TOML file (see cluster/); default: Dask "
                   "threads in this process")
    b.add_argument("--overwrite", action="store_true", help="replace an existing bank built from other data or specs")
    b.add_argument("--out", type=Path, required=True, help="where to write the bank (a folder)")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.set_defaults(func=_cmd_build)

    i = bank.add_parser("info", help="print a bank's size, layout and kernels")
    i.add_argument("path", type=Path)
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(func=_cmd_info)

    v = bank.add_parser("verify", help="recompute checksums and report bad or unfinished kernels")
    v.add_argument("path", type=Path)
    v.add_argument("--quiet", action="store_true")
    v.set_defaults(func=_cmd_verify)

    rp = bank.add_parser("repair", help="recompute the kernels verify finds bad or unfinished (banks built from "
                         "features); exit 0 when the bank verifies afterwards, 2 otherwise")
    rp.add_argument("path", type=Path)
    rp.add_argument("--quiet", action="store_true", help="no progress bars")
    rp.set_defaults(func=_cmd_repair)
    _cache_parser(sub)
    return p


def _cache_parser(sub) -> None:
    cache = sub.add_parser("cache", help="show or empty the estimators' bank cache").add_subparsers(title="cache commands")
    where = dict(type=Path, default=None, help="the cache folder (default: $MKLSCALE_CACHE or ~/.cache/mklscale/banks)")
    i = cache.add_parser("info", help="print the cache's location, size and number of banks")
    i.add_argument("--dir", **where)
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(func=_cmd_cache_info)
    c = cache.add_parser("clear", help="remove every cached bank that no fit is using")
    c.add_argument("--dir", **where)
    c.set_defaults(func=_cmd_cache_clear)


def _family_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", choices=FAMILY_CHOICES, default="simplemkl")
    p.add_argument("--widths", type=float, nargs="+", default=[0.5, 1, 2, 5], help="gaussian widths s in exp(-||x-z||^2/(2 s^2))")
    p.add_argument("--degrees", type=int, nargs="+", default=[1, 2, 3], help="polynomial degrees")
    p.add_argument("--n-kernels", type=int, default=100, help="random_subsets: number of kernels")
    p.add_argument("--seed", type=int, default=0, help="random_subsets: seed")


def _kernels(args) -> dict:
    """The --family arguments as a family description for ``bank.families.resolve``."""
    extra = {"gaussian": {"widths": args.widths}, "polynomial": {"degrees": args.degrees},
             "random_subsets": {"n_kernels": args.n_kernels, "seed": args.seed}}
    return {"family": args.family, **extra.get(args.family, {})}


def _cmd_run(args) -> int:
    from mklscale.pipeline import run_pipeline

    from mklscale.runtime.checkpoint import EXIT_PREEMPTED, Preempted

    try:
        results = run_pipeline(args.pipeline, out=args.out, cluster=args.cluster, quiet=args.quiet,
                               resume=args.resume)
    except Preempted as exc:
        print(f"mklscale: {exc}", file=sys.stderr)
        return EXIT_PREEMPTED
    failed = [s["name"] for s in results["solvers"] if s["status"] != "ok"]
    if failed:
        print(f"mklscale: {len(failed)} solver(s) failed: {', '.join(failed)} (errors in results.json)", file=sys.stderr)
    return 1 if failed else 0


def _cmd_fit(args) -> int:
    from mklscale.estimators import MKLClassifier, MKLRegressor

    if args.dataset:
        from mklscale.datasets import load

        ds = load(args.dataset)
        X, y = ds.X, ds.y
        task = args.task or ("regression" if ds.task == "regression" else "classification")
    else:
        if args.labels is None or args.task is None:
            raise InvalidInputError("--features needs its labels and the task: pass --labels y.npy and "
                                    "--task classification|regression")
        X, y, task = _load_npy(args.features, "--features"), _load_npy(args.labels, "--labels"), args.task
    Estimator = MKLClassifier if task == "classification" else MKLRegressor
    estimator = Estimator(kernels=_kernels(args), solver=args.solver, C=args.C, solver_params=_params(args.param),
                          rank=args.rank, cache_dir=None if args.cache_dir is None else str(args.cache_dir), progress=not args.quiet)
    estimator.fit(X, y)
    estimator.save(args.out)
    print(f"model: {args.out}  kept {len(estimator.selected_kernels_)} kernel(s)  "
          f"training score {estimator.score(X, y):.4f}")
    return 0


def _params(pairs: list[str]) -> dict:
    """--param KEY=VALUE pairs; VALUE is JSON when it parses (numbers, true/false, lists), else a string."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInputError(f"--param {pair!r}: write KEY=VALUE, e.g. --param loss=hinge")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _cmd_predict(args) -> int:
    import mklscale

    estimator = mklscale.load(args.model)
    if args.dataset:
        from mklscale.datasets import load

        X = load(args.dataset).X
    else:
        X = _load_npy(args.features, "--features")
    predict = estimator.predict
    if args.proba:
        try:
            predict = estimator.predict_proba
        except AttributeError as exc:
            reason = exc.__cause__ if exc.__cause__ is not None else exc
            raise InvalidInputError(f"--proba: {reason}. On the command line, leave out --proba to get the predicted "
                                    "labels") from None
    values = predict(X)
    if args.out is None:
        np.savetxt(sys.stdout, np.atleast_1d(values), fmt="%s")
    elif args.out.suffix == ".csv":
        np.savetxt(args.out, np.atleast_1d(values), fmt="%s", delimiter=",")
    else:
        np.save(args.out, np.asarray(values), allow_pickle=False)
    return 0


def _cmd_report(args) -> int:
    from mklscale.report import write_report

    write_report(args.run_dir)  # prints where the report went (and what it lacks)
    return 0


def _load_npy(path: Path, what: str) -> np.ndarray:
    if not path.is_file():
        raise InvalidInputError(f"{what} {path}: no such file; give the path of an existing .npy file "
                                "(write one with numpy.save)")
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        reason = "not in .npy format, or it holds Python objects" if "pickle" in str(exc) else str(exc)
        raise InvalidInputError(f"{what} {path}: not a plain .npy array ({reason}); save the array with "
                                "numpy.save(path, array) (numbers only, no objects)") from None
    if not isinstance(array, np.ndarray):  # an .npz archive
        array.close()
        raise InvalidInputError(f"{what} {path}: is an .npz archive, not one array; save the array alone with "
                                "numpy.save(path, array)")
    return array


def _load_features(args) -> np.ndarray:
    if args.dataset:
        from mklscale.datasets import load

        X = load(args.dataset).X
    else:
        X = _load_npy(args.features, "--features")
    if args.rows is not None:
        if args.rows < 2:
            raise InvalidInputError(f"--rows must be >= 2, got {args.rows}; give --rows 2 or more (or leave it out "
                                    "for all rows)")
        X = X[: args.rows]
    return X


def _cmd_build(args) -> int:
    from mklscale.bank import build_bank, families

    X = _load_features(args)
    specs = families.resolve(_kernels(args), X.shape[1])
    normalize = None if args.normalize == "none" else args.normalize
    kw = dict(normalize=normalize, dtype=args.dtype, overwrite=args.overwrite, progress=not args.quiet)
    if args.rank is not None:
        kw.update(rank=args.rank, method=args.method, landmarks=args.landmarks, tol=args.tol, max_error=args.max_error)
    elif (args.method, args.landmarks) != ("nystrom", "kmeans++"):
        raise InvalidInputError("--method and --landmarks apply to factor banks only; add --rank R")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        if args.cluster is None:
            bank = build_bank(X, specs, args.out, **kw)
        else:
            from mklscale.runtime.cluster import load_cluster_config, open_client

            with open_client(load_cluster_config(args.cluster), quiet=args.quiet) as client:
                bank = build_bank(X, specs, args.out, client=client, **kw)
    for w in caught:
        if issubclass(w.category, UserWarning):
            print(f"mklscale: warning: {w.message}", file=sys.stderr)
    factor = "" if bank.rank is None else f"  factor rank {bank.rank}"
    print(f"bank: {bank.path}  M={len(bank)} kernels  n={bank.n}{factor}  {bank.nbytes / 1e9:.3f} GB  "
          f"({bank.last_build_computed} computed now)")
    return 0


def _open_bank(path: Path):
    """The bank at ``path``; a folder that is not a bank gets a message saying what to give instead."""
    from mklscale.bank import KernelBank
    from mklscale.errors import NotABankError

    if path.exists() and not KernelBank.is_bank(path):
        raise NotABankError(f"{path} exists but is not an mklscale kernel bank (no bank metadata found); give the "
                            "folder written by `mklscale bank build --out FOLDER` (or by build_bank)")
    return KernelBank.open(path)


def _cmd_info(args) -> int:
    bank = _open_bank(args.path)
    complete = bank.complete
    info = {
        "path": str(bank.path), "M": len(bank), "n": bank.n, "dtype": bank.dtype.name,
        "normalize": bank.normalize, "bytes": bank.nbytes, "complete": int(complete.sum()),
        "layout": bank.attrs["layout"], "n_shards": bank.n_shards,
        "families": {f: sum(s.family == f for s in bank.specs) for f in sorted({s.family for s in bank.specs})},
        "created": bank.attrs.get("created"),
        "representation": bank.representation, "rank": bank.rank,
    }
    if bank.rank is not None:
        summary = bank.approximation_summary()
        info["factor"] = bank.factor_settings
        info["approx_error"] = {**summary, "worst": [{"kernel": m, "name": name, "error": e}
                                                     for m, name, e in summary["worst"]]}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['path']}\n  kernels: {info['M']} ({info['complete']} complete)  n: {info['n']}  dtype: {info['dtype']}"
          f"  normalize: {info['normalize']}\n  size: {info['bytes'] / 1e9:.3f} GB in {info['n_shards']} shard(s), "
          f"{info['layout']['kernels_per_chunk']} kernel(s) per chunk, {info['layout']['kernels_per_shard']} per shard")
    print("  families: " + ", ".join(f"{k}={v}" for k, v in info["families"].items()))
    if bank.rank is not None:
        err, st = info["approx_error"], info["factor"]
        print(f"  representation: factor, rank {bank.rank} ({st.get('method')}, landmarks {st.get('landmarks')}, "
              f"tol {st.get('tol')}, seed {st.get('seed')}); kernel ranks {int(bank.ranks.min())}..{int(bank.ranks.max())}")
        if err["max"] is not None:
            print(f"  approximation error (tr K - tr K~) / tr K: min {err['min']:.3g}  median {err['median']:.3g}  "
                  f"max {err['max']:.3g}")
            print("  worst: " + ", ".join(f"[{w['kernel']}] {w['name']} {w['error']:.3g}" for w in err["worst"]))
    else:
        print("  representation: dense")
    lam = bank.lambda_max
    for m in range(min(len(bank), 5)):
        print(f"  [{m}] {bank.specs[m].name}  lambda_max={lam[m]:.4g}")
    if len(bank) > 5:
        print(f"  ... {len(bank) - 5} more")
    return 0


def _cmd_cache_info(args) -> int:
    from mklscale.bank import cache

    info = cache.info(args.dir if args.dir is not None else cache.default_dir())
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    cap = "no cap" if info["max_bytes"] is None else f"cap {info['max_bytes'] / 1e9:.3f} GB"
    print(f"bank cache: {info['path']}\n  size: {info['bytes'] / 1e9:.3f} GB in {info['n_banks']} bank(s)  "
          f"({cap}, $MKLSCALE_CACHE_MAX)")
    return 0


def _cmd_cache_clear(args) -> int:
    from mklscale.bank import cache

    folder = args.dir if args.dir is not None else cache.default_dir()
    removed, busy = cache.clear(folder)
    print(f"bank cache: {folder}: removed {len(removed)} bank(s), {sum(b.nbytes for b in removed) / 1e9:.3f} GB"
          + (f"; {len(busy)} in use by a running fit left in place" if busy else ""))
    return 0


def _cmd_verify(args) -> int:
    report = _open_bank(args.path).verify(progress=not args.quiet)
    print(report)
    return 0 if report.ok else 1


def _cmd_repair(args) -> int:
    from mklscale.errors import BankCorruptError

    report = _open_bank(args.path).repair(progress=not args.quiet)
    print(report)
    if not report.ok:
        raise BankCorruptError(f"bank {args.path} still does not verify after the repair (see above); rebuild it "
                               "with `mklscale bank build ... --overwrite`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
