"""A run's bank: built (or resumed, or reused) from [bank]'s families on the training rows, or
imported from the user's Gram matrices ([bank] grams); with its results.json entry."""

from __future__ import annotations

import collections
import time
import warnings
from pathlib import Path

import numpy as np

from mklscale.bank.storage.location import placed
from mklscale.errors import ConfigError
from mklscale.pipeline.console import Stage, summary
from mklscale.pipeline.data import Data
from mklscale.pipeline.spec import Pipeline


def prepare_bank(pipe: Pipeline, data: Data, run_dir: Path, client, quiet: bool, say, overwrite: bool = False,
                 stage: Stage | None = None):
    """Build (or resume, or reuse) the bank on the training rows; return it and its results entry.

    ``overwrite`` replaces a bank of other data in the run directory (never a shared bank given by
    an absolute path)."""
    from mklscale.bank import build_bank, families
    from mklscale.errors import BankMismatchError

    from mklscale.bank.size import check_fits, count_kernels

    cfg = pipe.bank
    # a storage option never reaches results or logs: the location hides them
    path, shared = placed(cfg["path"], run_dir, cfg.get("storage_options"))
    if cfg["grams"] is not None:
        return _import_grams(pipe, data, path, say, overwrite and not shared, stage)
    check_fits(path, count_kernels(cfg["kernels"], data.X_train.shape[1]), len(data.y_train), cfg["dtype"],
               (cfg.get("factor") or {}).get("rank"), n_features=data.X_train.shape[1],
               overwrite=overwrite and not shared, spelling="pipeline", computed=cfg.get("computed", False))
    specs = families.resolve(cfg["kernels"], data.X_train.shape[1])
    if stage is not None:
        stage.doing, stage.bank = "building the bank", path
    normalize = None if cfg["normalize"] == "none" else cfg["normalize"]
    say(f"[{pipe.name}] bank: {len(specs)} kernels, n = {len(data.y_train)} -> {path}")
    t0 = time.perf_counter()
    factor = cfg.get("factor") or {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            bank = build_bank(data.X_train, specs, path, normalize=normalize, dtype=cfg["dtype"], client=client,
                              progress=not quiet, overwrite=overwrite and not shared,
                              computed=cfg.get("computed", False), **factor)
        except BankMismatchError:
            remedy = ("remove it or give [bank] path another folder" if shared else
                      "pass --overwrite to mklscale run (run_pipeline: overwrite=True) to rebuild it, or choose "
                      "another --out")
            raise BankMismatchError(f"the bank {path} was built from other data or settings than this pipeline's "
                                    f"training rows and [bank]; {remedy}") from None
    for w in caught:
        summary(f"[{pipe.name}] bank: warning: {w.message}")
    info = {"path": str(path), "M": len(bank), "n": bank.n, "dtype": cfg["dtype"], "normalize": cfg["normalize"],
            **({"representation": "computed"} if cfg.get("computed") else {}),
            **({} if not factor else {"representation": "factor", **factor,
                                      "approx_error_max": float(np.nanmax(bank.approx_error))}),
            "build_seconds": time.perf_counter() - t0, "kernels_computed": getattr(bank, "last_build_computed", None),
            "families": dict(collections.Counter(s.family for s in specs))}
    return bank, info


def _import_grams(pipe: Pipeline, data: Data, path, say, overwrite: bool, stage: Stage | None):
    """[bank] grams: the training rows' Gram matrices imported into the run's bank (``KernelBank.from_arrays``:
    checked symmetric and PSD, sized against the disk first); a resumed run reuses the bank it imported."""
    from mklscale.bank import KernelBank

    cfg = pipe.bank
    if stage is not None:
        stage.doing, stage.bank = "importing the Gram matrices", path
    normalize = None if cfg["normalize"] == "none" else cfg["normalize"]
    say(f"[{pipe.name}] bank: {data.X_train.shape[0]} Gram matrices of {cfg['grams']}, n = {len(data.y_train)} -> {path}")
    t0 = time.perf_counter()
    if KernelBank.is_bank(path) and not overwrite:
        bank = KernelBank.open(path)
        if bank.M != data.X_train.shape[0] or bank.n != len(data.y_train):
            raise ConfigError(f"the bank {path} holds {bank.M} kernels over {bank.n} rows, not this run's training "
                              f"Gram matrices; pass --overwrite to replace it, or choose another --out")
        computed = 0
    else:
        bank = KernelBank.from_arrays(data.X_train, path, names=cfg["names"], normalize=normalize, dtype=cfg["dtype"],
                                      overwrite=overwrite)
        computed = len(bank)
    info = {"path": str(path), "M": len(bank), "n": bank.n, "dtype": cfg["dtype"], "normalize": cfg["normalize"],
            "grams": str(cfg["grams"]), "build_seconds": time.perf_counter() - t0, "kernels_computed": computed,
            "families": {"precomputed": len(bank)}}
    return bank, info
