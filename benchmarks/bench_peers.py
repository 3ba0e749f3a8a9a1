"""mklscale against MKLpy 0.6 on the same Gram matrices, in the same run (issue 10, item 1), and
cvxpy (Clarabel) on the QCQP (L) next to SMO-MKL and SpicyMKL at small sizes.

    bash benchmarks/peers/setup_mklpy_venv.sh      # once: MKLpy 0.6 + CPU torch in its own venv
    python benchmarks/bench_peers.py --quick       # breast_cancer, n = 100, M = 20; cvxpy at M = 10 (~2 min)
    python benchmarks/bench_peers.py               # breast_cancer, ringnorm, digits x n {200, 500}
                                                   # x M {100, 1000}; cvxpy at n = 100, M {10, 50}
                                                   # (~45 min on 2 cores: MKLpy's iterative methods run to
                                                   # convergence and the CV of 4 peers + SpicyMKL hinge
                                                   # dominate; M = 3000 is left out for that, --M adds it)
    python benchmarks/bench_peers.py --tasks ringnorm --n 8000 --M 20 --rank 128 \
        --mklpy-methods EasyMKL,AverageMKL --our-methods easymkl,uniform,spicy_logistic --no-cvxpy
                                                   # large n (issue 17): MKLpy's in-memory lists against
                                                   # ours on the dense bank and on a rank-128 factor bank

Protocol. For each task, n and M: the bank is ``build_bank`` on the n training rows with
``families.random_subsets(d, M, seed)`` (Gaussian kernels on random feature subsets, width
5 chi^2_1 + 0.1; the same first kernels at every M), unit diagonal (``normalize="diag"``), float32,
under --workdir (never in the repository). The test rows (up to --n-test, disjoint from the training
rows, the same rows for every M) get their cross kernels from ``bank.cross(X_test)``, which applies
the training standardisation and normalisation. Train and test Gram matrices are streamed into one
uncompressed .npz (float32; no pickle) that ``benchmarks/peers/run_mklpy.py`` reads inside the MKLpy
virtual environment: MKLpy holds every train kernel in memory as a float64 torch tensor (and every
test kernel to predict), which is the point of the comparison; the fold array of the CV travels in it too.

Fits run outside the driver, and peak memory is the peak resident set of the process that fits.
MKLpy: the driver (run_mklpy.py) first fits and predicts every method once on a tiny problem
(warm-up, untimed: lazy imports and first-call set-up, inherited by the forks), then loads the TRAIN
kernels only (float64, as MKLpy holds them; no float32 copy stays) and forks one process per method;
its peak (``peak_rss_GB``) is that process's ru_maxrss read right after ``fit`` returns (the train
kernels it inherited count: they are resident in it). The process then loads the test kernels and
predicts; the peak of the whole process is ``predict_peak_rss_GB``. Ours: one worker process per
grid point runs the methods one after the other, each first warmed up on a tiny bank (numba compiles
on first use; not timed), peak = VmHWM after resetting it before each method's fit
(/proc/self/clear_refs), read when the fit returns (``peak_rss_GB``) and after the prediction
(``predict_peak_rss_GB``); each opens the bank through ``Engine(bank)`` (block cache --cache-bytes),
reads it from disk (the page cache, in practice: the bank was just written) during the fit with the
copying reader (MKLSCALE_MAP_BYTES=0: the default mapped reader is faster, but its mapped page-cache
pages would count in VmHWM although the process does not own them), and
computes the cross kernels of the active kernels only, in chunks, to predict. Both sides
run under the same address-space cap (--mem-limit-gb, RLIMIT_AS) and the same per-fit wall-time limit
(--time-limit, fit plus prediction; a CV has its own, --cv-time-limit); a fit that exceeds either is recorded as a failure with its
message. A method that timed out or ran out of memory at (n', M') is not run at any n >= n', M >= M'
(of any later task), nor where its time predicted from the largest smaller grid point it ran at,
t (M / M') (n / n')^2, exceeds the limit: that is recorded as "not run" with the reason.

Equal footing (issue 21). Matched pairs (MATCH: AverageMKL / UNIFORM, CKA / alignment, EasyMKL /
EasyMKL, FHeuristic / FHeuristic) solve the same problem, so both sides use the same constants: SVM
C = --C with libsvm's default tol 1e-3 on both sides (sklearn SVC(kernel="precomputed")), EasyMKL lam
--easy-lam with a KOMD(lam 0.1) learner; ``agreement`` per pair records the share of test rows both
label alike, the test-accuracy difference and the largest difference of the kernel weights
(normalised to sum one). The other peers (PWMK, GRAM, RMKL, MEMO) solve other problems than SpicyMKL
hinge, their reference: each side's constant is chosen by the same stratified --cv-folds-fold CV
(``cv_folds``: ``cv.fold_assignment`` with --seed; the same fold array goes to MKLpy in the npz and
is what ``model_selection.select`` uses on ours) on the training part, accuracy, ties to the more
regularised value, over 4 values per side: MKLpy's SVM C in MKLPY_C_GRID = {0.1, 1, 10, 100} (SVC
learner's C, and RMKL's own C), on the principal submatrices of the train kernels in memory; ours
SpicyMKL hinge's C over ``model_selection``'s "auto" grid C_max x {0.1, 0.03, 0.01, 0.003}, on row
subsets of the bank (``RowSubsetEngine``). The timed fit is then the fit on the whole training part at
the chosen value; the chosen value (``C``), the CV record (``cv``: grid, mean and fold scores) and
``cv_seconds`` are recorded per side. Stopping rules: GRAM / RMKL / MEMO run to MKLpy's own rule,
``ReduceOnWorsening`` (learning rate 0.01 halved on every step that worsens the objective; converged
when it falls below 1e-7; MKLpy 0.6 has no other test, its tolerance check is commented out) with an
iteration cap --mklpy-max-iter (default 2000); ``iterations`` and ``stopped_on`` (scheduler or
max_iter) are recorded. SpicyMKL stops at a relative duality gap 0.01 (``converged``, ``gap``,
``iterations`` = outer iterations); SMO-MKL at the paper's rule; EasyMKL's and the SVMs' QPs at
their solvers' tolerances (cvxopt, libsvm 1e-3). --no-cv uses --C everywhere instead.

With --rank R our methods run a second time on a factor bank of the same kernels (``build_bank(...,
rank=R)``: Nystrom on k-means++ landmarks, K~_m = L_m L_m^T, n x R per kernel) and predict through
the fitted model's landmarks (``MKLModel.decision_function``); recorded as "ours_factor" with the
build time, the bank's size and its approximation error (tr K - tr K~) / tr K.

Methods, with the SVM constant C = --C where they have one, except the cross-validated ones above. MKLpy: EasyMKL (lam 0.1, its
default KOMD learner), AverageMKL, FHeuristic, PWMK (its own internal 3-fold CV for the weights), CKA (SVC learners), and the
iterative GRAM, RMKL, MEMO (SVC learner, learning rate 0.01, ReduceOnWorsening scheduler, as in
MKLpy's documentation; run to convergence, above). mklscale: SpicyMKL block-1 (hinge and
logistic; relative gap 0.01), SMO-MKL (the paper's stopping rule), UNIFORM and the alignment
baseline (AMKL, Cortes et al.), EasyMKL (lam 0.1, KOMD(lam 0.1) learner, kernels as given:
MKLpy's settings) and FHeuristic (SVC(C)). The ratio is the peer's fit time over the matching
mklscale method's: AverageMKL / UNIFORM, CKA / alignment, EasyMKL / EasyMKL, FHeuristic /
FHeuristic, every other peer / SpicyMKL hinge.

The cvxpy part solves the QCQP (L) of Lanckriet et al. with Clarabel (the SMO-MKL paper's oracle;
time includes the eigen-factorisations), SMO-MKL with a certified relative gap 1e-4 (as bench_smo_citi.py), and SpicyMKL
hinge block-1 with C' = sum_m ||f_m*|| / C taken from the SMO solution (the same solution, as in
tests/test_smo.py), relative gap 1e-6; objectives are compared in each problem's own terms.
Results: benchmarks/results/bench_peers[_quick].json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
RESULTS = HERE / "results"
GB = 1e9

MKLPY_METHODS = ("EasyMKL", "AverageMKL", "FHeuristic", "PWMK", "CKA", "GRAM", "RMKL", "MEMO")
OUR_METHODS = ("spicy_hinge", "spicy_logistic", "smo", "uniform", "alignment", "easymkl", "fheuristic")
OUR_LABELS = {"spicy_hinge": "SpicyMKL hinge (block-1)", "spicy_logistic": "SpicyMKL logistic (block-1)",
              "smo": "SMO-MKL", "uniform": "UNIFORM", "alignment": "alignment (AMKL)",
              "easymkl": "EasyMKL (KOMD learner)", "fheuristic": "FHeuristic"}
MATCH = {"AverageMKL": "uniform", "CKA": "alignment", "EasyMKL": "easymkl",
         "FHeuristic": "fheuristic"}  # else spicy_hinge
TASKS = ("breast_cancer", "ringnorm", "digits")
#: peers that solve another problem than their matched mklscale method (SpicyMKL hinge): each side's
#: regularisation constant is chosen by the same k-fold CV (same fold rows) before the timed fit
CV_MKLPY = ("PWMK", "GRAM", "RMKL", "MEMO")
CV_OURS = ("spicy_hinge",)
#: MKLpy's CV grid: the SVM constant on unit-diagonal kernels, model_selection.SVM_FACTORS and 100
#: (4 values, as many as ours: SpicyMKL's "auto" grid C_max x model_selection.PENALTY_FACTORS)
MKLPY_C_GRID = (0.1, 1.0, 10.0, 100.0)
SPICY_PARAMS = {"loss": "hinge", "penalty": "l1", "tol": 0.01}


# ----------------------------------------------------------------------------------------- data
def task_split(name: str, n: int, n_test: int, seed: int):
    """(X_train, y_train, X_test, y_test): a seeded permutation, first n rows train, the next test rows."""
    from mklscale.datasets import load

    ds = load("ringnorm", n_samples=max(1000, n + n_test), seed=seed) if name == "ringnorm" else load(name)
    perm = np.random.default_rng(seed).permutation(ds.y.size)
    tr, te = perm[:n], perm[n:n + n_test]
    return ds.X[tr], ds.y[tr], ds.X[te], ds.y[te]


def _write_npy_stream(zf: zipfile.ZipFile, name: str, shape: tuple, dtype, chunks) -> None:
    """One .npy member of an uncompressed npz written chunk by chunk along the first axis."""
    with zf.open(name + ".npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_2_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                 "fortran_order": False, "shape": tuple(int(s) for s in shape)})
        for block in chunks:
            f.write(np.ascontiguousarray(block, dtype=dtype).tobytes())


def cv_folds(y: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Fold index per training row, the split both sides' CV uses: ``cv.fold_assignment`` (stratified,
    seeded), the function ``model_selection.select`` (our side) calls with the same seed; MKLpy gets
    this array in the npz."""
    from mklscale.solvers import cv

    return cv.fold_assignment(np.asarray(y), folds, True, seed)


