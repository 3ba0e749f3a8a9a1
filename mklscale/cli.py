"""The ``mklscale`` command.

    mklscale bank build --dataset breast_cancer --family simplemkl --out bank.zarr
    mklscale bank build --features X.npy --family gaussian --widths 0.5 1 2 --out bank.zarr
    mklscale bank info PATH
    mklscale bank verify PATH

Exit codes: 0 success; 1 ``verify`` found problems; 2 bad input or a bank that cannot be used
(the message says what to do).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

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
    sub = p.add_subparsers(title="commands")
    bank = sub.add_parser("bank", help="build, inspect and verify kernel banks").add_subparsers(title="bank commands")

    b = bank.add_parser("build", help="compute a bank of Gram matrices from features")
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--dataset", help="an offline dataset name (see mklscale.datasets.available())")
    src.add_argument("--features", type=Path, help="a .npy file with an (n, d) feature matrix")
    b.add_argument("--family", choices=FAMILY_CHOICES, default="simplemkl")
    b.add_argument("--widths", type=float, nargs="+", default=[0.5, 1, 2, 5], help="gaussian widths s in exp(-||x-z||^2/(2 s^2))")
    b.add_argument("--degrees", type=int, nargs="+", default=[1, 2, 3], help="polynomial degrees")
    b.add_argument("--n-kernels", type=int, default=100, help="random_subsets: number of kernels")
    b.add_argument("--seed", type=int, default=0, help="random_subsets: seed")
    b.add_argument("--rows", type=int, default=None, help="use only the first ROWS rows (default: all)")
    b.add_argument("--normalize", choices=("trace", "diag", "none"), default="trace")
    b.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    b.add_argument("--scheduler", default=None, help="address of a running Dask scheduler (default: in-process threads)")
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
    return p


def _load_features(args) -> np.ndarray:
    if args.dataset:
        from mklscale.datasets import load

        X = load(args.dataset).X
    else:
        if not args.features.is_file():
            raise InvalidInputError(f"--features {args.features}: no such file")
        try:
            X = np.load(args.features, allow_pickle=False)
        except ValueError as exc:
            raise InvalidInputError(f"--features {args.features}: not a plain .npy array ({exc})") from None
    if args.rows is not None:
        if args.rows < 2:
            raise InvalidInputError(f"--rows must be >= 2, got {args.rows}")
        X = X[: args.rows]
    return X


def _specs(args, d: int):
    from mklscale.bank import families

    if args.family == "simplemkl":
        return families.simplemkl(d)
    if args.family == "gaussian":
        return families.gaussian(args.widths)
    if args.family == "polynomial":
        return families.polynomial(args.degrees)
    if args.family == "linear":
        return families.linear()
    return families.random_subsets(d, args.n_kernels, seed=args.seed)


def _cmd_build(args) -> int:
    from mklscale.bank import build_bank

    X = _load_features(args)
    specs = _specs(args, X.shape[1])
    client = None
    if args.scheduler:
        from distributed import Client

        try:
            client = Client(args.scheduler, timeout="20s")
        except OSError as exc:
            raise InvalidInputError(f"cannot reach the Dask scheduler at {args.scheduler}: {exc}") from None
    try:
        bank = build_bank(X, specs, args.out, normalize=None if args.normalize == "none" else args.normalize,
                          dtype=args.dtype, client=client, overwrite=args.overwrite, progress=not args.quiet)
    finally:
        if client is not None:
            client.close()
    print(f"bank: {bank.path}  M={len(bank)} kernels  n={bank.n}  {bank.nbytes / 1e9:.3f} GB  "
          f"({bank.last_build_computed} computed now)")
    return 0


def _cmd_info(args) -> int:
    from mklscale.bank import KernelBank

    bank = KernelBank.open(args.path)
    complete = bank.complete
    info = {
        "path": str(bank.path), "M": len(bank), "n": bank.n, "dtype": bank.dtype.name,
        "normalize": bank.normalize, "bytes": bank.nbytes, "complete": int(complete.sum()),
        "layout": bank.attrs["layout"], "n_shards": bank.n_shards,
        "families": {f: sum(s.family == f for s in bank.specs) for f in sorted({s.family for s in bank.specs})},
        "created": bank.attrs.get("created"),
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{info['path']}\n  kernels: {info['M']} ({info['complete']} complete)  n: {info['n']}  dtype: {info['dtype']}"
          f"  normalize: {info['normalize']}\n  size: {info['bytes'] / 1e9:.3f} GB in {info['n_shards']} shard(s), "
          f"{info['layout']['kernels_per_chunk']} kernel(s) per chunk, {info['layout']['kernels_per_shard']} per shard")
    print("  families: " + ", ".join(f"{k}={v}" for k, v in info["families"].items()))
    lam = bank.lambda_max
    for m in range(min(len(bank), 5)):
        print(f"  [{m}] {bank.specs[m].name}  lambda_max={lam[m]:.4g}")
    if len(bank) > 5:
        print(f"  ... {len(bank) - 5} more")
    return 0


def _cmd_verify(args) -> int:
    from mklscale.bank import KernelBank

    report = KernelBank.open(args.path).verify(progress=not args.quiet)
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
