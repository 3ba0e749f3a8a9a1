"""The ``mklscale`` command.

    mklscale --version
    mklscale run pipelines/quickstart.toml [--cluster cluster/slurm.toml] [--out runs/quickstart] [--quiet]
    mklscale run pipelines/uci_simplemkl.toml --dataset pima      (another offline dataset for this run)
    mklscale fit --dataset breast_cancer --family simplemkl --solver spicy --C 0.05 --out model/ [--overwrite]
    mklscale fit --features data.csv --target label [--task classification] --out model/   (.csv/.parquet)
    mklscale fit --features X.npy --labels y.npy [--task regression] --out model/
    mklscale predict model/ --features X_new.npy [--proba] [--out predictions.csv|predictions.npy]
    mklscale predict model/ --features new.csv [--out predictions.csv]   (columns matched by name)
    mklscale report runs/quickstart
    mklscale bank build --dataset breast_cancer --family simplemkl --out bank.zarr
    mklscale bank build --features X.npy --family gaussian --widths 0.5 1 2 --kernel-features all --out bank.zarr
    mklscale bank build --features X.npy --family random_subsets --rank 64 [--method nystrom|cholesky]
                        [--landmarks kmeans++|uniform|rls] [--tol T] [--max-error E] --out bank.zarr
    mklscale bank info PATH
    mklscale bank verify PATH
    mklscale bank repair PATH [--quiet]
    mklscale bank copy SRC DST [--overwrite]     (a folder and an s3://bucket/prefix URL, either way)
    mklscale cache info|clear [--dir DIR]

A bank PATH may be a folder or an S3-compatible object store URL s3://bucket/prefix (configured by
AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION).

Exit codes: 0 success; 1 ``verify`` found problems (it marks bad kernels unfinished in the bank;
``bank repair`` recomputes them and exits 0 only when the bank verifies afterwards) or a pipeline solver failed (see results.json);
2 bad input, a bad config, a file that cannot be written or a bank/model/cluster that cannot be used (the message says
what to do); 70 an internal error, a bug in mklscale (one line naming the file that holds the traceback);
75 stopped by SIGINT (Ctrl-C) or SIGTERM: one line says what was saved and the command that continues
(``mklscale run ... --resume``; a bank build continues when run again); 141 stdout was closed early
(``mklscale bank info PATH | head``), as for other Unix tools.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import signal
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import numpy as np

from mklscale import __version__
from mklscale.errors import InvalidInputError, MKLScaleError, Preempted, Stopped
from mklscale.runtime.interrupt import EXIT_STOPPED, stop_cleanly

#: the kernel families (mklscale.bank.families.FAMILIES, spelled here so that `mklscale --help` needs no numba import)
FAMILY_CHOICES = ("auto", "simplemkl", "gaussian", "polynomial", "linear", "random_subsets", "per_feature",
                  "interactions")
#: the family parameters (mklscale.bank.families.FAMILY_PARAMS) and the option that gives each
FAMILY_OPTIONS = {"widths": "--widths", "degrees": "--degrees", "offset": "--offset", "features": "--kernel-features",
                  "n_kernels": "--n-kernels", "seed": "--seed", "max_subset": "--max-subset", "linear": "--linear",
                  "pairs": "--pairs"}


EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 70      # EX_SOFTWARE
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, the status of a Unix tool whose reader went away


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return EXIT_BAD_INPUT
    args.argv = argv
    with stop_cleanly():
        return _run_command(args)


def _run_command(args) -> int:
    """Run a command; every way it can end becomes one exit code (see the module docstring)."""
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away (`| head`) shows here, not at interpreter exit
        return code
    except (Stopped, Preempted) as exc:
        if isinstance(exc, Preempted) or str(exc) == f"stopped by {exc.signal_name}":  # no command-specific news
            saved = getattr(args, "saved", "nothing was saved")
            exc = Stopped(exc.signum, f"stopped by {signal.Signals(exc.signum).name}: {saved}; run the same command "
                                      f"again to continue: {_command_line(args)}")
        print(f"mklscale: {exc}", file=sys.stderr, flush=True)
        return EXIT_STOPPED
    except MKLScaleError as exc:
        print(f"mklscale: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # the reader of stdout went away (`| head`): nothing left to say; keep the exit-time flush quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        print(f"mklscale: error: {exc}; check the path, its permissions and the free space", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - a bug: one line and the traceback in a file, not on the screen
        log = _save_traceback(exc)
        print(f"mklscale: internal error: {type(exc).__name__}: {exc}. This is a bug in mklscale; the traceback "
              f"is in {log}, please report it with that file", file=sys.stderr)
        return EXIT_INTERNAL


def _command_line(args) -> str:
    return shlex.join(["mklscale", *args.argv])


def _save_traceback(exc: BaseException) -> str:
    """Write the traceback of an unexpected exception to a file in the temp folder; return its path."""
    fd, path = tempfile.mkstemp(prefix="mklscale-error-", suffix=".log")
    with os.fdopen(fd, "w") as fh:
        fh.write(f"mklscale {' '.join(sys.argv)}\n")
        fh.writelines(traceback.format_exception(exc))
    return path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mklscale", description="Multiple kernel learning over kernel banks on Dask.")
    p.add_argument("--version", action="version", version=f"mklscale {__version__}")
    sub = p.add_subparsers(title="commands")

    r = sub.add_parser("run", help="run a pipeline: dataset -> bank -> solvers -> evaluation -> report")
    r.add_argument("pipeline", type=Path, help="a pipeline TOML file (see pipelines/)")
    r.add_argument("--cluster", type=Path, default=None, help="a cluster TOML file (see cluster/); default: "
                   "an embedded LocalCluster with 2 worker processes")
    r.add_argument("--dataset", default=None, metavar="NAME", help="run on this offline dataset instead of the "
                   "pipeline's [dataset] (see mklscale.datasets.available()); its split settings stay")
    r.add_argument("--out", type=Path, default=None, help="run directory (default: runs/<pipeline name>, or "
                   "runs/<pipeline name>-<dataset> with --dataset)")
    r.add_argument("--quiet", action="store_true", help="no progress bars, per-iteration lines or kernel lists "
                   "(each solver's result line and where the results went are still printed)")
    r.add_argument("--resume", action="store_true", help="continue an interrupted run in --out from its checkpoints "
                   "(a finished run is left as it is)")
    r.add_argument("--overwrite", action="store_true", help="replace an earlier run in --out (without it, or "
                   "--resume, an --out holding a run is refused)")
    r.set_defaults(func=_cmd_run, saved="the run's finished parts are kept in its run directory")

    f = sub.add_parser("fit", help="fit one MKL model on a dataset or on features and labels, and save it")
    src = f.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="an offline dataset name (see mklscale.datasets.available())")
    src.add_argument("--features", type=Path, help="your own data: a .csv (header row) or .parquet table (needs "
                     "--target), or a .npy (n, d) array (needs --labels)")
    f.add_argument("--target", metavar="COLUMN", help="the target column of a --features table; the other columns "
                   "are the features")
    f.add_argument("--labels", type=Path, help="a .npy file with the n labels or targets of .npy --features")
    f.add_argument("--task", choices=("classification", "regression"), default=None,
                   help="default: the dataset's task; with --features inferred from the target (whole numbers with "
                        "at most 20 values, or text: classification) and printed")
    _family_arguments(f)
    f.add_argument("--solver", default="spicy", help="solver name (mklscale.solvers.registry)")
    f.add_argument("--C", default="cv", help="the solver's main regularisation: cv (default: chosen among 10 values "
                   "of the solver's grid by --cv-fold cross-validation), auto (the solver's default on the bank's "
                   "scale), or a number")
    f.add_argument("--cv", type=int, default=3, help="folds of the cross-validation that chooses C (--C cv) or scores "
                   "it (a number or auto; printed beside the training score); 0: none (only the training score)")
    f.add_argument("--rank", type=int, default=None,
                   help="store every kernel as a rank-R factor (Nystrom; for n in the tens of thousands) "
                        "instead of n x n; the model keeps only the kept kernels' landmarks")
    f.add_argument("--computed", choices=("auto", "yes", "no"), default="auto",
                   help="yes: store no kernel, compute them from the features in every pass; auto (default): only "
                        "when a stored bank would not fit the cache's disk or cap; no: always stored")
    f.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a solver parameter; VALUE is read as JSON when it parses, else as a string")
    f.add_argument("--cache-dir", type=Path, default=None, help="where banks are kept for reuse")
    f.add_argument("--out", type=Path, required=True, help="model directory to write (a new or empty folder)")
    f.add_argument("--overwrite", action="store_true", help="replace a model already in --out (in one step: a failed "
                   "write keeps the old model); without it such an --out is refused")
    f.add_argument("--quiet", action="store_true")
    f.set_defaults(func=_cmd_fit, saved="no model was written; the bank kernels finished so far stay in the cache "
                   "and are reused")

    pr = sub.add_parser("predict", help="predict with a saved model")
    pr.add_argument("model", type=Path, help="a model directory written by fit / run / save()")
    src = pr.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="an offline dataset name: predict on all its rows")
    src.add_argument("--features", type=Path, help="a .csv / .parquet table (columns matched by name to the "
                     "model's features; others, the target among them, are ignored) or a .npy (n, d) array")
    pr.add_argument("--target", metavar="COLUMN", help="a column of the --features table to leave out (needed only "
                    "for models fitted without column names, e.g. on .npy features)")
    pr.add_argument("--proba", action="store_true", help="class probabilities (logistic-loss models only)")
    pr.add_argument("--out", type=Path, default=None, help=".npy or .csv file (default: print the CSV); the CSV has a "
                    "header: prediction, or proba_<class> per class with --proba")
    pr.set_defaults(func=_cmd_predict, saved="no predictions were written")

    rep = sub.add_parser("report", help="write RUN_DIR/report/index.html with plots from RUN_DIR/results.json")
    rep.add_argument("run_dir", type=Path)
    rep.set_defaults(func=_cmd_report, saved="the report was not written (results.json is unchanged)")
    bank = sub.add_parser("bank", help="build, inspect, verify and repair kernel banks").add_subparsers(title="bank commands")

    b = bank.add_parser("build", help="compute a bank of Gram matrices from features")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="an offline dataset name (see mklscale.datasets.available())")
    src.add_argument("--features", type=Path, help="a .csv (header row) or .parquet table, or a .npy (n, d) array")
    b.add_argument("--target", metavar="COLUMN", help="a column of the --features table to leave out (the target)")
    _family_arguments(b)
    b.add_argument("--rows", type=int, default=None, help="use only the first ROWS rows (default: all)")
    b.add_argument("--normalize", choices=("trace", "diag", "none"), default="trace")
    b.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    b.add_argument("--rank", type=int, default=None, help="a factor bank: every kernel stored as L (n x RANK), "
                   "K~ = L L^T (default: dense, n x n)")
    b.add_argument("--computed", action="store_true",
                   help="a computed bank: store only the features and each kernel's statistics; every pass computes "
                        "the kernels again (for many kernels over few rows, e.g. --family per_feature)")
    # factor defaults: bank.factor.FactorSettings and MAX_ERROR (their one spelling), filled in by _cmd_build
    b.add_argument("--method", default=None, help="factor banks: nystrom (the default) or cholesky (pivoted, to --tol)")
    b.add_argument("--landmarks", default=None, help="factor banks, nystrom: kmeans++ (the default), uniform or rls (ridge leverage scores)")
    b.add_argument("--tol", type=float, default=None, help="factor banks, cholesky: relative residual trace to stop at")
    b.add_argument("--max-error", type=float, default=None, help="factor banks: warn when a kernel's relative trace "
                   "error (tr K - tr K~) / tr K exceeds this")
    b.add_argument("--cluster", type=Path, default=None, help="a cluster TOML file (see cluster/); default: Dask "
                   "threads in this process")
    b.add_argument("--overwrite", action="store_true", help="replace an existing bank built from other data or specs")
    b.add_argument("--out", required=True, help="where to write the bank (a folder or s3://bucket/prefix)")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.set_defaults(func=_cmd_build, saved="the kernels finished so far are saved in the bank")

    i = bank.add_parser("info", help="print a bank's size, layout and kernels")
    i.add_argument("path", help="a bank folder or s3://bucket/prefix")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(func=_cmd_info, saved="nothing was changed")

    v = bank.add_parser("verify", help="recompute checksums and report bad or unfinished kernels")
    v.add_argument("path", help="a bank folder or s3://bucket/prefix")
    v.add_argument("--quiet", action="store_true")
    v.set_defaults(func=_cmd_verify, saved="kernels found bad so far are marked unfinished")

    rp = bank.add_parser("repair", help="recompute the kernels verify finds bad or unfinished (banks built from "
                         "features); exit 0 when the bank verifies afterwards, 2 otherwise")
    rp.add_argument("path", help="a bank folder or s3://bucket/prefix")
    rp.add_argument("--quiet", action="store_true", help="no progress bars")
    rp.set_defaults(func=_cmd_repair, saved="the kernels recomputed so far are saved in the bank")

    cp = bank.add_parser("copy", help="copy a bank between a folder and an object store (s3://bucket/prefix), "
                         "either way, then verify every kernel's checksum at the destination")
    cp.add_argument("src", help="the bank to copy: a folder or s3://bucket/prefix")
    cp.add_argument("dst", help="where to put it: a new folder or an empty s3://bucket/prefix")
    cp.add_argument("--overwrite", action="store_true", help="replace a bank already at DST")
    cp.add_argument("--quiet", action="store_true")
    cp.set_defaults(func=_cmd_copy, saved="the copy was not finished; nothing at SRC changed")

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
    """--family and its parameters. They default to None (not given): the family's own defaults
    (mklscale.bank.families, the same as in Python and pipelines) fill what is not given."""
    p.add_argument("--family", choices=FAMILY_CHOICES, default="auto",
                   help="the kernel family (default auto, as the estimators); its parameters default to the family's own, the same "
                        "as in Python and pipelines (see mklscale.bank.families)")
    p.add_argument("--widths", type=float, nargs="+", default=None,
                   help="gaussian, simplemkl, per_feature, interactions: Gaussian widths s in exp(-||x-z||^2/(2 s^2))")
    p.add_argument("--degrees", type=int, nargs="+", default=None, help="polynomial, simplemkl: polynomial degrees")
    p.add_argument("--offset", type=float, default=None, help="polynomial: c in (<x,z> + c)^p")
    p.add_argument("--kernel-features", default=None, metavar="all|each|all+each|I,J,...",
                   help="gaussian, polynomial, linear: the feature sets: all features together, each single "
                        "feature, both, or one subset of column indices")
    p.add_argument("--n-kernels", type=int, default=None, help="random_subsets: number of kernels")
    p.add_argument("--seed", type=int, default=None, help="random_subsets: seed")
    p.add_argument("--max-subset", type=int, default=None, help="random_subsets: largest feature subset")
    p.add_argument("--linear", type=_yes_no, default=None, metavar="yes|no",
                   help="per_feature: add the linear kernel on each feature (default yes)")
    p.add_argument("--pairs", type=_pair, nargs="+", default=None, metavar="I,J",
                   help="interactions: the feature pairs, e.g. --pairs 0,1 2,5")


def _yes_no(text: str) -> bool:
    if text.lower() not in ("yes", "no", "true", "false"):
        raise argparse.ArgumentTypeError(f"give yes or no, not {text!r}")
    return text.lower() in ("yes", "true")


def _pair(text: str) -> list[int]:
    try:
        i, j = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a feature pair is I,J (two column indices), not {text!r}") from None
    return [i, j]


def _kernels(args) -> dict:
    """The --family options as a family description for ``bank.families.resolve``: the family and
    only the options given. An option the family does not take is an InvalidInputError (exit 2)
    saying which options it takes."""
    from mklscale.bank import families

    given = {param: getattr(args, option[2:].replace("-", "_")) for param, option in FAMILY_OPTIONS.items()}
    given = {param: value for param, value in given.items() if value is not None}
    takes = families.FAMILY_PARAMS[args.family]
    unused = [FAMILY_OPTIONS[param] for param in given if param not in takes]
    if unused:
        options = ", ".join(FAMILY_OPTIONS[param] for param in takes)
        raise InvalidInputError(f"--family {args.family} does not take {', '.join(unused)}; "
                                + (f"it takes {options}" if takes else "it takes no options"))
    if "features" in given:
        given["features"] = _feature_sets(given["features"])
    description = {"family": args.family, **given}
    families.parameters(description)  # bad values fail here, before any data is read
    return description


def _feature_sets(text: str):
    """--kernel-features: "all", "each", "all+each", or comma-separated column indices (a list)."""
    if text in ("all", "each", "all+each"):
        return text
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise InvalidInputError(f"--kernel-features {text!r}: give all, each, all+each or comma-separated column "
                                "indices such as 0,2,5") from None


def _cmd_run(args) -> int:
    from mklscale.pipeline import run_pipeline

    results = run_pipeline(args.pipeline, out=args.out, cluster=args.cluster, quiet=args.quiet, resume=args.resume,
                           overwrite=args.overwrite, dataset=args.dataset)
    failed = [s["name"] for s in results["solvers"] if s["status"] != "ok"]
    if failed:
        print(f"mklscale: {len(failed)} solver(s) failed: {', '.join(failed)} (errors in results.json)", file=sys.stderr)
    return 1 if failed else 0


def _cmd_fit(args) -> int:
    from mklscale.bank.size import BankTooLargeError
    from mklscale.plots import share_lines

    kernels = _kernels(args)
    _check_fit_out(args.out, args.overwrite)
    feature_names = None
    if args.dataset:
        from mklscale.datasets import load

        if args.target is not None or args.labels is not None:
            raise InvalidInputError("--target and --labels go with --features (your own data); a --dataset has its "
                                    "own targets: leave them out")
        ds = load(args.dataset, standardise=False)  # raw: the model's own standardisation maps them (issue 18)
        X, y, feature_names = ds.X, ds.y, ds.feature_names
        task = args.task or ("regression" if ds.task == "regression" else "classification")
    else:
        X, y, task = _own_data(args)
    estimator = _fit_estimator(args, task, kernels)
    try:
        estimator.fit(X, y)
    except BankTooLargeError as exc:  # worded with this command's options
        raise exc.respelled("cli-fit") from None
    estimator.save(args.out)
    print(f"model: {args.out}  kept {len(estimator.selected_kernels_)} kernel(s)  {_fit_scores(estimator, X, y)}")
    if feature_names is None:   # a table's column names, kept by the estimator
        feature_names = getattr(estimator, "feature_names_in_", None)
    for line in share_lines(estimator.model_.kernel_entries(feature_names), top=10):
        print(f"  {line}")
    return 0


def _fit_estimator(args, task: str, kernels):
    """The estimator ``mklscale fit`` fits: MKLClassifierCV / MKLRegressorCV (C chosen, or the given C
    scored, by --cv folds on the rows of the one bank), or with --cv 0 the plain estimator."""
    from mklscale import estimators

    C = _C_argument(args.C)
    if args.cv == 0 and C == "cv":
        raise InvalidInputError("--C cv chooses C by cross-validation and needs --cv 2 or more; give --cv 3, or a "
                                "number or auto for --C")
    if args.cv == 1 or args.cv < 0:
        raise InvalidInputError(f"--cv {args.cv}: give the number of folds (2 or more), or 0 for none")
    common = dict(kernels=kernels, solver=args.solver, solver_params=_params(args.param), rank=args.rank,
                  computed={"auto": "auto", "yes": True, "no": False}[args.computed],
                  cache_dir=None if args.cache_dir is None else str(args.cache_dir), progress=not args.quiet)
    classification = task == "classification"
    if args.cv == 0:
        Estimator = estimators.MKLClassifier if classification else estimators.MKLRegressor
        return Estimator(C=C, **common)
    Estimator = estimators.MKLClassifierCV if classification else estimators.MKLRegressorCV
    return Estimator(Cs=10 if C == "cv" else C if C == "auto" else [C], cv=args.cv, **common)


def _C_argument(text: str):
    """--C: "cv", "auto" or a number."""
    if text in ("cv", "auto"):
        return text
    try:
        return float(text)
    except ValueError:
        raise InvalidInputError(f"--C {text!r}: give cv (choose it by cross-validation), auto, or a number") from None


def _fit_scores(estimator, X, y) -> str:
    """The cross-validated score (when there is one) beside the training score."""
    metric = "accuracy" if hasattr(estimator, "classes_") else "R^2"
    train = f"training {metric} {estimator.score(X, y):.4f}"
    results = getattr(estimator, "cv_results_", None)
    if results is None:
        return f"{train} (no held-out score: --cv 0)"
    folds = sum(k.startswith("split") for k in results)
    chose = "chosen by" if len(estimator.Cs_) > 1 else "at"
    return (f"C = {estimator.C_:.4g} ({chose} {folds}-fold CV)  cv {metric} {estimator.best_score_:.4f} "
            f"+- {results['std_test_score'][estimator.best_index_]:.4f}  {train}")


def _check_fit_out(out: Path, overwrite: bool) -> None:
    """Refuse, before any work, an --out that holds a model (unless --overwrite) or anything else.

    A non-empty folder that is not a model, or a file, is refused even with --overwrite: mklscale
    replaces only what it wrote (``MKLModel.save`` refuses it too)."""
    from mklscale.model import is_model_dir

    if not out.exists() and not out.is_symlink():
        return
    if is_model_dir(out):
        if not overwrite:
            raise InvalidInputError(f"--out {out} already holds a model; pass --overwrite to replace it, or choose "
                                    "another --out")
        return
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return
    raise InvalidInputError(f"--out {out} exists and is not an mklscale model folder; choose another --out (a new or "
                            "empty folder: mklscale replaces only a model it wrote, even with --overwrite)")


def _own_data(args):
    """``fit --features`` with ``--target`` or ``--labels``: (X, y, task) read by ``mklscale.tabular``;
    a table's X is a DataFrame, so that the model keeps its column names (``feature_names_in_``)."""
    from mklscale import tabular

    if args.target is None and args.labels is None:
        raise InvalidInputError(f"--features {args.features} needs its targets: pass --labels y.npy and --task "
                                "classification|regression for .npy features (without --task the task is inferred "
                                "from the labels), or --target COLUMN for a .csv or .parquet table")
    table = tabular.read_table(args.features, target=args.target, labels=args.labels)
    task, note = tabular.check_task(table.y, args.task, f"--features {args.features}")
    if note:
        print(f"mklscale: {note}", file=sys.stderr)
    return _frame(table.X, table.feature_names), table.y, task


