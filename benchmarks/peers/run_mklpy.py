"""Fit MKLpy's MKL algorithms on Gram matrices exported by benchmarks/bench_peers.py.

Runs INSIDE the MKLpy virtual environment (benchmarks/peers/setup_mklpy_venv.sh); it never imports
mklscale.

    .venv/bin/python benchmarks/peers/run_mklpy.py DATA.npz --out RESULT.json \
        [--methods EasyMKL,AverageMKL,...] [--time-limit 120] [--mem-limit-gb 16] [--max-iter 2000] \
        [--cv-methods PWMK,GRAM,RMKL,MEMO --cv-grid 0.1,1,10,100]

DATA.npz (read with allow_pickle=False): K_train (M, n, n), K_test (M, n_test, n) (float32 or
float64), y_train (n,), y_test (n_test,) labels in {-1, +1}, and fold (n,) CV fold per training row
(needed with --cv-methods).

Protocol. First every method is fitted and used to predict once on a tiny problem in this process
(warm-up, untimed; --no-warmup skips it), so lazy imports and first-call set-up are inherited by the
forked fits. Then the TRAIN kernels are loaded the way MKLpy holds them: in memory as float64 torch
tensors (MKLpy casts kernels to float64 itself, ``utils.validation.check_X``, and its matrix products
need one dtype), streamed kernel by kernel into one float64 array, so loading never holds a second
copy. Each method then runs in its own forked process (copy-on-write: the kernels are not copied):
its fit time is the wall time of ``fit(KL_train, y_train)``; its peak memory (``peak_rss_GB``) is the
process's ru_maxrss read as the fit returns (the train kernels it inherited count: they are resident
in it); only then does it load the test kernels from the npz and ``predict`` (test accuracy; the
process's whole peak from ``os.wait4`` is ``predict_peak_rss_GB``). GRAM / RMKL / MEMO run until
MKLpy's own rule stops them (``stopping``: the ReduceOnWorsening scheduler) or --max-iter; the
iterations and the reason are recorded. Methods in --cv-methods first get their SVM constant C chosen
by k-fold CV in another forked process (``cv_one``: the folds are the npz's ``fold`` member, the grid
--cv-grid, accuracy, ties to the smaller C; limit --cv-time-limit); the timed fit then uses the chosen
C, and the CV record and its seconds are reported beside it. A method
still running after --time-limit seconds is killed and recorded as a timeout; one that dies of a
signal (the kernel's out-of-memory killer) or raises (MemoryError, RuntimeError from torch's
allocator, ...) is recorded with its message. --mem-limit-gb caps the address space
(RLIMIT_AS) of this process and of every fit, so running out of memory is an error MKLpy reports
rather than the machine's OOM killer picking a process; and the kernels are not loaded at all
(a MemoryError, recorded) when their float64 size plus a 2 GB reserve exceeds the machine's
MemAvailable: the machine is shared, and other jobs must not be pushed into the OOM killer.

Output: one JSON object (also printed): versions, load (seconds, GB held), and per method status
("ok" | "error" | "timeout" | "killed"), fit_seconds, predict_seconds, peak_rss_GB, test_accuracy,
n_nonzero_weights, C, iterations, stopped_on, cv, cv_seconds, predict_peak_rss_GB, weights and
test_pred (bench_peers compares them across matched pairs and drops them), message.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback
import zipfile

import numpy as np

GB = 1e9
ALL_METHODS = ("EasyMKL", "AverageMKL", "FHeuristic", "PWMK", "CKA", "GRAM", "RMKL", "MEMO")


def versions() -> dict:
    from importlib.metadata import version

    out = {}
    for name in ("MKLpy", "torch", "numpy", "scikit-learn", "cvxopt"):
        try:
            out[name] = version(name)
        except Exception as exc:  # noqa: BLE001
            out[name] = f"missing ({exc})"
    return out


def read_member(npz: str, name: str, dtype=np.float64) -> np.ndarray:
    """The array ``name`` of an uncompressed or deflated npz, streamed into a ``dtype`` array one
    leading-axis slice at a time (no second full-size copy, no pickle)."""
    with zipfile.ZipFile(npz) as zf, zf.open(name + ".npy") as f:
        major, _ = np.lib.format.read_magic(f)
        reader = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran, src = reader(f)
        if src.hasobject:
            raise ValueError(f"{name}: object arrays are not accepted")
        if fortran:
            raise ValueError(f"{name}: Fortran order is not supported")
        out = np.empty(shape, dtype=dtype)
        if out.ndim == 0 or out.shape[0] == 0:
            return out
        flat = out.reshape(shape[0], -1)
        row_bytes = flat.shape[1] * src.itemsize
        buf = bytearray(row_bytes)
        view = memoryview(buf)
        for i in range(shape[0]):
            got = 0
            while got < row_bytes:
                k = f.readinto(view[got:])
                if not k:
                    raise ValueError(f"{name}: truncated at row {i}")
                got += k
            flat[i] = np.frombuffer(buf, dtype=src)
        return out


RESERVE = 2 * 10**9


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 62


def member_shape(npz: str, name: str) -> tuple:
    with zipfile.ZipFile(npz) as zf, zf.open(name + ".npy") as f:
        major, _ = np.lib.format.read_magic(f)
        reader = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        return reader(f)[0]


def make(name: str, args, C: float | None = None):
    """MKLpy's ``name`` with SVM constant C (default --svm-C); GRAM / RMKL / MEMO get a StepCounter
    callback (``model.callbacks[0].steps``: the iterations the loop ran)."""
    from MKLpy import algorithms
    from MKLpy.scheduler import ReduceOnWorsening
    from sklearn.svm import SVC

    C = args.svm_C if C is None else C
    svc = SVC(C=C)
    if name == "EasyMKL":
        return algorithms.EasyMKL(lam=args.easy_lam)  # its default learner: KOMD(lam=0.1)
    if name == "AverageMKL":
        return algorithms.AverageMKL(learner=svc)
    if name == "FHeuristic":
        return algorithms.FHeuristic(learner=svc)
    if name == "PWMK":
        return algorithms.PWMK(learner=svc, delta=0, cv=3)
    if name == "CKA":
        return algorithms.CKA(learner=svc)
    if name in ("GRAM", "RMKL", "MEMO"):
        cls = getattr(algorithms, name)
        kw = {"learner": svc, "max_iter": args.max_iter, "learning_rate": args.learning_rate,
              "scheduler": ReduceOnWorsening(), "callbacks": [step_counter()]}
        if name == "RMKL":
            kw["C"] = C
        return cls(**kw)
    raise ValueError(f"unknown MKLpy method {name!r}")


def step_counter():
    """A MKLpy callback recording the last step the TwoStepMKL loop began (its iterations)."""
    from MKLpy.callbacks import Callback

    class StepCounter(Callback):
        steps = 0

        def on_step_begin(self, step):
            self.steps = step

    return StepCounter()


def stopping(model, args) -> dict:
    """Iterations used by an iterative (TwoStepMKL) model and why it stopped: MKLpy 0.6's loop ends
    when ``scheduler.step`` reports convergence (ReduceOnWorsening: the learning rate, halved on
    every step that worsens the objective, fell below min_lr 1e-7) or at max_iter; its
    ``tolerance`` test is commented out in ``TwoStepMKL._combine_kernels``."""
    cbs = getattr(model, "callbacks", None) or []
    if not cbs:
        return {}
    return {"iterations": int(cbs[0].steps),
            "stopped_on": "scheduler (learning rate < 1e-7)" if model.convergence else f"max_iter {args.max_iter}"}


def best_index(mean, grid, larger_regularises: bool) -> int:
    """Index of the best mean CV score; ties go to the more regularised value. The rule of
    ``mklscale.solvers.cv.best_index`` (this file cannot import mklscale; tests/test_bench_peers.py
    checks they agree)."""
    mean = np.asarray(mean, dtype=np.float64)
    top = np.flatnonzero(mean >= np.max(mean) - 1e-12)
    values = np.asarray(grid, dtype=np.float64)[top]
    return int(top[np.argmax(values) if larger_regularises else np.argmin(values)])


def fold_rows(fold: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, held-out rows) of fold k of a fold-index array (bench_peers' fold_assignment)."""
    return np.flatnonzero(fold != k), np.flatnonzero(fold == k)