def export_npz(bank, X_test, y_train, y_test, path: Path, chunk_bytes: float = 2**30, fold=None) -> dict:
    """K_train (M, n, n), K_test (M, n_test, n) float32, y_train, y_test, fold (CV fold per training
    row, if given) -> path (no pickle); kernels are
    read in chunks of about chunk_bytes (64 kernels at n = 2000; one at n = 8000: a 20-kernel chunk at
    n = 8000 drove this process to 22 GB and the OOM killer)."""
    t0 = time.perf_counter()
    M, n = len(bank), bank.n
    chunk = int(max(1, min(64, chunk_bytes // (n * n * 4))))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        small = [("y_train", y_train), ("y_test", y_test)] + ([] if fold is None else [("fold", fold)])
        for key, arr in small:
            with zf.open(key + ".npy", "w") as f:
                np.lib.format.write_array(f, np.asarray(arr, dtype=np.int64 if key == "fold" else np.float64),
                                          allow_pickle=False)
        ranges = [list(range(a, min(a + chunk, M))) for a in range(0, M, chunk)]
        _write_npy_stream(zf, "K_train", (M, n, n), np.float32, (bank.kernels(r) for r in ranges))
        _write_npy_stream(zf, "K_test", (M, len(y_test), n), np.float32, (bank.cross(X_test, kernels=r) for r in ranges))
    return {"export_seconds": time.perf_counter() - t0, "npz_GB": path.stat().st_size / GB}


# ------------------------------------------------------------------------------ our fit (worker)
def decision_chunked(res, bank, X_test, chunk: int = 64) -> np.ndarray:
    """res.decision_function_from_kernels over the active kernels, computed chunk by chunk so that
    at most ``chunk`` cross kernels are in memory (identical to the one-shot call)."""
    active = res.active
    if active.size <= chunk:
        return res.decision_function_from_kernels(bank.cross(X_test, kernels=active))
    f = np.zeros(X_test.shape[0])
    for a in range(0, active.size, chunk):
        idx = active[a:a + chunk]
        K = bank.cross(X_test, kernels=idx)
        f += np.einsum("m,mij->ij", res.weights[idx], K) @ res.dual_coef
    return f + res.bias


def predict(res, bank, X_test) -> np.ndarray:
    """Decision values on X_test: cross kernels of the active kernels (dense banks), or the fitted
    model's landmarks (factor banks: L_m(x) v_m)."""
    if bank.rank is None:
        return decision_chunked(res, bank, X_test)
    from mklscale.model import MKLModel

    return MKLModel.from_results(bank, res, "classification", classes=[-1.0, 1.0]).decision_function(X_test)


def cv_ours(method: str, bank, y, folds: int, seed: int, state: Path) -> dict:
    """``model_selection.select`` on the bank (folds are row subsets of the stored Gram matrices):
    SpicyMKL hinge's C over its "auto" grid, accuracy, ties to the more regularised value."""
    from mklscale import model_selection

    assert method == "spicy_hinge", method
    entry = {"solver": "spicy", "name": method, "C": "auto", "params": dict(SPICY_PARAMS)}
    req = model_selection.Request(key="C", values="auto", folds=folds)
    return model_selection.select(entry, req, bank, "classification", y, [-1.0, 1.0], None, seed, state,
                                  False, lambda _msg: None)


def _fit_ours(method: str, engine, y, C, easy_lam: float = 0.1):
    from mklscale.solvers import baselines, easymkl, fheuristic, smo, spicy

    if method == "spicy_hinge":
        return spicy.fit(engine, y, C, **SPICY_PARAMS)
    if method == "spicy_logistic":
        return spicy.fit(engine, y, C, loss="logistic", penalty="l1", tol=0.01)
    if method == "smo":
        return smo.fit(engine, y, C)
    if method == "uniform":
        return baselines.uniform(engine, y, C=C)
    if method == "alignment":
        return baselines.alignment(engine, y, C=C)
    if method == "easymkl":  # MKLpy's settings: lam, KOMD(lam=0.1) learner, kernels as given
        return easymkl.fit(engine, y, lam=easy_lam, learner="komd", komd_lam=0.1, tracenorm=False)
    if method == "fheuristic":
        return fheuristic.fit(engine, y, task="classification", C=C)
    raise ValueError(f"unknown method {method!r}")


def _hwm_reset() -> None:
    """Release freed memory, then restart the peak-RSS count (Linux: /proc/self/clear_refs 5)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _hwm_GB() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / GB
    return float("nan")


def worker(args) -> int:
    """Our fits, one after the other in this process: each line of --worker-out (JSON lines) is
    {"start": method} or a result. Numba compiles on first use, so every method is first run on a
    tiny bank (warm-up, not timed: MKLpy's imports are not timed either); the peak resident set of
    each fit + prediction is VmHWM after resetting it (clear_refs) before the method."""
    if args.mem_limit_gb:
        lim = int(args.mem_limit_gb * GB)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    log = open(args.worker_out, "a", buffering=1)  # noqa: SIM115  (one line per event, closed at the end)
    from mklscale.bank import KernelBank, build_bank
    from mklscale.engine import Engine

    z = np.load(args.task_npz, allow_pickle=False)
    y, X_test, y_test = z["y_train"], z["X_test"], z["y_test"]
    bank = KernelBank.open(args.bank)
    rank = bank.rank  # None: dense
    methods = args.worker.split(",")
    t0 = time.perf_counter()
    try:  # warm-up on a tiny bank with the same specs and rows
        k = min(40, y.size)
        factor = {} if rank is None else {"rank": min(rank, k // 2), "max_error": 1.0}
        tiny = build_bank(bank.X_train[:k], bank.specs[:min(8, len(bank))], Path(args.bank).parent / "tiny_warmup",
                          normalize="diag", standardize=False, overwrite=True, progress=False, **factor)
        for m in methods:
            with Engine(tiny) as eng:
                r = _fit_ours(m, eng, y[:k], args.C, args.easy_lam)
            predict(r, tiny, tiny.X_train[:5])
    except Exception as exc:  # noqa: BLE001
        print(f"warm-up failed: {exc}", file=sys.stderr)
    warm = time.perf_counter() - t0
    cv_methods = [m for m in (args.cv_ours or "").split(",") if m]
    for m in methods:
        out = {"method": m, "warmup_seconds": warm}
        C = args.C
        if m in cv_methods:  # before the timed fit, in its own phase (own time limit, not in the fit's peak)
            log.write(json.dumps({"start": m, "phase": "cv"}) + "\n")
            try:
                cv = cv_ours(m, bank, y, args.cv_folds, args.seed, Path(args.bank).parent / f"cv_{m}.json")
            except BaseException as exc:  # noqa: BLE001
                out.update(status="error", message=f"CV: {type(exc).__name__}: {exc}"[:2000])
                log.write(json.dumps(out, default=float) + "\n")
                continue
            out.update(cv=cv, cv_seconds=cv["seconds"])
            C = cv["chosen"]
        log.write(json.dumps({"start": m}) + "\n")
        _hwm_reset()
        try:
            t0 = time.perf_counter()
            with Engine(bank, cache_bytes=args.cache_bytes) as engine:
                res = _fit_ours(m, engine, y, C, args.easy_lam)
                out["fit_seconds"] = time.perf_counter() - t0
                out["passes"] = int(engine.stats["passes"])
            out["fit_peak_rss_GB"] = _hwm_GB()
            t0 = time.perf_counter()
            f = predict(res, bank, X_test)
            out["predict_seconds"] = time.perf_counter() - t0
            pred = np.where(f >= 0, 1.0, -1.0)
            out.update(status="ok", test_accuracy=float(np.mean(pred == y_test)), C=C,
                       n_nonzero_weights=int(res.n_active), converged=bool(res.converged), gap=float(res.gap),
                       objective=float(res.objective), iterations=len(res.history),
                       weights=np.asarray(res.weights, dtype=np.float64).tolist(), test_pred=pred.tolist())
            del res, f
        except BaseException as exc:  # noqa: BLE001
            out.update(status="error", message=f"{type(exc).__name__}: {exc}"[:2000])
        if "fit_peak_rss_GB" in out:  # peak_rss_GB: the fit's (as MKLpy's); the process's with prediction apart
            out["predict_peak_rss_GB"], out["peak_rss_GB"] = _hwm_GB(), out.pop("fit_peak_rss_GB")
        else:
            out["peak_rss_GB"] = _hwm_GB()
        log.write(json.dumps(out, default=float) + "\n")
    log.close()
    return 0


def run_ours(methods: list[str], bank_path: Path, task_npz: Path, args) -> dict:
    """Our methods in worker processes; a method running longer than the time limit is killed
    (with its worker) and recorded as a timeout, and a new worker takes the remaining methods."""
    out_path = Path(args.workdir) / "ours.jsonl"
    results: dict = {}
    todo = list(methods)
    while todo:
        out_path.unlink(missing_ok=True)
        cmd = [sys.executable, __file__, "--worker", ",".join(todo), "--bank", str(bank_path), "--task-npz",
               str(task_npz), "--worker-out", str(out_path), "--C", str(args.C), "--cache-bytes", args.cache_bytes,
               "--easy-lam", str(args.easy_lam), "--cv-folds", str(args.cv_folds), "--seed", str(args.seed),
               "--cv-ours", ",".join(m for m in CV_OURS if args.cv)]
        if args.mem_limit_gb:
            cmd += ["--mem-limit-gb", str(args.mem_limit_gb)]
        errf = open(Path(args.workdir) / "ours.stderr", "w+")  # noqa: SIM115  (closed after the worker)
        # the copying reader (engine/reader.py): mapped shard files would count in VmHWM as file pages
        env = dict(os.environ, MKLSCALE_MAP_BYTES="0")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf, env=env)
        current, started, seen, phase = None, None, 0, "fit"
        while True:
            rc = proc.poll()
            lines = out_path.read_text().splitlines() if out_path.exists() else []
            for line in lines[seen:]:
                try:
                    rec = json.loads(line)
                except ValueError:
                    break  # a line being written
                seen += 1
                if "start" in rec:
                    current, started, phase = rec["start"], time.perf_counter(), rec.get("phase", "fit")
                else:
                    results[rec["method"]] = rec
                    todo.remove(rec["method"])
                    current = None
            if rc is not None:
                break
            limit = args.cv_time_limit if phase == "cv" else args.time_limit
            if current is not None and time.perf_counter() - started > limit:
                proc.kill()
                proc.wait()
                results[current] = {"method": current, "status": "timeout",
                                    "message": f"{'CV ' if phase == 'cv' else ''}still running after {limit:g} s (killed)"}
                todo.remove(current)
                current = None
                break
            time.sleep(0.2)
        if current is not None:  # the worker died during this method
            errf.seek(0)
            tail = errf.read()[-400:]
            results[current] = {"method": current, "status": "killed",
                                "message": f"worker exited {proc.returncode} during the fit: {tail}"}
            todo.remove(current)
        elif rc is not None and todo and current is None and seen == 0:
            errf.seek(0)
            msg = f"worker exited {rc} before starting: {errf.read()[-400:]}"
            for m in todo:
                results[m] = {"method": m, "status": "error", "message": msg}
            todo = []
        errf.close()
    for m, res in results.items():
        total = res.get("fit_seconds", 0.0) + res.get("predict_seconds", 0.0)
        if res.get("status") == "ok" and total > args.time_limit:  # the peer's rule: fit + predict
            res.update(status="timeout", message=f"fit + predict took {total:.0f} s > {args.time_limit:g} s")
    return results


def run_mklpy(npz: Path, methods: list[str], args) -> dict:
    out_path = Path(args.workdir) / "mklpy_result.json"
    out_path.unlink(missing_ok=True)
    py = Path(args.venv) / "bin" / "python"
    cmd = [str(py), str(HERE / "peers" / "run_mklpy.py"), str(npz), "--out", str(out_path),
           "--methods", ",".join(methods), "--time-limit", str(args.time_limit),
           "--max-iter", str(args.mklpy_max_iter), "--svm-C", str(args.C), "--easy-lam", str(args.easy_lam),
           "--cv-time-limit", str(args.cv_time_limit), "--cv-grid", ",".join(str(c) for c in MKLPY_C_GRID),
           "--cv-methods", ",".join(m for m in CV_MKLPY if args.cv)]
    if args.mem_limit_gb:
        cmd += ["--mem-limit-gb", str(args.mem_limit_gb)]
    # the per-fit limit is enforced inside (each fit is a forked process); this is the safety net
    budget = (args.time_limit + (args.cv_time_limit if args.cv else 0)) * len(methods) + 10 * len(methods) + 600
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget, check=False)
    except subprocess.TimeoutExpired:
        msg = f"the MKLpy driver exceeded its overall budget of {budget:.0f} s"
        return {"methods": {m: {"method": m, "status": "timeout", "message": msg} for m in methods}}
    if out_path.exists():
        return json.loads(out_path.read_text())
    tail = (proc.stderr or "")[-600:]
    msg = f"run_mklpy.py exited {proc.returncode} without a result: {tail}"
    return {"methods": {m: {"method": m, "status": "killed" if proc.returncode < 0 else "error", "message": msg}
                        for m in methods}}


# ------------------------------------------------------------------------------------- the grid
def failure_kind(res: dict) -> str | None:
    """'timeout' or 'memory' for a failure that predicts failure at larger sizes, else None."""
    if res.get("status") == "timeout":
        return "timeout"
    msg = res.get("message", "")
    if res.get("status") == "killed" or any(s in msg for s in ("MemoryError", "can't allocate", "out of memory",
                                                              "Unable to allocate", "std::bad_alloc")):
        return "memory"
    return None


def grid_point(task: str, n: int, M: int, args, fails: dict, times: dict, versions_box: dict) -> dict:
    from mklscale.bank import build_bank, families

    X, y, X_test, y_test = task_split(task, n, args.n_test, args.seed)
    work = Path(args.workdir)
    bank_path = work / f"{task}_n{n}_M{M}"
    rec = {"task": task, "n": n, "M": M, "n_test": int(y_test.size), "d": int(X.shape[1]),
           "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    t0 = time.perf_counter()
    bank = build_bank(X, families.random_subsets(X.shape[1], M, seed=args.seed), bank_path, normalize="diag",
                      dtype="float32", overwrite=True, progress=False)
    rec["build_seconds"] = time.perf_counter() - t0
    rec["bank_GB"] = bank.nbytes / GB
    task_npz = work / "task.npz"
    np.savez(task_npz, y_train=y, X_test=X_test, y_test=y_test)

    def skip_reason(method: str) -> str | None:
        for (n0, M0), kind, where in fails.get(method, []):
            if n >= n0 and M >= M0:
                return f"not run: {'timed out' if kind == 'timeout' else 'ran out of memory'} at {where}"
        # predicted from the largest smaller grid point measured (any task): time ~ M n^2
        pts = [(n0 * n0 * M0, t0 * (M / M0) * (n / n0) ** 2, where) for (n0, M0), t0, where in times.get(method, [])
               if n0 <= n and M0 <= M and (n0, M0) != (n, M)]
        if pts:
            top = max(p[0] for p in pts)
            pred, where = max((p[1], p[2]) for p in pts if p[0] == top)
            if pred > args.time_limit:
                return (f"not run: predicted {pred:.0f} s > {args.time_limit:g} s from {where} "
                        "(time ~ M n^2)")
        return None

    def note_fail(method: str, res: dict) -> None:
        kind = failure_kind(res)
        if kind:
            fails.setdefault(method, []).append(((n, M), kind, f"{task} n={n} M={M}"))
        elif res.get("status") in ("ok", "error"):
            t = (res.get("fit_seconds", 0.0) + res.get("predict_seconds", 0.0)) if res["status"] == "ok" \
                else res.get("wall_seconds", 0.0)
            times.setdefault(method, []).append(((n, M), t, f"{task} n={n} M={M} ({t:.0f} s)"))

    def split_skipped(methods, side: str) -> tuple[dict, list]:
        """({method: "not run" record} for those the skip rule drops, [methods to run])."""
        skipped, todo = {}, []
        for m in methods:
            reason = skip_reason(f"{side}:{m}")
            if reason:
                skipped[m] = {"method": m, "status": "not run", "message": reason}
            else:
                todo.append(m)
        return skipped, todo

    peers = {}
    if not args.skip_mklpy:
        peers, todo = split_skipped(args.mklpy_methods, "mklpy")
        if todo:
            npz = work / "grams.npz"
            rec.update(export_npz(bank, X_test, y, y_test, npz, fold=cv_folds(y, args.cv_folds, args.seed)))
            out = run_mklpy(npz, todo, args)
            npz.unlink(missing_ok=True)
            versions_box.update(out.get("versions", {}))
            rec["mklpy_load"] = out.get("load")
            for m in todo:
                res = out["methods"].get(m, {"method": m, "status": "error", "message": "no result"})
                res.pop("traceback_tail", None) if res.get("status") == "ok" else None
                peers[m] = res
                note_fail("mklpy:" + m, res)
    ours, todo = split_skipped(args.our_methods, "ours")
    ran = run_ours(todo, bank_path, task_npz, args) if todo else {}
    for m in todo:
        ours[m] = ran[m]
        note_fail("ours:" + m, ours[m])
    ours = {m: ours[m] for m in args.our_methods}
    shutil.rmtree(bank_path, ignore_errors=True)
    if args.rank:
        t0 = time.perf_counter()
        fbank = build_bank(X, families.random_subsets(X.shape[1], M, seed=args.seed), work / f"{bank_path.name}_r{args.rank}",
                           normalize="diag", dtype="float32", overwrite=True, progress=False, rank=args.rank,
                           max_error=1.0)
        err = np.asarray(fbank.approx_error)
        rec["factor"] = {"rank": args.rank, "build_seconds": time.perf_counter() - t0, "bank_GB": fbank.nbytes / GB,
                         "approx_error": {"min": float(err.min()), "median": float(np.median(err)),
                                          "max": float(err.max())}}
        rec["ours_factor"] = run_ours(list(args.our_methods), fbank.path, task_npz, args)
        shutil.rmtree(fbank.path, ignore_errors=True)
    for m, res in peers.items():
        ref = ours.get(MATCH.get(m, "spicy_hinge"), {})
        res["matched"] = MATCH.get(m, "spicy_hinge")
        if res.get("status") == "ok" and ref.get("status") == "ok":
            res["ratio_time"] = res["fit_seconds"] / ref["fit_seconds"]
            res["ratio_peak_rss"] = res["peak_rss_GB"] / ref["peak_rss_GB"]
            if m in MATCH:
                res["agreement"] = agreement(res, ref)
    for side in (peers, ours, rec.get("ours_factor", {})):
        for r in side.values():
            r.pop("weights", None)
            r.pop("test_pred", None)
    rec["mklpy"], rec["ours"] = peers, ours
    task_npz.unlink(missing_ok=True)

    def line(name, r):
        if r.get("status") == "ok":
            return (f"    {name:28s} fit {r['fit_seconds']:8.2f}s peak {r['peak_rss_GB']:6.2f} GB "
                    f"acc {r['test_accuracy']:.3f}" + (f" ratio {r['ratio_time']:.3g}" if "ratio_time" in r else ""))
        return f"    {name:28s} {r.get('status')}: {r.get('message', '')[:150]}"

    print(f"{task} n={n} M={M} (bank {rec['bank_GB']:.2f} GB, build {rec['build_seconds']:.1f}s, load avg "
          f"{rec['load_average_at_start'][0]})", flush=True)
    for m, r in peers.items():
        print(line("MKLpy " + m, r), flush=True)
    for m, r in ours.items():
        print(line(OUR_LABELS[m], r), flush=True)
    for m, r in rec.get("ours_factor", {}).items():
        print(line(f"{OUR_LABELS[m]} r={args.rank}", r), flush=True)
    return rec


def agreement(peer: dict, ours: dict) -> dict:
    """Evidence that a matched pair solves the same problem: the share of test rows both sides label
    alike, the test-accuracy difference (peer - ours) and, when both report kernel weights, the
    largest difference of the weights normalised to sum one."""
    out = {"accuracy_diff": peer["test_accuracy"] - ours["test_accuracy"]}
    if peer.get("test_pred") is not None and ours.get("test_pred") is not None:
        out["test_label_agreement"] = float(np.mean(np.asarray(peer["test_pred"]) == np.asarray(ours["test_pred"])))
    if peer.get("weights") is not None and ours.get("weights") is not None:
        a, b = np.asarray(peer["weights"], float), np.asarray(ours["weights"], float)
        if a.shape == b.shape and a.sum() > 0 and b.sum() > 0:
            out["weights_max_abs_diff"] = float(np.max(np.abs(a / a.sum() - b / b.sum())))
    return out


# ----------------------------------------------------------------------------- cvxpy at small size
def cvxpy_point(task: str, n: int, M: int, args) -> dict:
    from bench_smo_citi import lanckriet_cvxpy

    from mklscale.bank import build_bank, families
    from mklscale.engine import Engine
    from mklscale.solvers import smo, spicy

    X, y, _, _ = task_split(task, n, 0, args.seed)
    path = Path(args.workdir) / f"cvx_{task}_n{n}_M{M}"
    if not getattr(cvxpy_point, "warm", False):  # numba compiles on first use: not timed
        tiny = build_bank(X[:40], families.random_subsets(X.shape[1], 4, seed=args.seed), path, normalize="diag",
                          overwrite=True, progress=False)
        smo.fit(Engine(tiny), y[:40], args.C, tol=1e-4)
        spicy.fit(Engine(tiny), y[:40], 0.1, loss="hinge", penalty="l1", tol=1e-6)
        cvxpy_point.warm = True
    bank = build_bank(X, families.random_subsets(X.shape[1], M, seed=args.seed), path, normalize="diag",
                      dtype="float32", overwrite=True, progress=False)
    rec = {"task": task, "n": n, "M": M, "C": args.C}
    t0 = time.perf_counter()
    res = smo.fit(Engine(bank), y, args.C, tol=1e-4)
    rec["smo"] = {"seconds": time.perf_counter() - t0, "objective": res.objective, "gap": res.gap,
                  "converged": res.converged, "status": res.params.get("status"), "n_active": res.n_active}
    grams = bank.kernels(list(range(M))).astype(np.float64)
    cv = lanckriet_cvxpy(grams, y, args.C)
    rec["cvxpy"] = {k: cv[k] for k in ("seconds", "objective", "status", "solver_seconds")}
    rec["smo"]["rel_diff_vs_cvxpy"] = (res.objective - cv["objective"]) / abs(cv["objective"])
    # SpicyMKL hinge block-1 with C' = sum ||f_m*|| / C: the same solution in SpicyMKL's terms
    q = np.einsum("i,mij,j->m", res.dual_coef, grams, res.dual_coef)
    norms = res.weights * np.sqrt(np.maximum(q, 0.0))
    C_spicy = float(norms.sum() / args.C)
    f = np.einsum("m,mij,j->i", res.weights, grams, res.dual_coef) + res.bias
    smo_in_spicy = float(np.maximum(0.0, 1.0 - y * f).sum() + C_spicy * norms.sum())
    t0 = time.perf_counter()
    sp = spicy.fit(Engine(bank), y, C_spicy, loss="hinge", penalty="l1", tol=1e-6, max_outer=2000)
    rec["spicy_hinge"] = {"seconds": time.perf_counter() - t0, "C": C_spicy, "objective": sp.objective,
                          "gap": sp.gap, "converged": sp.converged, "n_active": sp.n_active,
                          "smo_model_in_spicy_objective": smo_in_spicy,
                          "rel_diff_vs_smo_model": (sp.objective - smo_in_spicy) / abs(smo_in_spicy)}
    rec["cvxpy_over_smo_time"] = cv["seconds"] / rec["smo"]["seconds"]
    rec["cvxpy_over_spicy_time"] = cv["seconds"] / rec["spicy_hinge"]["seconds"]
    shutil.rmtree(path, ignore_errors=True)
    print(f"cvxpy {task} n={n} M={M}: cvxpy {cv['seconds']:.2f}s obj {cv['objective']:.8g} | SMO "
          f"{rec['smo']['seconds']:.2f}s obj {res.objective:.8g} (rel {rec['smo']['rel_diff_vs_cvxpy']:.1e}) | "
          f"SpicyMKL {rec['spicy_hinge']['seconds']:.2f}s obj {sp.objective:.8g} vs SMO model {smo_in_spicy:.8g}",
          flush=True)
    return rec


# ------------------------------------------------------------------------------------------ plot
def plot_sides(results: dict, path: Path) -> None:
    """--rank runs: per grid point, fit seconds and peak RSS of every method on each side (MKLpy, ours on
    the dense bank, ours on the factor bank) as bars; a failed method is an empty bar labelled with
    its status."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["grid"]
    fig, axes = plt.subplots(len(rows), 2, figsize=(11, 3.8 * len(rows)), squeeze=False)
    for g, (ax_t, ax_m) in zip(rows, axes):
        bars = [(f"{label} {m}", x) for side, label in (("mklpy", "MKLpy"), ("ours", "ours dense"),
                                                          ("ours_factor", f"ours r={g.get('factor', {}).get('rank')}"))
                for m, x in g.get(side, {}).items()]
        names = [b[0] for b in bars]
        for ax, key, unit in ((ax_t, "fit_seconds", "fit seconds"), (ax_m, "peak_rss_GB", "peak RSS (GB)")):
            vals = [x.get(key, 0.0) if x.get("status") == "ok" else 0.0 for _, x in bars]
            ax.barh(names, vals, color=["tab:blue" if n.startswith("MKLpy") else "tab:green" for n in names])
            for i, (_, x) in enumerate(bars):
                if x.get("status") != "ok":
                    ax.text(0, i, f" {x.get('status')}: {x.get('message', '')[:40]}", va="center", fontsize=8)
            ax.set_xlabel(unit)
            ax.set_title(f"{g['task']}, n = {g['n']:,}, M = {g['M']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["grid"]
    ns = sorted({r["n"] for r in rows})
    tasks = [t for t in TASKS if any(r["task"] == t for r in rows)]
    width = 5.2 * len(tasks) + 3.0
    fig, axes = plt.subplots(len(ns), len(tasks), figsize=(width, 4.2 * len(ns) + 0.6), squeeze=False)
    limit = results["params"]["time_limit_s"]
    names = [("mklpy", m, "MKLpy " + m) for m in MKLPY_METHODS] + [("ours", m, OUR_LABELS[m]) for m in OUR_METHODS]
    cmap = plt.get_cmap("tab20")
    for i, n in enumerate(ns):
        for j, task in enumerate(tasks):
            ax = axes[i][j]
            recs = sorted((r for r in rows if r["n"] == n and r["task"] == task), key=lambda r: r["M"])
            for k, (side, m, label) in enumerate(names):
                ok = [(r["M"], r[side][m]["fit_seconds"]) for r in recs
                      if m in r.get(side, {}) and r[side][m].get("status") == "ok"]
                bad = [r["M"] for r in recs if m in r.get(side, {}) and r[side][m].get("status") in ("timeout", "killed", "error")]
                style = "-" if side == "ours" else "--"
                marker = "o" if side == "ours" else "s"
                if ok:
                    ax.loglog(*zip(*ok), style, marker=marker, color=cmap(k), label=label)
                if bad:
                    ax.loglog(bad, [limit] * len(bad), "x", color=cmap(k), ms=9,
                              label=None if ok else label + " (failed)")
            ax.axhline(limit, color="grey", lw=0.8, ls=":")
            ax.set_title(f"{task}, n = {n}")
            ax.set_xlabel("M")
            ax.set_ylabel("fit seconds")
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = [], []
    for ax in axes.flat:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    fig.legend(handles, labels, loc="center right", ncol=1, fontsize=8)
    fig.suptitle("fit time vs M (dashed: MKLpy, solid: mklscale; x: failed, plotted at the time limit)")
    fig.tight_layout(rect=(0, 0, 1 - 3.0 / width, 0.96))
    fig.savefig(path, dpi=100)


# ------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="breast_cancer, n = 100, M = 20; cvxpy at n = 100, M = 10")
    ap.add_argument("--tasks", default=None)
    ap.add_argument("--n", default=None, help="comma list of training sizes")
    ap.add_argument("--M", default=None, help="comma list of bank sizes")
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--C", type=float, default=1.0)
    ap.add_argument("--easy-lam", type=float, default=0.1, help="EasyMKL's lam, MKLpy's and ours (default 0.1)")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds per fit, fit + prediction (default 120)")
    ap.add_argument("--mem-limit-gb", type=float, default=None,
                    help="address-space cap of every fitting process (default min(16, 0.7 x RAM))")
    ap.add_argument("--cache-bytes", default="2GB", help="our Engine's block cache")
    ap.add_argument("--mklpy-max-iter", type=int, default=2000,
                    help="GRAM / RMKL / MEMO iteration cap; they stop earlier on MKLpy's own rule (default 2000)")
    ap.add_argument("--no-cv", dest="cv", action="store_false",
                    help="use --C everywhere instead of choosing the non-matched pairs' constants by CV")
    ap.add_argument("--cv-folds", type=int, default=3)
    ap.add_argument("--cv-time-limit", type=float, default=None, help="seconds per method's CV (default 2 x --time-limit)")
    ap.add_argument("--venv", default=str(HERE / "peers" / ".venv"))
    ap.add_argument("--skip-mklpy", action="store_true")
    ap.add_argument("--mklpy-methods", default=",".join(MKLPY_METHODS), help="comma list of MKLpy methods")
    ap.add_argument("--our-methods", default=",".join(OUR_METHODS), help="comma list of our methods")
    ap.add_argument("--rank", type=int, default=None, help="also run ours on a factor bank of this rank")
    ap.add_argument("--no-cvxpy", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="/tmp/mklscale_bench_peers")
    ap.add_argument("--out", default=None)
    # worker mode (one of our fits in a child process)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bank", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--task-npz", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cv-ours", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    args.mklpy_methods = [m for m in args.mklpy_methods.split(",") if m]
    args.our_methods = [m for m in args.our_methods.split(",") if m]

    import psutil
    from machine import describe_machine

    if args.time_limit is None:
        args.time_limit = 120.0
    if args.cv_time_limit is None:
        args.cv_time_limit = 2 * args.time_limit
    if args.mem_limit_gb is None:
        args.mem_limit_gb = round(min(16.0, 0.7 * psutil.virtual_memory().total / 2**30), 1)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    tasks = ["breast_cancer"] if args.quick else list(TASKS)
    ns = [100] if args.quick else [200, 500]
    Ms = [20] if args.quick else [100, 1000]
    if args.tasks:
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.n:
        ns = [int(x) for x in args.n.split(",")]
    if args.M:
        Ms = [int(x) for x in args.M.split(",")]
    cvx_points = [("ringnorm", 100, 10)] if args.quick else [(t, 100, M) for t in ("breast_cancer", "ringnorm")
                                                             for M in (10, 50)]
    if not args.skip_mklpy and not (Path(args.venv) / "bin" / "python").exists():
        print(f"no MKLpy venv at {args.venv}: run  bash benchmarks/peers/setup_mklpy_venv.sh", file=sys.stderr)
        return 2
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    print(f"load average at start: {load_at_start} on {os.cpu_count()} cores", flush=True)
    t_start = time.perf_counter()
    fails: dict = {}
    times: dict = {}
    versions: dict = {}
    grid = []
    for n in ns:  # smallest sizes first, so a failure predicts the larger ones
        for M in Ms:
            for task in tasks:
                grid.append(grid_point(task, n, M, args, fails, times, versions))
    cvx = [] if args.no_cvxpy else [cvxpy_point(t, n, M, args) for t, n, M in cvx_points]

    import cvxpy

    results = {
        "benchmark": "bench_peers",
        "machine": describe_machine(work),
        "load_average_at_start": load_at_start,
        "total_seconds": time.perf_counter() - t_start,
        "peer_versions": versions,
        "cvxpy_version": cvxpy.__version__,
        "params": {"quick": args.quick, "tasks": tasks, "n": ns, "M": Ms, "n_test": args.n_test, "C": args.C,
                   "time_limit_s": args.time_limit, "mem_limit_GB": args.mem_limit_gb, "cache_bytes": args.cache_bytes,
                   "mklpy_max_iter": args.mklpy_max_iter, "seed": args.seed, "rank": args.rank,
                   "mklpy_methods": args.mklpy_methods, "our_methods": args.our_methods, "normalize": "diag", "dtype": "float32",
                   "family": "random_subsets (gaussian on random feature subsets, width 5 chi^2 + 0.1)",
                   "export": "uncompressed npz, float32; MKLpy loads it as float64 torch tensors",
                   "ours": {"spicy": "block-1 (l1), tol 0.01", "smo": "paper's (OPT_3) stopping rule",
                            "uniform": "weights 1/M + SVC(C)", "alignment": "centred alignment QP + SVC(C)",
                            "easymkl": f"lam {args.easy_lam}, KOMD(lam 0.1) learner, tracenorm off",
                            "fheuristic": "uncentred alignment weights + SVC(C)"},
                   "mklpy": {"EasyMKL": f"lam {args.easy_lam}, KOMD learner", "AverageMKL": "SVC(C)", "FHeuristic": "SVC(C)",
                             "PWMK": "SVC(C), delta 0, cv 3 (its own, for the weights)", "CKA": "SVC(C)",
                             "GRAM/RMKL/MEMO": "SVC(C) learner, learning rate 0.01, ReduceOnWorsening, max_iter "
                                               + str(args.mklpy_max_iter)},
                   "stopping": {"GRAM/RMKL/MEMO": "MKLpy 0.6's own rule: ReduceOnWorsening halves the learning rate on "
                                                  "every worsening step and stops when it is < 1e-7 (its tolerance "
                                                  "test is commented out); else the cap max_iter "
                                                  f"{args.mklpy_max_iter}; recorded: iterations, stopped_on",
                                "spicy": "relative duality gap <= 0.01 (converged, gap; iterations = outer)",
                                "smo": "the paper's OPT_3 rule", "svm": "libsvm tol 1e-3 (both sides)",
                                "easymkl": "cvxopt (MKLpy) / libsvm margin QP (ours) at their tolerances"},
                   "cv": {"enabled": args.cv, "folds": args.cv_folds, "seed": args.seed, "metric": "accuracy",
                          "split": "cv.fold_assignment (stratified, seeded): the same fold array on both sides",
                          "rule": "best mean accuracy, ties to the more regularised value",
                          "mklpy_methods": list(CV_MKLPY), "mklpy_grid": list(MKLPY_C_GRID),
                          "mklpy_parameter": "SVM C of the SVC learner (and RMKL's C)",
                          "ours_methods": list(CV_OURS), "ours_grid": "model_selection auto: C_max x [0.1, 0.03, 0.01, 0.003]",
                          "ours_parameter": "SpicyMKL's penalty weight C", "time_limit_s": args.cv_time_limit,
                          "matched_pairs": "no CV: the same constants on both sides (same problem)"},
                   "peak_memory": {"mklpy": "ru_maxrss of the forked fit process right after fit (train kernels "
                                            "float64 only; test kernels loaded after the fit: predict_peak_rss_GB)",
                                   "ours": "VmHWM of the worker, reset before each fit, read after the fit "
                                           "(prediction: predict_peak_rss_GB)"},
                   "match": MATCH, "skip_rule": "a method that timed out or ran out of memory at (n', M') is not "
                                                "run at n >= n', M >= M' (any task), nor where its time predicted "
                                                "from the largest smaller grid point it ran at (t M/M' (n/n')^2) "
                                                "exceeds the limit"},
        "grid": grid,
        "cvxpy": cvx,
    }
    stem = "bench_peers_quick" if args.quick else "bench_peers"
    if args.rank:
        stem = "bench_peers_factor"
    elif args.tasks or args.n or args.M or args.skip_mklpy:
        stem += "_partial"
    out = Path(args.out) if args.out else RESULTS / f"{stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=float))
    (plot_sides if args.rank else plot)(results, out.with_suffix(".png"))
    print(f"wrote {out} ({results['total_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