def _frame(X: np.ndarray, names):
    """X as a DataFrame with its column names (the estimators keep them), or as it is without names."""
    if names is None:
        return X
    import pandas as pd

    return pd.DataFrame(X, columns=list(names))


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
    model = estimator.model_
    if args.dataset:
        from mklscale.datasets import load

        if args.target is not None:
            raise InvalidInputError("--target names a column of a --features table; leave it out with --dataset")
        X = load(args.dataset, standardise=model.dataset_features == "standardised").X
    else:
        X = _predict_features(args, estimator)
    predict = estimator.predict
    if args.proba:
        try:
            predict = estimator.predict_proba
        except AttributeError as exc:
            reason = exc.__cause__ if exc.__cause__ is not None else exc
            raise InvalidInputError(f"--proba: {reason}. On the command line, leave out --proba to get the predicted "
                                    "labels") from None
    with warnings.catch_warnings(record=True) as caught:  # e.g. rows that look standardised (MKLModel)
        warnings.simplefilter("always", UserWarning)
        values = predict(X)
    for message in dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, UserWarning)):
        print(f"mklscale: warning: model {args.model}: {message}", file=sys.stderr)
    header = [f"proba_{_label_text(c)}" for c in estimator.classes_] if args.proba else ["prediction"]
    if args.out is None:
        sys.stdout.write(_csv_text(header, values))
        return 0
    from mklscale.runtime.atomic import output_error, write_file

    if args.out.suffix == ".csv":
        out, text = args.out, _csv_text(header, values).encode("utf-8")
        write = lambda fh: fh.write(text)  # noqa: E731
    else:  # numpy.save's rule: .npy is appended to any other name
        out = args.out if args.out.suffix == ".npy" else args.out.with_name(args.out.name + ".npy")
        write = lambda fh: np.save(fh, np.asarray(values), allow_pickle=False)  # noqa: E731
    try:
        write_file(out, write)
    except OSError as exc:
        raise output_error(out, exc, "the predictions") from None
    return 0