def cv_one(name: str, KL_tr, y_tr, fold, grid, args) -> dict:
    """Runs in a forked child: k-fold CV of the SVM constant C of ``name`` over ``grid`` on the train
    kernels in memory (principal submatrices KL[m][tr][:, tr]; held-out rows KL[m][te][:, tr]),
    accuracy per fold (a fit that raises scores 0 and is listed in ``failed_fits``); the chosen C has
    the best mean (ties: the smaller C, the more regularised)."""
    import contextlib
    import io

    import torch

    torch.set_num_threads(args.threads)
    folds = int(fold.max()) + 1
    scores = np.full((len(grid), folds), np.nan)
    iters, failed = [], []
    t0 = time.perf_counter()
    for k in range(folds):
        tr, te = (torch.from_numpy(r) for r in fold_rows(fold, k))
        KL_fit = [K.index_select(0, tr).index_select(1, tr) for K in KL_tr]
        KL_val = [K.index_select(0, te).index_select(1, tr) for K in KL_tr]
        Y = torch.tensor(y_tr[tr.numpy()])
        for i, C in enumerate(grid):
            model = make(name, args, C)
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    model.fit(KL_fit, Y)
                    pred = model.predict(KL_val)
            except Exception as exc:  # noqa: BLE001  (e.g. cvxopt's "domain error" in GRAM on a fold)
                failed.append({"C": C, "fold": k, "message": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            pred = np.asarray(pred.numpy() if hasattr(pred, "numpy") else pred).reshape(-1)
            scores[i, k] = float(np.mean(pred == y_tr[te.numpy()]))
            iters.append(stopping(model, args).get("iterations"))
        del KL_fit, KL_val
    if np.isnan(scores).all():
        raise RuntimeError(f"every CV fit failed, e.g. {failed[0]['message']}")
    mean = np.nan_to_num(scores, nan=0.0).mean(axis=1)  # a fold fit that failed scores 0
    best = best_index(mean, grid, larger_regularises=False)
    out = {"method": name, "status": "ok", "grid": list(grid), "mean": mean.tolist(),
           "fold_scores": np.where(np.isnan(scores), None, scores).tolist(), "failed_fits": failed,
           "folds": folds, "chosen": float(grid[best]), "at_edge": best in (0, len(grid) - 1),
           "seconds": time.perf_counter() - t0}
    if any(i is not None for i in iters):
        out["iterations_max"] = int(max(i for i in iters if i is not None))
    return out


def fit_one(name: str, KL_tr, y_tr, y_te, args, C: float | None = None) -> dict:
    """Runs in the forked child: fit (its peak resident set, ``fit_peak_rss_GB``, is read before
    anything else is loaded), then load the test kernels from the npz (float64 torch, as MKLpy holds
    them), predict, report."""
    import contextlib
    import io

    import torch

    torch.set_num_threads(args.threads)
    out = {"method": name}
    model = make(name, args, C)
    Y = torch.tensor(y_tr.astype(np.int64))
    with contextlib.redirect_stdout(io.StringIO()):  # MEMO prints tensor sizes
        t0 = time.perf_counter()
        model.fit(KL_tr, Y)
        out["fit_seconds"] = time.perf_counter() - t0
        out["fit_peak_rss_GB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB
        out.update(stopping(model, args))
        t0 = time.perf_counter()
        Tte = torch.from_numpy(read_member(args.data, "K_test"))
        out["load_test_seconds"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        pred = model.predict([Tte[m] for m in range(Tte.shape[0])])
        out["predict_seconds"] = time.perf_counter() - t0
    pred = np.asarray(pred.numpy() if hasattr(pred, "numpy") else pred).reshape(-1)
    out["test_accuracy"] = float(np.mean(pred == y_te))
    w = getattr(getattr(model, "solution", None), "weights", None)
    if w is not None:
        w = np.asarray(w.numpy() if hasattr(w, "numpy") else w, dtype=np.float64)
        out["n_nonzero_weights"] = int(np.count_nonzero(np.abs(w) > 1e-12 * max(np.abs(w).max(), 1e-300)))
        out["weights"] = w.reshape(-1).tolist()  # bench_peers compares them with the matched method's, then drops them
    out["test_pred"] = pred.astype(np.float64).tolist()
    out["C"] = args.svm_C if C is None else C
    out["status"] = "ok"
    return out


def run_forked(name: str, target, time_limit: float) -> dict:
    """target() in a forked child under ``time_limit`` seconds; its result dict plus wall_seconds and
    peak_rss_GB (ru_maxrss of the child from wait4: everything it inherited and touched)."""
    fd, path = tempfile.mkstemp(prefix=f"mklpy_{name}_", suffix=".json")
    os.close(fd)
    t_start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            res = target()
        except BaseException as exc:  # noqa: BLE001
            tb = traceback.format_exc().strip().splitlines()
            res = {"method": name, "status": "error", "message": f"{type(exc).__name__}: {exc}"[:2000],
                   "traceback_tail": tb[-6:]}
            code = 1
        try:
            with open(path, "w") as f:
                json.dump(res, f)
        finally:
            os._exit(code)
    deadline = t_start + time_limit
    status, rusage = None, None
    while True:
        wpid, status, rusage = os.wait4(pid, os.WNOHANG)
        if wpid == pid:
            break
        if time.perf_counter() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status, rusage = os.wait4(pid, 0)
            res = {"method": name, "status": "timeout",
                   "message": f"still running after {time_limit:g} s (killed)"}
            break
        time.sleep(0.05)
    wall = time.perf_counter() - t_start
    if "res" not in locals():
        try:
            with open(path) as f:
                res = json.load(f)
        except (OSError, ValueError):
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            res = {"method": name, "status": "killed",
                   "message": (f"died of signal {sig} ({signal.Signals(sig).name})"
                               + (" - the out-of-memory killer" if sig == signal.SIGKILL else "")
                               if sig else f"exited {os.WEXITSTATUS(status)} without a result")}
    os.unlink(path)
    res["wall_seconds"] = wall
    res["peak_rss_GB"] = rusage.ru_maxrss * 1024 / GB  # Linux: kilobytes
    return res


def warm_up(methods: list[str], args) -> dict:
    """Each method fitted and used to predict once on a tiny problem in this process, before the
    kernels are loaded and the fits forked (not timed; lazy imports and first-call set-up of MKLpy,
    torch, cvxopt and libsvm are then inherited by every fit, as ours warm up before timing). One
    torch thread here: the fits set their own thread count in the forked child."""
    import contextlib
    import io
    import warnings

    import torch

    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((24, 3))
    y = np.where(X[:, 0] + 0.3 * rng.standard_normal(24) > 0, 1, -1).astype(np.int64)
    KL = [torch.from_numpy(np.exp(-0.5 * (X[:, [j]] - X[:, j]) ** 2)) for j in range(3)]
    failed = {}
    for m in methods:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                model = make(m, args)
                model.fit(KL, torch.tensor(y))
                model.predict(KL)
        except Exception as exc:  # noqa: BLE001  (the real fit reports it)
            failed[m] = f"{type(exc).__name__}: {exc}"[:300]
    return {"seconds": time.perf_counter() - t0, "failed": failed}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--out", default=None)
    ap.add_argument("--methods", default=",".join(ALL_METHODS))
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds per method (fit + predict)")
    ap.add_argument("--mem-limit-gb", type=float, default=None, help="RLIMIT_AS of this process and its fits")
    ap.add_argument("--max-iter", type=int, default=2000, help="GRAM / RMKL / MEMO iteration cap (default 2000)")
    ap.add_argument("--learning-rate", type=float, default=0.01)
    ap.add_argument("--svm-C", type=float, default=1.0, help="C of the methods not cross-validated")
    ap.add_argument("--easy-lam", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cv-methods", default="", help="methods whose C is chosen by CV on the npz's folds")
    ap.add_argument("--cv-grid", default="0.1,1,10,100", help="C values tried by the CV")
    ap.add_argument("--cv-time-limit", type=float, default=None, help="seconds per method's CV (default 2 x --time-limit)")
    ap.add_argument("--no-warmup", action="store_true")
    args = ap.parse_args(argv)
    if args.cv_time_limit is None:
        args.cv_time_limit = 2 * args.time_limit
    if args.mem_limit_gb:
        lim = int(args.mem_limit_gb * GB)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    cv_methods = [m.strip() for m in args.cv_methods.split(",") if m.strip()]
    grid = sorted(float(x) for x in args.cv_grid.split(",") if x.strip())
    out = {"versions": versions(), "data": os.path.abspath(args.data), "params": {
        k: getattr(args, k) for k in ("time_limit", "mem_limit_gb", "max_iter", "learning_rate", "svm_C",
                                      "easy_lam", "threads", "cv_time_limit")}, "methods": {}}
    out["params"].update(cv_methods=cv_methods, cv_grid=grid)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not args.no_warmup:
        out["warmup"] = warm_up(methods, args)
    t0 = time.perf_counter()
    try:
        with np.load(args.data, allow_pickle=False) as z:  # small members; also validates the file
            y_tr, y_te = z["y_train"].astype(np.int64), z["y_test"].astype(np.int64)
            fold = z["fold"].astype(np.int64) if "fold" in z.files else None
        if cv_methods and fold is None:
            raise ValueError("--cv-methods needs a 'fold' member in the npz (bench_peers writes it)")
        # train kernels only: the test kernels are loaded by each fit's process after its fit
        need = 8 * int(np.prod(member_shape(args.data, "K_train")))
        avail = mem_available()
        out["memory_check"] = {"kernels_float64_GB": need / GB, "machine_available_GB": avail / GB}
        if need + RESERVE > avail:  # a shared machine: never push other jobs into the OOM killer
            raise MemoryError(f"MKLpy would hold {need / GB:.1f} GB of float64 train kernels but the "
                              f"machine has {avail / GB:.1f} GB available (MemAvailable, minus a "
                              f"{RESERVE / GB:.0f} GB reserve); not loaded")
        Ktr = read_member(args.data, "K_train")
        import torch  # no torch compute in this process after the warm-up: the fits are forked

        Ttr = torch.from_numpy(Ktr)
        KL_tr = [Ttr[m] for m in range(Ttr.shape[0])]
        out["load"] = {"seconds": time.perf_counter() - t0, "kernels_GB": Ktr.nbytes / GB,
                       "M": int(Ktr.shape[0]), "n": int(Ktr.shape[1]), "n_test": int(y_te.size),
                       "rss_after_load_GB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB}
    except BaseException as exc:  # noqa: BLE001
        msg = f"loading the kernels as float64 failed: {type(exc).__name__}: {exc}"[:2000]
        out["load"] = {"seconds": time.perf_counter() - t0, "error": msg,
                       "rss_GB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB}
        for m in methods:
            out["methods"][m] = {"method": m, "status": "error", "message": msg,
                                 "peak_rss_GB": out["load"]["rss_GB"]}
        methods = []
    for m in methods:
        cv, C = None, None
        if m in cv_methods:
            cv = run_forked(m, lambda m=m: cv_one(m, KL_tr, y_tr, fold, grid, args), args.cv_time_limit)
            if cv.get("status") != "ok":
                res = {"method": m, "status": cv.get("status"), "message": "CV: " + cv.get("message", ""),
                       "peak_rss_GB": cv.get("peak_rss_GB"), "cv": cv}
                out["methods"][m] = res
                print(f"  MKLpy {m:11s} CV {res['status']}: {res['message'][:120]}", file=sys.stderr, flush=True)
                continue
            C = cv["chosen"]
        res = run_forked(m, lambda m=m, C=C: fit_one(m, KL_tr, y_tr, y_te, args, C), args.time_limit)
        if res.get("status") == "ok":  # the whole process's peak (fit + test kernels + predict)
            res["predict_peak_rss_GB"] = res["peak_rss_GB"]
            res["peak_rss_GB"] = res.pop("fit_peak_rss_GB")
        if cv is not None:
            res["cv"] = cv
            res["cv_seconds"] = cv["seconds"]
        out["methods"][m] = res
        print(f"  MKLpy {m:11s} {res['status']:8s} fit {res.get('fit_seconds', float('nan')):8.2f}s "
              f"peak {res['peak_rss_GB']:6.2f} GB acc {res.get('test_accuracy', float('nan')):.3f} C {res.get('C')} "
              f"iters {res.get('iterations')} {res.get('message', '')[:120]}", file=sys.stderr, flush=True)
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