def _label_text(label) -> str:
    """A class label as a column name: integral floats without their '.0' (-1.0 -> '-1')."""
    value = label.item() if isinstance(label, np.generic) else label
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _csv_text(header: list[str], values) -> str:
    """Predictions as CSV: a header row (``prediction``, or ``proba_<class>`` per class), one row per sample."""
    import csv

    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    rows = np.asarray(values)
    writer.writerows(rows.reshape(rows.shape[0], -1).tolist())
    return text.getvalue()


def _predict_features(args, estimator):
    """``predict --features``: a table's columns by the model's feature names when it has them (the
    others, the target among them, are ignored), else all its columns but ``--target``."""
    from mklscale import tabular

    names = getattr(estimator, "feature_names_in_", None)
    if tabular.kind(args.features) in ("csv", "parquet") and names is not None:
        table = tabular.read_table(args.features, columns=list(names))
        return _frame(table.X, table.feature_names)
    table = tabular.read_table(args.features, drop=args.target)
    expected = getattr(estimator, "n_features_in_", None)
    if table.feature_names is not None and expected is not None and len(table.feature_names) != expected:
        raise InvalidInputError(f"--features {args.features} has {len(table.feature_names)} feature column(s) "
                                f"({', '.join(table.feature_names)}) but the model {args.model} was fitted on "
                                f"{expected} (without column names); give those {expected} columns in the order of "
                                "fit, leaving out the target with --target COLUMN")
    return table.X


def _cmd_report(args) -> int:
    from mklscale.report import write_report

    write_report(args.run_dir)  # prints where the report went
    return 0


def _load_features(args) -> np.ndarray:
    if args.dataset:
        from mklscale.datasets import load

        X = load(args.dataset).X
    else:
        X = None
    if args.rows is not None and args.rows < 2:
        raise InvalidInputError(f"--rows must be >= 2, got {args.rows}; give --rows 2 or more (or leave it out "
                                "for all rows)")
    if X is None:  # only the rows asked for are read from the file
        from mklscale.tabular import read_table

        return read_table(args.features, drop=args.target, rows=args.rows).X
    if args.target is not None:
        raise InvalidInputError("--target names a column of a --features table; leave it out with --dataset")
    return X if args.rows is None else X[: args.rows]


def _build_features(args):
    """The features of ``bank build``: a ``.npy`` file given alone (no --rows, --target, --dataset) is
    passed on as its path, which ``build_bank`` reads by column blocks (``bank.features``: a 500 x 10^6
    file is never loaded whole), after ``read_table``'s checks and messages on its first rows;
    anything else is read by ``_load_features``."""
    from mklscale.tabular import kind, read_table

    if (args.dataset or args.features is None or args.rows is not None or args.target is not None
            or kind(Path(args.features)) != "npy"):
        return _load_features(args)
    read_table(args.features, rows=2)  # the file, its shape and dtype (every value: build_bank's scan)
    from mklscale.bank.features import FeatureSource

    return FeatureSource(Path(args.features), f"--features {args.features}")


def _cmd_build(args) -> int:
    from mklscale.bank import build_bank, families
    from mklscale.bank.size import check_fits, count_kernels

    kernels = _kernels(args)
    X = _build_features(args)
    check_fits(args.out, count_kernels(kernels, X.shape[1]), X.shape[0], args.dtype, args.rank,
               n_features=X.shape[1], overwrite=args.overwrite, spelling="cli-build", computed=args.computed)
    specs = families.resolve(kernels, X.shape[1])
    normalize = None if args.normalize == "none" else args.normalize
    kw = dict(normalize=normalize, dtype=args.dtype, overwrite=args.overwrite, progress=not args.quiet,
              computed=args.computed)
    factor = {"method": args.method, "landmarks": args.landmarks, "tol": args.tol, "max_error": args.max_error}
    given = {k: v for k, v in factor.items() if v is not None}
    if args.rank is not None:
        kw.update(rank=args.rank, **given)   # what is not given: build_bank's defaults (bank.factor.FactorSettings)
    elif given:
        raise InvalidInputError(f"{', '.join('--' + k.replace('_', '-') for k in given)} apply to factor banks only; "
                                "add --rank R")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            if args.cluster is None:
                bank = build_bank(X, specs, bank_location(args.out), **kw)
            else:
                from mklscale.runtime.cluster import load_cluster_config, open_client

                with open_client(load_cluster_config(args.cluster), quiet=args.quiet) as client:
                    bank = build_bank(X, specs, bank_location(args.out), client=client, **kw)
        except Stopped as exc:
            raise Stopped(exc.signum, f"stopped by {exc.signal_name}: {_saved_kernels(args.out)}; run the same "
                                      f"command again to compute the rest: {_command_line(args)}") from None
    for w in caught:
        if issubclass(w.category, UserWarning):
            print(f"mklscale: warning: {w.message}", file=sys.stderr)
    factor = "" if bank.rank is None else f"  factor rank {bank.rank}"
    print(f"bank: {bank.path}  M={len(bank)} kernels  n={bank.n}{factor}  {bank.nbytes / 1e9:.3f} GB  "
          f"({bank.last_build_computed} computed now)")
    return 0


def _saved_kernels(path: Path) -> str:
    """'K of M kernels are saved in PATH' for a bank a stop interrupted (or 'nothing was saved'); a
    build stopped while it waited for another writer says that it wrote nothing."""
    from mklscale.bank import KernelBank
    from mklscale.bank.storage import storage_for

    other = storage_for(bank_location(path)).other_writer()
    if other:
        return f"it was waiting for {other} to finish writing {path} and wrote nothing"
    try:
        bank = KernelBank.open(bank_location(path))
        return f"{int(bank.complete.sum())} of {len(bank)} kernels are saved in {path}"
    except Exception:  # noqa: BLE001 - no bank yet, or not readable: nothing to count
        return "no kernel was saved yet"


def bank_location(text: str):
    """A bank argument: a folder (Path) or an s3:// URL (``bank.location``); other schemes are refused."""
    from mklscale.bank.storage.location import bank_location as parse

    return parse(text)


def _open_bank(path: str):
    """The bank at ``path``; a path that is not a bank gets a message saying what to give instead."""
    from mklscale.bank import KernelBank

    return KernelBank.open(bank_location(path))


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
          f"  normalize: {info['normalize']}\n  size: {info['bytes'] / 1e9:.3f} GB "
          + (f"in {info['n_shards']} shard(s), {info['layout']['kernels_per_chunk']} kernel(s) per chunk, "
             f"{info['layout']['kernels_per_shard']} per shard" if bank.stores_kernels else
             f"of kernels, none stored (passes compute them in tasks of {info['layout']['kernels_per_shard']})"))
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
        print("  representation: " + ("dense" if bank.stores_kernels else
                                      f"computed (no kernel stored: computed from the {bank.group['X'].shape[1]} "
                                      "features in every pass)"))
    lam, rel = bank.lambda_max, ("=" if bank.stores_kernels else "<=")  # a computed bank's: a bound (stats.lambda_bound)
    for m in range(min(len(bank), 5)):
        print(f"  [{m}] {bank.specs[m].name}  lambda_max{rel}{lam[m]:.4g}")
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


def _cmd_copy(args) -> int:
    from mklscale.bank.transfer import copy_bank

    report = copy_bank(args.src, args.dst, overwrite=args.overwrite, progress=not args.quiet)
    print(f"copied {bank_location(args.src)} -> {bank_location(args.dst)}; {report}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
