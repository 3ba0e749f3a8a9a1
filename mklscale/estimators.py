"""scikit-learn estimators: ``MKLClassifier`` and ``MKLRegressor``.

Both learn f(x) = sum_m w_m k_m(x, X_train) c + b over a bank of kernels k_m (KernelSpecs evaluated on
the standardised features, normalised as the bank's ``normalize`` rule says), with one of the solvers of
:mod:`mklscale.solvers.registry`. ``fit(X, y)``:

1. validates X, y with scikit-learn's ``validate_data`` (NaN/inf and shape errors are InvalidInputErrors,
   which are ValueErrors, with scikit-learn's text and what to do);
2. builds the kernel bank in ``cache_dir`` under a key that hashes the data (raw float64 bytes, from
   which the standardisation follows), the kernel specs, ``normalize`` and the storage dtype
   (float32) -- or REUSES it when a previous fit built the same bank (``fit_stats_["kernels_built"]``
   is then 0). The cache (``$MKLSCALE_CACHE`` or ``~/.cache/mklscale/banks`` by default; every distinct
   training set, e.g. every cross-validation fold, gets its own bank) is kept under
   ``$MKLSCALE_CACHE_MAX`` (default 2GB) by evicting the least recently used banks no fit is using
   (:mod:`mklscale.bank.cache`; ``mklscale cache info|clear``);
3. opens an :class:`~mklscale.engine.Engine` on it (``client``: a ``distributed.Client`` or None for
   Dask's threaded scheduler) and runs the solver; multiclass classification is one-vs-rest, one
   solve per class on the same engine with targets +1 for the class and -1 for the rest;
4. keeps in ``model_`` (:class:`~mklscale.model.MKLModel`) only what prediction needs: kept kernels,
   their specs and normalisation, and the training rows with non-zero dual coefficients.

Convergence: a fit whose solve (any head) stopped before its stopping rule was met -- an iteration,
step or time limit, or a stall -- issues ``sklearn.exceptions.ConvergenceWarning`` once, naming the
solver, the class (one-vs-rest), the gap reached and what to change (``registry.convergence_advice``);
the text is also kept in ``fit_stats_["convergence_warning"]``.

Labels: binary classification maps ``classes_[1]`` to +1 (``decision_function > 0`` predicts
``classes_[1]``, as in scikit-learn); one-vs-rest predicts ``classes_[argmax_k f_k(x)]``. Predictions
are always labels seen at fit.

``C`` is the solver's main regularisation, with the meaning and default the registry table states
(e.g. spicy: penalty weight, larger = sparser; smo/citi: SVM C, larger = less regularised;
pfbs: tau; sgd/gcd: ridge lam). ``predict_proba`` exists only for ``solver="spicy"`` with the logistic
loss (its default for classification): P(classes_[1] | x) = sigmoid(f(x)) for binary, and
sigmoid(f_k(x)) / sum_j sigmoid(f_j(x)) for one-vs-rest.

Tuning C: use scikit-learn's ``GridSearchCV`` (each fold's training rows get their own bank in the
cache). The grids the pipelines' ``C = "auto"`` uses (:mod:`mklscale.model_selection`) suit the
default unit-trace kernels here too: SVM constants (smo, citi, the baselines' final SVM)
``C = n_train * (0.1, 1, 10)`` (C = 1 or 10 on unit-trace kernels usually predicts the majority class);
ridges (sgd, gcd, regression baselines) ``lam = (1e-3, 1e-2, 1e-1, 1, 10) / n_train``; spicy's ``C``
and pfbs' tau as (0.1, 0.03, 0.01, 0.003) times the value above which no kernel is kept.

``load(path)`` (``mklscale.load``) reads a saved model back as a fitted estimator.

Feature selection (:mod:`mklscale.feature_selection`): ``feature_importances_`` (each input feature's
share of the kept kernels' weight), ``selected_features_``, ``feature_ranking()`` (by the DataFrame's
column names), and ``feature_stability(estimator, X, y)`` (how often each feature is selected over
subsample refits or along the C path).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
import warnings
from numbers import Integral, Real
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._available_if import _AvailableIfDescriptor
from sklearn.utils._param_validation import Interval, InvalidParameterError, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, check_is_fitted, check_random_state, column_or_1d, validate_data

from mklscale.bank import _compute, families
from mklscale.bank.spec import KernelSpec, specs_to_json
from mklscale.bank.size import BankTooLargeError, check_fits
from mklscale.errors import BankCorruptError, InvalidInputError
from mklscale.model import MKLModel
from mklscale.runtime.checkpoint import Checkpoint, stop_on_signals
from mklscale.solvers import cv, registry
from mklscale.solvers.cv import head_targets  # noqa: F401 - the estimators' import path of it
from mklscale.solvers.result import json_safe

#: storage dtype of the banks the estimators build (float32 storage, float64 accumulation)
BANK_DTYPE = "float32"
#: ``kernels=PRECOMPUTED``: fit(K, y) and predict(K_test) take Gram matrices instead of feature rows
PRECOMPUTED = "precomputed"


#: the numpydoc Parameters section of both estimators (their class docstrings, so help() shows it)
_PARAMETERS = """\
    Parameters
    ----------
    kernels : str, dict, KernelSpec or list of these, default="auto"
        The kernel bank, as ``mklscale.bank.families.resolve`` reads it: a family name, the same
        bank as ``{"family": name}`` in pipelines and on the CLI ("auto": 6 + d kernels, Gaussians
        on all features at widths sqrt(d) x (1/4 .. 4), the linear kernel, and a Gaussian of width
        1 on every single feature (standardised); "simplemkl": 27 (d + 1) kernels, Gaussian and
        polynomial on all features and on every single feature, the SimpleMKL / SpicyMKL recipe;
        "gaussian", "polynomial", "linear" on all and on every single feature; "random_subsets",
        seeded by ``random_state``), a family dict with parameters such as
        ``{"family": "gaussian", "widths": [1, 2], "features": "all"}`` (an unknown parameter is
        an error), KernelSpecs, or a list mixing these. "precomputed": ``fit(K, y)`` takes your own
        Gram matrices, a list of M (n, n) arrays or an (M, n, n) array (a memory-mapped ``.npy``
        stays on disk; they are imported into a cached bank, ``KernelBank.from_arrays``, checked
        symmetric and PSD), and ``predict(K_test)`` / ``decision_function`` the cross kernels
        K_m(X_test, X_train) (M, n_test, n_train), raw as given to fit (each is scaled by its
        training kernel's normalisation), as MKLpy's ``fit(KL, y)`` / ``predict(KL_test)``.
    solver : str, default="spicy"
        A name of :func:`mklscale.solvers.registry.names`: spicy, citi, smo, pfbs, sgd, gcd,
        easymkl, fheuristic, uniform or alignment (``registry.info(name)`` says which tasks each
        supports).
    C : float or "auto", default="auto"
        The solver's main regularisation, with the meaning its registry row states
        (``registry.regularisation(solver, task)``: spicy: penalty weight, larger = sparser; smo /
        citi: SVM C, larger = less regularised; pfbs: tau; sgd / gcd: ridge lam). "auto" (or None):
        the row's default times the problem's scale on this bank (spicy: 0.1 C_max, where C_max is
        the smallest C whose model keeps no kernel; SVM constants: n / mean trace, scikit-learn's
        C = 1 on unit-diagonal kernels; ridges: mean trace / n); the value used is ``C_``. To choose
        it by cross-validation use :class:`MKLClassifierCV` / :class:`MKLRegressorCV`.
    solver_params : dict or None, default=None
        Further solver parameters, e.g. ``{"loss": "hinge"}`` for spicy (unknown names raise
        InvalidInputError listing the accepted ones).
    normalize : {"trace", "diag"} or None, default="trace"
        Kernel normalisation: unit trace, unit diagonal, or none.
    rank : int >= 1 or None, default=None
        None: a dense bank, every K_m stored as n x n. r: a factor bank, every kernel stored as
        L_m (n x r) with K~_m = L_m L_m^T by Nystrom on r k-means++ landmarks drawn per kernel
        (``build_bank(..., rank=r)``), for n in the tens of thousands; the solvers solve the same
        problem on the K~_m and the model keeps only the landmarks of the kept kernels.
    computed : bool or "auto", default="auto"
        True: a computed bank (``build_bank(..., computed=True)``): no kernel is stored, every pass
        computes them from the features (for many kernels over few rows, e.g.
        ``kernels="per_feature"`` on thousands of features). "auto": a stored bank, unless it would
        not fit the cache's cap or disk (``size.check_fits``) and a computed one would: then a
        computed one (same kernels, same results; each pass computes instead of reading).
        False: always stored (a bank that does not fit is refused). With ``rank``: stored factors.
    cache_dir : str, path or None, default=None
        Where banks are kept for reuse by later fits on the same data and kernels (None:
        ``$MKLSCALE_CACHE`` or ``~/.cache/mklscale/banks``). The cache is kept under
        ``$MKLSCALE_CACHE_MAX`` (default 2GB) by removing the least recently used banks that no
        other fit is using; ``mklscale cache info|clear`` shows or empties it. A new bank larger
        than that cap or than the free space of the cache's disk is refused before anything is
        written, the error naming its size and smaller choices (``rank=``, fewer kernels).
    client : distributed.Client, str or None, default=None
        A ``distributed.Client`` for the bank build and the engine's passes, a scheduler address
        (a client is opened for each fit and closed after), or None (Dask's threaded scheduler).
        ``clone`` (GridSearchCV...) shares a Client object by reference; an estimator holding a
        Client object cannot be pickled, so with process-based ``n_jobs`` pass the address instead.
    progress : bool, default=False
        Show progress bars (bank build and passes).
    verbose : bool or int, default=False
        Print one line per solver iteration (objective, gap, active kernels, passes).
    random_state : int, RandomState or None, default=None
        Seed for random kernel subsets and the solvers that draw random numbers.
    checkpoint_dir : str, path or None, default=None
        A folder where iterative solvers (spicy, smo, pfbs, sgd, gcd) save their state every
        ``checkpoint_every_s`` seconds, one file per head. During such a fit SIGTERM and SIGINT
        save the state and raise ``mklscale.runtime.checkpoint.Preempted``; ``fit(...,
        resume=True)`` then continues from it and gives the same model as an uninterrupted fit.
        Without ``resume`` an old checkpoint is discarded; checkpoints are removed when the fit ends.
    checkpoint_every_s : float > 0, default=60.0
        Seconds between checkpoint writes.
"""


class _MKLBase(BaseEstimator):
    """Shared parameters (``_PARAMETERS``), fitting and prediction; see the module docstring."""

    _task = "classification"

    #: scikit-learn's declaration of the parameters' types. What depends on the solver (C's range,
    #: solver_params' names, kernels' contents) is checked by the registry and families.resolve,
    #: whose messages say what the value means for the chosen solver.
    _parameter_constraints: dict = {
        "kernels": [str, dict, list, tuple, KernelSpec],
        "solver": [str],
        "C": [Real, StrOptions({registry.AUTO}), None],
        "solver_params": [dict, None],
        "normalize": [StrOptions({"trace", "diag"}), None],
        "rank": [Interval(Integral, 1, None, closed="left"), None],
        "computed": ["boolean", StrOptions({"auto"})],
        "cache_dir": [str, os.PathLike, None],
        "client": "no_validation",
        "progress": ["boolean"],
        "verbose": ["verbose"],
        "random_state": ["random_state"],
        "checkpoint_dir": [str, os.PathLike, None],
        "checkpoint_every_s": [Interval(Real, 0, None, closed="neither")],
    }

    def __init__(self, kernels="auto", solver="spicy", C="auto", solver_params=None, normalize="trace",
                 rank=None, computed="auto", cache_dir=None, client=None, progress=False, verbose=False, random_state=None,
                 checkpoint_dir=None, checkpoint_every_s=60.0):
        self.kernels = kernels
        self.solver = solver
        self.C = C
        self.solver_params = solver_params
        self.normalize = normalize
        self.rank = rank
        self.computed = computed
        self.cache_dir = cache_dir
        self.client = client
        self.progress = progress
        self.verbose = verbose
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every_s = checkpoint_every_s
        self.random_state = random_state

    def __sklearn_clone__(self):
        """Like sklearn's clone, but a distributed.Client (which cannot be deep-copied) is shared."""
        params = self.get_params(deep=False)
        client = params.pop("client")
        return type(self)(client=client, **{k: clone(v, safe=False) for k, v in params.items()})

    # ---- fitting ------------------------------------------------------------------------------
    def _check_solver(self) -> dict:
        try:
            self._validate_params()
        except InvalidParameterError as exc:
            raise InvalidInputError(f"{exc} See help({type(self).__name__}) for what each parameter means.") from None
        if not registry.supports(self.solver, self._task):
            raise InvalidInputError(
                f"solver {self.solver!r} does not support {self._task}; it supports "
                f"{list(registry.info(self.solver).tasks)}. Use one of "
                f"{[n for n in registry.names() if registry.supports(n, self._task)]}")
        params = registry.check_params(self.solver, self.solver_params, self._task)
        self._check_C(params)
        return params

    def _check_C(self, params: dict) -> None:
        """C is "auto" / None or a valid value of what it sets (registry row), checked before any bank is built."""
        if registry.is_auto(self.C):
            return
        problem = registry.regularisation(self.solver, self._task, params).check(self.C, self.solver)
        if problem:
            raise InvalidInputError(problem)

    def _fit_features(self, X, y, y_targets: list[np.ndarray], resume: bool = False, sample_weight=None):
        """Build or reuse the bank for X, then solve every head (``y``: the labels or targets as given)."""
        t0 = time.perf_counter()
        params = self._check_solver()
        specs = families.resolve(self.kernels, X.shape[1], self._seed())
        factor = {} if self.rank is None else {"rank": int(self.rank), "seed": self._seed() or 0}
        stored_key = bank_key(X, specs, self.normalize, BANK_DTYPE, factor)
        computed = self._computed_bank(stored_key, len(specs), X.shape, factor)
        key = bank_key(X, specs, self.normalize, BANK_DTYPE, {**factor, "computed": True}) if computed else stored_key

        def build(path, client):
            from mklscale.bank.build import build_bank

            return build_bank(X, specs, path, normalize=self.normalize, dtype=BANK_DTYPE, client=client,
                              progress=bool(self.progress), computed=computed, **factor)

        with _client(self.client) as client, \
                self._cached_bank(key, len(specs), X.shape[0], build, client, X.shape[1], factor.get("rank"),
                                  computed) as (bank, seconds):
            try:
                self._solve(bank, y_targets, params, t0, client, build_seconds=seconds, resume=resume, y=y,
                            sample_weight=sample_weight)
            except BankCorruptError as exc:
                # the cache's own bank, built from X, was damaged on disk (a pass found bytes that do not match
                # their checksum): recompute what verify finds bad and fit again, once
                from mklscale.bank.build import repair_bank

                warnings.warn(f"the cached bank {bank.path} was damaged ({exc}); it was repaired and the fit redone",
                              UserWarning, stacklevel=3)
                repair_bank(bank, client=client, progress=False)
                self._solve(bank, y_targets, params, t0, client, build_seconds=seconds, resume=resume, y=y,
                            sample_weight=sample_weight)
        return self

    def _fit_precomputed(self, K, y, y_targets: list[np.ndarray], resume: bool = False, sample_weight=None):
        """``kernels="precomputed"``: import the Gram matrices K (M, n, n) into a cached bank, then solve."""
        from mklscale.bank import KernelBank

        t0 = time.perf_counter()
        params = self._check_solver()
        if self.rank is not None:
            raise InvalidInputError("rank= makes a factor bank from features; with kernels='precomputed' the Gram "
                                    "matrices are stored as given: leave rank=None")
        if self.normalize not in (None, "trace"):
            raise InvalidInputError(f"normalize={self.normalize!r} needs k(x, x) of new points to scale their cross "
                                    "kernels, which precomputed Gram matrices do not give; use normalize='trace' "
                                    "(the default) or None")
        key = precomputed_key(K, self.normalize, BANK_DTYPE)

        def build(path, client):   # an imported bank appears whole (from_arrays is atomic): reuse it as it is
            if KernelBank.is_bank(path):
                return KernelBank.open(path)
            return KernelBank.from_arrays(K, path, normalize=self.normalize, dtype=BANK_DTYPE)

        with _client(self.client) as client, self._cached_bank(key, len(K), K.shape[1], build, client, 0) as (bank, seconds):
            self._solve(bank, y_targets, params, t0, client, build_seconds=seconds, resume=resume, y=y,
                        sample_weight=sample_weight)
        return self

    def _computed_bank(self, stored_key: str, M: int, shape: tuple[int, int], factor: dict) -> bool:
        """Whether this fit uses a computed bank (``computed``): "auto" when the stored one (cache key
        ``stored_key``; one already complete in the cache always fits) would not fit the cache's cap or
        disk; when the computed one would not fit either, BankTooLargeError names it."""
        from mklscale.bank import cache as bank_cache

        if self.computed != "auto":
            if self.computed and factor:
                raise InvalidInputError("computed=True computes the kernels in every pass and stores none; rank= "
                                        "stores factors: choose one")
            return bool(self.computed)
        if factor:
            return False
        cache, limit = self._cache_place()
        try:
            check_fits(cache / bank_cache.name_for(stored_key), M, shape[0], BANK_DTYPE, None, n_features=shape[1],
                       cap=limit, spelling="estimator")
            return False
        except BankTooLargeError:
            return True  # _cached_bank checks the computed bank in turn

    def _cache_place(self) -> tuple[Path, int | None]:
        """(the bank cache's folder, its cap in bytes or None)."""
        from mklscale.bank import cache as bank_cache

        limit = bank_cache.max_bytes()  # a bad $MKLSCALE_CACHE_MAX fails before any work
        return (Path(self.cache_dir) if self.cache_dir is not None else bank_cache.default_dir()), limit

    @contextlib.contextmanager
    def _cached_bank(self, key: str, M: int, n: int, build, client, n_features: int | None = None,
                     rank: int | None = None, computed: bool = False):
        """(bank, build seconds): the cached bank of ``key`` (``bank_key`` / ``precomputed_key``), made by
        ``build(path, client)`` if missing, marked in use (not evicted) until the context ends; the least
        recently used other banks are evicted over the cap. A bank to build that exceeds the cap
        ($MKLSCALE_CACHE_MAX) or its disk's free space raises BankTooLargeError (``size.check_fits``)
        before anything is written."""
        from mklscale.bank import cache as bank_cache
        from mklscale.bank.storage.writer_lock import bank_writer

        cache, limit = self._cache_place()
        name = bank_cache.name_for(key)
        # a bank over the cap or the disk's free space is refused before the cache folder or a lock file is made
        check_fits(cache / name, M, n, BANK_DTYPE, rank, n_features=n_features, cap=limit, spelling="estimator",
                   computed=computed)
        cache.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with bank_cache.using(cache, name):
            # the bank's writer lock (writer_lock; builds take it too): parallel fits (e.g. GridSearchCV
            # n_jobs > 1) build one bank once, and an eviction never removes a bank being built
            with bank_writer(cache / name, "build (estimator cache)"):
                bank = build(cache / name, client)
            seconds = time.perf_counter() - t0
            bank_cache.touch(bank.path)
            bank_cache.evict(cache, keep=bank.path, limit=limit)
            yield bank, seconds

    def _solve(self, bank, y_targets: list[np.ndarray], params: dict, t0: float, client, build_seconds: float = 0.0,
               resume: bool = False, y=None, sample_weight=None, engine=None):
        """Open one engine on ``bank`` (or use ``engine``, an open one on it), choose C (:meth:`_choose_C`),
        solve every head at it, keep the model. ``sample_weight``: per-row weights of the final fit
        (sample_weight x class_weight), or None. ``fit_stats_`` counts this fit's passes only."""
        seed = self._seed()
        seed_param = registry.info(self.solver).seed_param
        if seed_param and seed_param not in params and seed is not None:
            params[seed_param] = seed
        t_solve = time.perf_counter()
        with _engine_on(bank, engine, client, bool(self.progress)) as engine:
            before = engine.counters()
            self.C_ = self._choose_C(engine, bank, y_targets, params, y, sample_weight)
            fit_params = dict(params)
            fit_params.pop(registry.c_parameter(self.solver, self._task, params), None)   # C_ holds it now
            if self.verbose and "verbose" in registry.accepted_params(self.solver):
                fit_params.setdefault("verbose", True)
            checkpoints = [self._checkpoint(bank, t, h, fit_params, resume) for h, t in enumerate(y_targets)]
            signals = stop_on_signals() if any(checkpoints) else contextlib.nullcontext()
            with signals:
                results = [registry.fit_solver(self.solver, engine, t, self._task, C=self.C_, params=fit_params,
                                               checkpoint=ck, sample_weight=sample_weight)
                           for t, ck in zip(y_targets, checkpoints)]
            passes, bytes_read = (now - then for now, then in zip(engine.counters(), before))
        for ck in filter(None, checkpoints):
            ck.clear()
        info = {"solver": self.solver, "C": json_safe(self.C), "C_": self.C_, "solver_params": json_safe(params),
                "bank": str(bank.path), "solvers": [r.solver for r in results]}
        self.result_ = results[0] if len(results) == 1 else results
        self.model_ = MKLModel.from_results(bank, results, self._task, getattr(self, "classes_", None), info=info)
        _set_model_attributes(self, self.model_)
        message = self._convergence_message(results)
        self.fit_stats_ = {
            "passes": int(passes), "bytes_read": int(bytes_read),
            "seconds": time.perf_counter() - t0, "solve_seconds": time.perf_counter() - t_solve,
            "build_seconds": float(build_seconds), "bank": str(bank.path),
            "kernels_built": int(getattr(bank, "last_build_computed", 0)), "n_kernels": int(bank.M),
            "bank_representation": bank.representation,
            "n_heads": len(results), "converged": message is None, "convergence_warning": message,
            "C": self.C_,
        }
        if message is not None:
            warnings.warn(message, ConvergenceWarning, stacklevel=_caller_stacklevel())

    def _choose_C(self, engine, bank, y_targets: list[np.ndarray], params: dict, y, sample_weight=None) -> float:
        """The value ``C`` stands for on this bank: itself, or "auto" (``registry.resolve_C``: the solver's
        default times the problem's scale, one value for every head)."""
        return registry.resolve_C(self.solver, engine, y_targets, self._task, params, self.C)

    def _convergence_message(self, results: list) -> str | None:
        """The ConvergenceWarning text when some head's solve stopped unconverged (None when all converged).

        One message for the fit: the solver, the head(s) (the class, for one-vs-rest), the relative gap
        reached and the limit that ended the run, then what to change (``registry.convergence_advice``,
        derived from the solver's accepted parameters).
        """
        heads = list(getattr(self, "classes_", [])) if len(results) > 1 else [None]
        failed = [(head, r) for head, r in zip(heads, results) if not r.converged]
        if not failed:
            return None
        parts = []
        for head, r in failed:
            status = r.params.get("status")
            stopped = f", stopped by {status}" if isinstance(status, str) and status != "converged" else ""
            label = head.item() if isinstance(head, np.generic) else head
            parts.append(("" if head is None else f"class {label!r} (one-vs-rest): ")
                         + f"relative duality gap {r.gap:.3g}{stopped}")
        used = failed[0][1].params
        return (f"{type(self).__name__}: solver {self.solver!r} did not converge: {'; '.join(parts)}. The returned "
                f"model is not certified optimal. To converge, "
                + registry.convergence_advice(self.solver, self._task, used) + ".")

    def _checkpoint(self, bank, y: np.ndarray, head: int, params: dict, resume: bool) -> Checkpoint | None:
        """Head ``head``'s checkpoint (None without checkpoint_dir or for one-shot solvers).

        The fingerprint ties it to this problem: solver, C, parameters, the bank's checksums and y.
        """
        if self.checkpoint_dir is None or not registry.checkpoints(self.solver):
            return None
        fingerprint = {
            "solver": self.solver, "C": json_safe(self.C), "head": head,
            "params": json_safe({k: v for k, v in params.items() if k != "verbose"}),
            "bank": hashlib.sha256(np.ascontiguousarray(bank.checksums).tobytes()).hexdigest(),
            "y": hashlib.sha256(np.ascontiguousarray(y, dtype=np.float64).tobytes()).hexdigest(),
        }
        ck = Checkpoint(Path(self.checkpoint_dir) / f"{self.solver}-head{head}.npz", fingerprint,
                        every_s=self.checkpoint_every_s)
        if not resume:
            ck.clear()
        return ck

    def _seed(self) -> int | None:
        if self.random_state is None:
            return None
        if isinstance(self.random_state, (int, np.integer)) and not isinstance(self.random_state, bool):
            return int(self.random_state)
        return int(check_random_state(self.random_state).randint(2**31 - 1))

    def _fit_bank(self, bank, y):
        """Open the bank and validate y against it (shared by the fit_bank methods)."""
        from mklscale.bank.store import KernelBank

        bank = bank if isinstance(bank, KernelBank) else KernelBank.open(bank)
        try:
            y = column_or_1d(check_array(y, ensure_2d=False, dtype=None), warn=True)
        except ValueError as exc:
            raise InvalidInputError(f"y: {exc}; pass one finite target per row of the bank (drop or impute rows "
                                    "with missing targets before building it)") from exc
        if y.shape[0] != bank.n:
            raise InvalidInputError(f"y has {y.shape[0]} entries but the bank {bank.path} has n = {bank.n} "
                                    "training rows; pass the targets of the rows the bank was built on")
        for attr in ("n_features_in_", "feature_names_in_"):
            if hasattr(self, attr):
                delattr(self, attr)
        if bank.features is not None:  # its width only: X is not read
            self.n_features_in_ = int(bank.features.shape[1])
        return bank, y

    # ---- prediction ---------------------------------------------------------------------------
    def _row_weights(self, y, sample_weight):
        """The weight of every row's loss term: ``sample_weight`` times ``class_weight`` (classifiers), or None
        when neither is given. Checked before any bank is built: the solver must take weights."""
        from sklearn.utils.class_weight import compute_sample_weight
        from sklearn.utils.validation import _check_sample_weight

        class_weight = getattr(self, "class_weight", None)
        if sample_weight is None and class_weight is None:
            return None
        registry.check_sample_weight(self.solver, self.solver_params)
        try:
            w = _check_sample_weight(sample_weight, np.empty((len(y), 0)), dtype=np.float64,
                                     ensure_non_negative=True)
            if class_weight is not None:
                w = w * compute_sample_weight(class_weight, y)
        except ValueError as exc:
            raise InvalidInputError(f"sample_weight / class_weight: {exc}; give one finite weight >= 0 per row (and "
                                    "class_weight='balanced' or a dict of class -> weight)") from None
        if self._task == "regression" and np.any(w <= 0):
            raise InvalidInputError("sample_weight must be > 0 for regression (the weighted kernel ridge divides by "
                                    "it); drop the rows whose weight is 0")
        return w

    # ---- feature selection --------------------------------------------------------------------
    @property
    def feature_importances_(self) -> np.ndarray:
        """(n_features_in_,) each input feature's importance, read off the kept kernels' weights.

        For each head h (one, or one per class for one-vs-rest) the share of kept kernel m is
        s_{h,m} = |w_{h,m}| / sum_k |w_{h,k}|; a kernel on the feature subset F_m gives s_{h,m} / |F_m|
        to each of its features, and the heads are averaged::

            importance_j = (1/H) sum_h sum_{m : j in F_m} s_{h,m} / |F_m|

        so the importances are >= 0 and sum to 1 (``mklscale.feature_selection``). A kernel over all
        features (``features=None``, e.g. the Gaussians of ``kernels="auto"``) counts for every feature,
        s / d each: it never changes the order of the features, but it makes every feature's importance
        non-zero, so every feature is selected. To select features, use kernels on feature subsets
        (``kernels={"family": "gaussian", "features": "each"}``, "random_subsets"). As scikit-learn's
        ``feature_importances_``, ``SelectFromModel(est, prefit=True)`` reads it. A model fitted on
        precomputed kernels has no features: AttributeError (``hasattr`` is False).
        """
        check_is_fitted(self, "model_")
        try:
            return self.model_.feature_importances()
        except InvalidInputError as exc:
            raise AttributeError(str(exc)) from None

    @property
    def selected_features_(self) -> np.ndarray:
        """Indices of the input features with non-zero importance (``feature_importances_``), the most
        important first (ties: the lower index first). Every feature when a kept kernel uses all features."""
        from mklscale.feature_selection import ranked

        return ranked(self.feature_importances_)

    def feature_ranking(self, top: int | None = None):
        """The selected features and their importances as a pandas Series (name "importance"), the most
        important first, indexed by feature: its name when fitted on a DataFrame (``feature_names_in_``),
        else its column index; ``top``: only the first ``top``. Warns (UserWarning) when kept kernels over
        all features carry part of the weight: their share is on every feature, so every feature is
        listed and only kernels on feature subsets set the order (all tied when no such kernel is kept)."""
        import pandas as pd

        from mklscale.feature_selection import all_features_share, names_of

        importance = self.feature_importances_
        order = self.selected_features_[:top] if top is not None else self.selected_features_
        shared = all_features_share([s.features for s in self.model_.specs], self.model_.weights, importance.size)
        if shared > 0:
            tie = " (no kept kernel uses a feature subset: every feature ties)" if shared >= 1 - 1e-12 else ""
            warnings.warn(f"kept kernels over all {importance.size} features carry {100 * shared:.3g}% of the weight: "
                          f"it is spread evenly ({100 * shared / importance.size:.3g}% on every feature), so every feature "
                          f"is selected and only kernels on feature subsets order them{tie}. To select features, use "
                          "kernels on feature subsets (e.g. kernels={'family': 'gaussian', 'features': 'each'})",
                          UserWarning, stacklevel=2)
        names = names_of(importance.size, getattr(self, "feature_names_in_", None))
        return pd.Series(importance[order], index=pd.Index([names[j] for j in order], name="feature"),
                         name="importance")

    @property
    def _precomputed(self) -> bool:
        return isinstance(self.kernels, str) and self.kernels == PRECOMPUTED

    def _precomputed_fit_input(self, K, y):
        """(K (M, n, n), y) of ``fit(K, y)`` with kernels="precomputed", checked against each other."""
        K = precomputed_kernels(K, "fit(K, y)")
        try:
            y = column_or_1d(check_array(y, ensure_2d=False, dtype=None), warn=True)
        except ValueError as exc:
            raise InvalidInputError(f"y: {exc}; pass one label or target per row of the Gram matrices") from exc
        if K.shape[1] != K.shape[2] or K.shape[1] != y.shape[0]:
            raise InvalidInputError(f"fit(K, y): the Gram matrices are {K.shape[1]} x {K.shape[2]} and y has {y.shape[0]} "
                                    "entries; pass square (n, n) Gram matrices over the n training rows and their n labels")
        if y.shape[0] < 2:
            raise InvalidInputError("fit(K, y) needs at least 2 training rows")
        for attr in ("n_features_in_", "feature_names_in_"):   # no feature columns: kernels were given
            if hasattr(self, attr):
                delattr(self, attr)
        return K, y

    def _decision(self, X) -> np.ndarray:
        """f(x) = sum_m w_m k_m(x, X_S) c_S + b per head: (n,) for binary / regression, (n, K) for OvR.
        With kernels="precomputed", X is the cross kernels K_m(X_new, X_train) (M, n_new, n_train), raw
        as the Gram matrices given to fit."""
        check_is_fitted(self, "model_")
        if self._precomputed:
            return self.model_.decision_function_from_kernels(precomputed_kernels(X, "predict(K)"), normalised=False)
        X = _validated(self, X, reset=False, dtype=np.float64)
        message = self.model_.input_scale_warning(X)   # rows standardised for a model that takes raw ones
        if message is not None:
            warnings.warn(message, UserWarning, stacklevel=_caller_stacklevel())
        return self.model_.decision_function(X)

    def decision_function_from_kernels(self, K_cross) -> np.ndarray:
        """f from precomputed cross kernels K_m(X_new, X_train), shape (M or kept kernels, n_new, n_train).

        The only way to predict for a model fitted with ``fit_bank`` on a bank imported from Gram
        matrices (``KernelBank.from_arrays``): such kernels have no formula to evaluate on new data.
        A bank imported with ``cross_grams`` gives them, normalised, as ``bank.cross(None)``.
        """
        check_is_fitted(self, "model_")
        return self.model_.decision_function_from_kernels(K_cross)

    def save(self, path) -> Path:
        """Write the fitted model to the directory ``path`` (``model.json`` + ``arrays.npz``, atomic).

        ``mklscale.load(path)`` returns an equivalent fitted estimator (``result_`` is not saved).
        """
        check_is_fitted(self, "model_")
        fitted = {"n_features_in_": getattr(self, "n_features_in_", None),
                  "feature_names_in_": (None if not hasattr(self, "feature_names_in_")
                                        else [str(f) for f in self.feature_names_in_]),
                  "fit_stats_": json_safe(getattr(self, "fit_stats_", {}))}
        extra = {"estimator": {"class": type(self).__name__, "params": params_to_json(self.get_params(deep=False))},
                 "fitted": fitted}
        return self.model_.save(path, extra=extra)


def _has_proba(est) -> bool:
    params = est.solver_params if isinstance(est.solver_params, dict) else {}
    loss = params.get("loss", "logistic")
    if est.solver != "spicy" or loss != "logistic":
        raise AttributeError(f"predict_proba is available only for solver='spicy' with loss='logistic' "
                             f"(a probability model sigmoid(f)); this estimator uses solver={est.solver!r}"
                             + (f" with loss={loss!r}" if est.solver == "spicy" else "")
                             + ". Use decision_function, or wrap it in sklearn's CalibratedClassifierCV")
    return True


class _ExplainedAvailableIf(_AvailableIfDescriptor):
    """scikit-learn's ``available_if`` (``hasattr`` is False when the check fails), with the check's
    reason in the AttributeError's message: scikit-learn's says only "This 'X' has no attribute 'y'"
    and keeps the reason in ``__cause__``, which a traceback shows but ``str(exc)`` does not."""

    def _check(self, obj, owner):
        try:
            super()._check(obj, owner)
        except AttributeError as exc:
            if exc.__cause__ is None:
                raise
            raise AttributeError(f"{exc}: {exc.__cause__}", name=self.attribute_name, obj=obj) from exc.__cause__


def _available_if(check):
    """``sklearn.utils.metaestimators.available_if`` whose AttributeError says why (see above)."""
    return lambda fn: _ExplainedAvailableIf(fn, check, attribute_name=fn.__name__)


class MKLClassifier(ClassifierMixin, _MKLBase):
    __doc__ = f"""Multiple kernel learning classifier (binary, or one-vs-rest for K >= 3 classes).

    Learns f(x) = sum_m w_m k_m(x, X_train) c + b over a bank of kernels k_m, sparse in the kernel
    weights w, with one of the solvers of :mod:`mklscale.solvers.registry` (see the module docstring
    of :mod:`mklscale.estimators`). ``predict_proba`` exists only for ``solver="spicy"`` with the
    logistic loss (its default for classification).

{_PARAMETERS}    class_weight : "balanced", dict or None, default=None
        Weights of the classes' loss terms, as in scikit-learn: "balanced" weighs class c by
        n / (K n_c); a dict maps labels to weights. They multiply ``fit``'s ``sample_weight`` and need a
        solver that takes per-sample weights (uniform, alignment, fheuristic, gcd with stage='two').

    Attributes
    ----------
    classes_ : ndarray of shape (K,)
        The labels seen at fit (sorted).
    C_ : float
        The value of the solver's main regularisation the fit used (``C``, or what "auto" stood for).
    n_features_in_, feature_names_in_ :
        As in scikit-learn.
    result_ : MKLResult or list of MKLResult
        The solver's result (binary), or one per class in the order of ``classes_`` (one-vs-rest).
    model_ : MKLModel
        What prediction needs: kept kernels, their specs and normalisation, support rows.
    kernel_weights_ : pandas Series or DataFrame
        Series (binary) indexed by kernel name, or DataFrame (one-vs-rest) classes x kernels; KEPT
        kernels only (non-zero weight in some head), zeros where a class does not use one. Fitted on
        a DataFrame, the names show its column names instead of column indices, e.g.
        ``gaussian(width=2)[mean radius]`` (``KernelSpec.label``).
    selected_kernels_ : list of str
        Names of the kept kernels.
    feature_importances_ : ndarray of shape (n_features_in_,)
        Each input feature's importance: the kept kernels' shares of the weight, each split evenly
        among the kernel's features, averaged over the heads; sums to 1 (a kernel over all features
        counts for every feature). ``feature_ranking()`` lists them by name, the most important first;
        ``mklscale.feature_stability`` says how often each is selected over subsample refits.
    selected_features_ : ndarray of int
        The features with non-zero importance, the most important first.
    fit_stats_ : dict
        passes, bytes_read, seconds, solve_seconds, build_seconds, bank (path), kernels_built (0
        when the bank came from the cache), n_kernels, n_heads, converged (every head) and
        convergence_warning (the text of the ConvergenceWarning a fit that did not converge issues:
        solver, class, gap reached and what to change; None when converged).
    """

    _parameter_constraints = {**_MKLBase._parameter_constraints,
                              "class_weight": [StrOptions({"balanced"}), dict, None]}

    def __init__(self, kernels="auto", solver="spicy", C="auto", solver_params=None, normalize="trace", rank=None,
                 computed="auto", cache_dir=None, client=None, progress=False, verbose=False, random_state=None,
                 checkpoint_dir=None, checkpoint_every_s=60.0, class_weight=None):
        super().__init__(kernels=kernels, solver=solver, C=C, solver_params=solver_params, normalize=normalize,
                         rank=rank, computed=computed, cache_dir=cache_dir, client=client, progress=progress, verbose=verbose,
                         random_state=random_state, checkpoint_dir=checkpoint_dir,
                         checkpoint_every_s=checkpoint_every_s)
        self.class_weight = class_weight

    def fit(self, X, y, sample_weight=None, resume: bool = False):
        """Fit on raw features X (n, d) and labels y (any hashable labels, at least two classes).

        ``sample_weight`` (n,) >= 0 weights each row's loss term in the final fit (libsvm's per-sample C;
        with ``class_weight`` the two multiply): solvers uniform, alignment, fheuristic and gcd with
        stage='two' (``registry.info(solver).sample_weights``); others refuse it.
        ``resume``: continue from the checkpoints in ``checkpoint_dir`` (see the class docstring).
        """
        if self._precomputed:
            K, y = self._precomputed_fit_input(X, y)
            weights = self._row_weights(y, sample_weight)
            return self._fit_precomputed(K, y, self._targets(y), resume, weights)
        X, y = _validated(self, X, y, ensure_min_samples=2, dtype=np.float64)
        weights = self._row_weights(y, sample_weight)
        return self._fit_features(X, y, self._targets(y), resume, weights)

    def fit_bank(self, bank, y, resume: bool = False, engine=None):
        """Fit on a precomputed KernelBank (or its path); y are the labels of the bank's rows.

        Prediction from raw features needs a bank built from features (``build_bank``); for banks
        imported from Gram matrices use ``decision_function_from_kernels``. ``engine``: an open
        :class:`~mklscale.engine.Engine` on ``bank`` to fit with (its block cache kept from earlier
        work, e.g. a pipeline's cross-validation); None opens one for this fit.
        """
        t0 = time.perf_counter()
        params = self._check_solver()
        bank, y = self._fit_bank(bank, y)
        targets = self._targets(y)
        with _client(self.client) as client:
            self._solve(bank, targets, params, t0, client, resume=resume, y=y, engine=engine)
        return self

    def _targets(self, y) -> list[np.ndarray]:
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        if self.classes_.size < 2:
            only = self.classes_[:1].tolist()[0]
            raise InvalidInputError(f"y has only one class ({only!r}); a classifier needs at least two classes to "
                                    "train: give labels of at least two classes")
        return head_targets(y, self.classes_)

    def decision_function(self, X) -> np.ndarray:
        """f(x) = sum_m w_m k_m(x, X_S) c_S + b: (n,) for binary (> 0: classes_[1]), (n, K) for one-vs-rest."""
        return self._decision(X)

    def predict(self, X) -> np.ndarray:
        """classes_[f > 0] (binary) or classes_[argmax_k f_k] (one-vs-rest)."""
        return self._labels(self.decision_function(X))

    def predict_from_kernels(self, K_cross) -> np.ndarray:
        """Labels from precomputed cross kernels (see ``decision_function_from_kernels``)."""
        return self._labels(self.decision_function_from_kernels(K_cross))

    def _labels(self, f: np.ndarray) -> np.ndarray:
        if f.ndim == 1:
            return self.classes_[(f > 0).astype(np.int64)]
        return self.classes_[np.argmax(f, axis=1)]

    @_available_if(_has_proba)
    def predict_proba(self, X) -> np.ndarray:
        """(n, K) class probabilities: sigmoid(f) for binary, normalised sigmoid(f_k) for one-vs-rest."""
        from scipy.special import expit

        f = self.decision_function(X)
        if f.ndim == 1:
            p = expit(f)
            return np.column_stack([1.0 - p, p])
        P = expit(f)
        return P / P.sum(axis=1, keepdims=True)

    @_available_if(_has_proba)
    def predict_log_proba(self, X) -> np.ndarray:
        """log of predict_proba."""
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))


class MKLRegressor(RegressorMixin, _MKLBase):
    __doc__ = f"""Multiple kernel learning regressor; f(x) = sum_m w_m k_m(x, X_train) c + b predicts y.

    The default solver is spicy with the square loss (1/2)(y - f)^2; the regression solvers are those
    with "regression" in ``registry.info(name).tasks``.

{_PARAMETERS}
    Attributes
    ----------
    As MKLClassifier without ``classes_``; ``result_`` is one MKLResult and ``kernel_weights_`` a
    pandas Series of the kept kernels (``feature_importances_``, ``selected_features_`` and
    ``feature_ranking()`` as there, from the one head).
    """

    _task = "regression"

    def fit(self, X, y, sample_weight=None, resume: bool = False):
        """Fit on raw features X (n, d) and real targets y (n,); ``sample_weight`` (> 0: the weighted kernel
        ridge of the final fit) and ``resume`` as in MKLClassifier.fit."""
        if self._precomputed:
            K, y = self._precomputed_fit_input(X, y)
            if not np.issubdtype(np.asarray(y).dtype, np.number) or not np.isfinite(np.asarray(y, dtype=float)).all():
                raise InvalidInputError("y must hold finite real targets; drop or impute the rows with missing values")
            weights = self._row_weights(y, sample_weight)
            return self._fit_precomputed(K, y, [np.asarray(y, dtype=np.float64)], resume, weights)
        X, y = _validated(self, X, y, ensure_min_samples=2, y_numeric=True, dtype=np.float64)
        weights = self._row_weights(y, sample_weight)
        return self._fit_features(X, y, [np.asarray(y, dtype=np.float64)], resume, weights)

    def fit_bank(self, bank, y, resume: bool = False, engine=None):
        """Fit on a precomputed KernelBank (or its path); see MKLClassifier.fit_bank (``engine`` too)."""
        t0 = time.perf_counter()
        params = self._check_solver()
        bank, y = self._fit_bank(bank, y)
        y = np.asarray(y, dtype=np.float64)
        if not np.isfinite(y).all():
            raise InvalidInputError("y contains NaN or inf; drop or impute those rows")
        with _client(self.client) as client:
            self._solve(bank, [y], params, t0, client, resume=resume, y=y, engine=engine)
        return self

    def predict(self, X) -> np.ndarray:
        """f(x) = sum_m w_m k_m(x, X_S) c_S + b."""
        return self._decision(X)

    def predict_from_kernels(self, K_cross) -> np.ndarray:
        return self.decision_function_from_kernels(K_cross)


# ---- cross-validated estimators ------------------------------------------------------------------
_CV_PARAMETERS = """\
    Cs : int, array-like of float or "auto", default=10
        The values of the solver's main regularisation to try: an int asks for that many values of the
        solver's "auto" grid (``registry.regularisation(solver, task).grid``: from the most regularised
        end, e.g. spicy's C_max where no kernel is kept, geometrically to the other end), else the values
        themselves (valid for the solver: > 0, or >= 0 for pfbs' tau); "auto": the one value
        ``C="auto"`` stands for (``cv_results_`` then scores it, as ``mklscale fit`` prints).
    cv : int or a scikit-learn splitter, default=3
        Folds: an int k gives k folds stratified by class (classification), seeded by ``random_state``;
        a splitter (KFold, StratifiedKFold, GroupKFold, ...) must put every row in exactly one test fold.
        Folds are row subsets of ONE bank (no bank per fold), each fitting a warm-started path over
        ``Cs`` (``mklscale.solvers.cv``).
    scoring : str or None, default=None
        The fold score, greater is better: None ("accuracy" for classification, "r2" for regression),
        "balanced_accuracy", "roc_auc", or "neg_mean_squared_error" (``mklscale.solvers.cv.SCORINGS``).
"""

_CV_ATTRIBUTES = """\
    C_ : float
        The chosen value (the best mean fold score; ties go to the more regularised value), at which
        the final model is refitted on all rows.
    Cs_ : ndarray
        The grid, from the most to the least regularised value.
    cv_results_ : dict of arrays (as scikit-learn's GridSearchCV)
        ``param_C``, ``mean_test_score``, ``std_test_score``, ``split<k>_test_score``,
        ``rank_test_score``, ``n_unconverged`` (fold fits that stopped unconverged), ``mean_fit_time``
        and ``std_fit_time`` (seconds of a fold's solve at each value, over the folds whose path reached
        it; NaN where none did), ``fold_seconds``.
    best_score_ : float
        The mean fold score at ``C_``.
    best_index_ : int
        The index of ``C_`` in ``Cs_``.
"""


def _fit_times(fit_seconds: np.ndarray) -> dict:
    """scikit-learn's ``mean_fit_time`` / ``std_fit_time`` per value over the folds that reached it (NaN
    where none did: a path stopped before it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # "mean of empty slice": no fold reached the value
        return {"mean_fit_time": np.nanmean(fit_seconds, axis=1), "std_fit_time": np.nanstd(fit_seconds, axis=1)}


class _CrossValidated:
    """``C`` chosen by k-fold cross-validation on the rows of one bank (``mklscale.solvers.cv``), then
    the final model refitted on every row at the chosen value, on the same engine."""

    #: C is not a parameter of the CV estimators: it is chosen (``C_``)
    C = registry.AUTO

    def _choose_C(self, engine, bank, y_targets, params, y, sample_weight=None) -> float:
        reg = registry.regularisation(self.solver, self._task, params)
        grid, rule = self._grid(engine, y_targets, params, reg)
        fold = self._folds(y, bank)
        result = cv.cross_validate(self.solver, engine, y, self._task, grid, params, getattr(self, "classes_", None),
                                   fold=fold, scoring=self.scoring, sample_weight=sample_weight)
        mean, std = result.mean, result.std
        best = cv.best_index(mean, grid, reg.larger_regularises)
        order = np.argsort(-mean, kind="stable")
        rank = np.empty(len(grid), dtype=np.int64)
        rank[order] = np.arange(1, len(grid) + 1)
        self.Cs_ = np.asarray(grid)
        self.cv_results_ = {"param_C": np.asarray(grid), "mean_test_score": mean, "std_test_score": std,
                            **{f"split{k}_test_score": result.scores[:, k] for k in range(result.scores.shape[1])},
                            "rank_test_score": rank, "n_unconverged": result.unconverged.sum(axis=1),
                            **_fit_times(result.fit_seconds), "fold_seconds": result.seconds,
                            "scoring": result.scoring, "rule": rule}
        self.best_score_, self.best_index_ = float(mean[best]), int(best)
        return float(grid[best])

    def _grid(self, engine, y_targets, params, reg) -> tuple[list[float], str]:
        """(values from the most to the least regularised, how they were made)."""
        Cs = self.Cs
        if isinstance(Cs, str) and Cs == registry.AUTO:
            return [reg.auto(engine, y_targets, self._task, params)], f"auto: {reg.default:g} x {reg.scale_text}"
        if isinstance(Cs, (int, np.integer)) and not isinstance(Cs, bool):
            if Cs < 1:
                raise InvalidInputError(f"Cs = {Cs} must be >= 1 (the number of values to try) or a list of values")
            return reg.grid(engine, y_targets, self._task, params, int(Cs))
        return _given_values(Cs, reg, self.solver, "an int or a list of numbers"), "given"

    def _folds(self, y, bank) -> np.ndarray:
        """The fold of every bank row: ``cv`` as an int (stratified and seeded) or a splitter's test sets."""
        y = np.asarray(y)
        classification = self._task == "classification"
        smallest = int(min(np.unique(y, return_counts=True)[1])) if classification else y.size
        if isinstance(self.cv, (int, np.integer)) and not isinstance(self.cv, bool):
            if not 2 <= self.cv <= smallest:
                what = "rows of every class" if classification else "rows"
                raise InvalidInputError(f"cv = {self.cv} folds need 2 <= cv <= {smallest} (the fewest {what}); "
                                        "lower cv")
            return cv.fold_assignment(y, int(self.cv), classification, self._seed() or 0)
        if not hasattr(self.cv, "split"):
            raise InvalidInputError(f"cv must be an int or a scikit-learn splitter (KFold, StratifiedKFold, ...); "
                                    f"got {self.cv!r}")
        fold = np.full(y.size, -1, dtype=np.int64)
        for k, (_, test) in enumerate(self.cv.split(np.zeros((y.size, 1)), y)):
            if np.any(fold[test] >= 0):
                raise InvalidInputError(f"cv {self.cv!r} puts a row in two test folds; use a splitter whose test "
                                        "sets partition the rows (KFold, StratifiedKFold, GroupKFold)")
            fold[test] = k
        if np.any(fold < 0) or fold.max() < 1:
            raise InvalidInputError(f"cv {self.cv!r} leaves rows out of every test fold or makes one fold; use a "
                                    "splitter whose test sets partition the rows (KFold, StratifiedKFold)")
        return fold


def _cv_init(self, kernels, solver, Cs, cv, scoring, solver_params, normalize, rank, cache_dir, client, progress,
             verbose, random_state, checkpoint_dir, checkpoint_every_s, computed="auto", **classifier):
    _MKLBase.__init__(self, kernels=kernels, solver=solver, solver_params=solver_params, normalize=normalize,
                      rank=rank, computed=computed, cache_dir=cache_dir, client=client, progress=progress, verbose=verbose,
                      random_state=random_state, checkpoint_dir=checkpoint_dir, checkpoint_every_s=checkpoint_every_s)
    del self.C   # the class attribute (C is chosen), not a parameter
    self.Cs, self.cv, self.scoring = Cs, cv, scoring
    for key, value in classifier.items():    # class_weight
        setattr(self, key, value)


_CV_CONSTRAINTS = {
    **{k: v for k, v in _MKLBase._parameter_constraints.items() if k != "C"},
    "Cs": [Interval(Integral, 1, None, closed="left"), "array-like", StrOptions({registry.AUTO})],
    "cv": [Interval(Integral, 2, None, closed="left"), "cv_object"],
    "scoring": [StrOptions(set(cv.SCORINGS)), None],
}


class MKLClassifierCV(_CrossValidated, MKLClassifier):
    __doc__ = f"""Multiple kernel learning classifier whose regularisation is chosen by cross-validation.

    As :class:`MKLClassifier`, with ``C`` chosen among ``Cs`` by k-fold cross-validation on the
    training rows (as scikit-learn's ``LogisticRegressionCV`` / ``LassoCV``): the bank is built once,
    every fold is a row subset of it, each fold fits a warm-started path over the grid, and the final
    model is refitted on all rows at ``C_``.

{_CV_PARAMETERS}
    Other parameters: as :class:`MKLClassifier` (without ``C``).

    Attributes
    ----------
{_CV_ATTRIBUTES}
    and every attribute of :class:`MKLClassifier`.
    """

    _parameter_constraints = {**_CV_CONSTRAINTS, "class_weight": [StrOptions({"balanced"}), dict, None]}

    def __init__(self, kernels="auto", solver="spicy", Cs=10, cv=3, scoring=None, solver_params=None,
                 normalize="trace", rank=None, computed="auto", cache_dir=None, client=None, progress=False,
                 verbose=False, random_state=None, checkpoint_dir=None, checkpoint_every_s=60.0, class_weight=None):
        _cv_init(self, kernels, solver, Cs, cv, scoring, solver_params, normalize, rank, cache_dir, client, progress,
                 verbose, random_state, checkpoint_dir, checkpoint_every_s, computed=computed,
                 class_weight=class_weight)


class MKLRegressorCV(_CrossValidated, MKLRegressor):
    __doc__ = f"""Multiple kernel learning regressor whose regularisation is chosen by cross-validation.

    As :class:`MKLRegressor`, with ``C`` chosen by cross-validation as in :class:`MKLClassifierCV`.

{_CV_PARAMETERS}
    Attributes
    ----------
{_CV_ATTRIBUTES}
    and every attribute of :class:`MKLRegressor`.
    """

    _parameter_constraints = _CV_CONSTRAINTS

    def __init__(self, kernels="auto", solver="spicy", Cs=10, cv=3, scoring=None, solver_params=None,
                 normalize="trace", rank=None, computed="auto", cache_dir=None, client=None, progress=False,
                 verbose=False, random_state=None, checkpoint_dir=None, checkpoint_every_s=60.0):
        _cv_init(self, kernels, solver, Cs, cv, scoring, solver_params, normalize, rank, cache_dir, client, progress,
                 verbose, random_state, checkpoint_dir, checkpoint_every_s, computed=computed)


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of warnings.warn called here that points at the first frame outside mklscale
    (the user's ``fit``/``fit_bank`` call, however deep inside the package the warning is raised)."""
    package = str(Path(__file__).resolve().parent)
    frame, level = sys._getframe(1), 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


# ---- input validation --------------------------------------------------------------------------------
#: (fragment of scikit-learn's message, what to do) for the ValueErrors of validate_data
_VALIDATION_HINTS = (
    ("contains NaN", "impute or drop the rows with missing values first (e.g. sklearn.impute.SimpleImputer)"),
    ("contains infinity", "replace or drop the infinite values first"),
    ("features, but", "pass X with the same columns, in the same order, as at fit"),
    ("feature names", "pass the same columns, with the same names, as at fit"),
    ("inconsistent numbers of samples", "pass one target per row of X"),
    ("could not convert", "convert X to numbers first (e.g. encode categorical columns)"),
    ("Unknown label type", "pass class labels (ints or strings) to a classifier, or use MKLRegressor"),
)


def _validated(est, X, y="no_validation", **kwargs):
    """sklearn's ``validate_data`` with its ValueErrors raised as InvalidInputError saying what to do.

    The scikit-learn text stays first (its estimator checks match on it); a hint is appended.
    """
    try:
        if isinstance(y, str) and y == "no_validation":
            return validate_data(est, X, **kwargs)
        return validate_data(est, X, y, **kwargs)
    except InvalidInputError:
        raise
    except ValueError as exc:
        text = str(exc).rstrip()
        hint = next((h for fragment, h in _VALIDATION_HINTS if fragment in text),
                    "pass a finite numeric array of shape (n_samples, n_features)")
        if "contains NaN" in text or "contains infinity" in text:
            text = text.splitlines()[0]  # sklearn's first line; its long advice follows as our hint
        raise InvalidInputError(f"{text}{'' if text.endswith('.') else '.'} {hint[0].upper()}{hint[1:]}.") from exc


# ---- kernels ---------------------------------------------------------------------------------------
def bank_key(X: np.ndarray, specs, normalize, dtype: str, factor: dict | None = None) -> str:
    """sha256 of (data shape and float64 bytes, specs JSON, normalize, dtype, standardisation on,
    kernel arithmetic version, and a factor bank's settings ``factor``): a cached bank is reused only
    where this mklscale would compute the same bytes (an unfinished one of another version could
    not be resumed)."""
    h = hashlib.sha256()
    X = np.ascontiguousarray(X, dtype=np.float64)
    h.update(repr(X.shape).encode())
    h.update(X.tobytes())
    h.update(specs_to_json(specs).encode())
    h.update(repr((normalize, str(dtype), True, _compute.ARITHMETIC)).encode())
    if factor:
        h.update(repr(sorted(factor.items())).encode())
    return h.hexdigest()


def precomputed_key(K, normalize, dtype: str) -> str:
    """sha256 of imported Gram matrices (shape, dtype and bytes, read one kernel at a time, so a memory-mapped
    array is never loaded whole), ``normalize`` and the storage dtype: the cache key of their bank."""
    h = hashlib.sha256()
    h.update(repr(("precomputed", K.shape, str(K.dtype), normalize, str(dtype))).encode())
    for m in range(K.shape[0]):
        h.update(np.ascontiguousarray(K[m]).tobytes())
    return h.hexdigest()


def precomputed_kernels(K, what: str = "K") -> np.ndarray:
    """Gram matrices as an (M, n, m) float array: a list of (n, m) matrices or an (M, n, m) array (a
    memory-mapped .npy stays mapped); anything else is an InvalidInputError saying what to pass."""
    if isinstance(K, np.ndarray) and K.ndim == 3 and np.issubdtype(K.dtype, np.floating):
        return K
    if isinstance(K, (list, tuple)) and K and all(np.ndim(k) == 2 for k in K):
        shapes = {np.shape(k) for k in K}
        if len(shapes) != 1:
            raise InvalidInputError(f"{what}: the Gram matrices have different shapes {sorted(shapes)}; give M "
                                    "matrices over the same rows")
        return np.stack([np.asarray(k, dtype=np.float64) for k in K])
    shape = np.shape(K) if not isinstance(K, (list, tuple)) else f"a list of {len(K)} items"
    raise InvalidInputError(
        f"{what}: with kernels='precomputed' pass the Gram matrices: a list of M (n, n) arrays or an (M, n, n) float "
        f"array (np.load(path, mmap_mode='r') keeps a large one on disk) for fit, and (M, n_test, n_train) cross "
        f"kernels K_m(X_test, X_train) for predict; got {shape}. For feature rows X use kernels='auto' (or another "
        "family); to import Gram matrices into a bank of your own see mklscale.bank.KernelBank.from_arrays")


@contextlib.contextmanager
def _client(client):
    """The client to use: a scheduler address opens one (``runtime.cluster.open_client``, bounded
    waits) for the duration of the fit."""
    if not isinstance(client, str):
        yield client
        return
    from mklscale.runtime.cluster import open_client

    with open_client({"kind": "address", "address": client, "timeout_s": 30.0}, quiet=True) as opened:
        yield opened


def _engine_on(bank, engine, client, progress: bool):
    """A context giving an engine on ``bank``: ``engine`` itself, left open (the caller's: its block cache
    outlives the fit), or a new :class:`~mklscale.engine.Engine`, closed at the end."""
    from mklscale.engine import Engine
    from mklscale.engine.core import small_bank_bytes

    if engine is None:
        return Engine(bank, client=client, progress=progress, local_bytes=small_bank_bytes())
    if str(engine.bank.path) != str(bank.path):
        raise InvalidInputError(f"engine= is open on the bank {engine.bank.path}, not on {bank.path}; give an "
                                "engine on the bank being fitted, or none")
    return contextlib.nullcontext(engine)


# ---- fitted attributes and model files ---------------------------------------------------------------
def _set_model_attributes(est, model: MKLModel) -> None:
    import pandas as pd

    feature_names = getattr(est, "feature_names_in_", None)  # a DataFrame's columns at fit
    names = [spec.label(feature_names) for spec in model.specs]
    if model.n_heads == 1:
        est.kernel_weights_ = pd.Series(model.weights[0], index=pd.Index(names, name="kernel"), name="weight")
    else:
        est.kernel_weights_ = pd.DataFrame(model.weights, index=pd.Index(list(model.classes), name="class"),
                                           columns=pd.Index(names, name="kernel"))
    est.selected_kernels_ = list(names)


def params_to_json(params: dict) -> dict:
    """Estimator parameters as JSON (KernelSpecs as {"spec": dict}; the client is not saved)."""
    out = dict(params)
    kernels = out.get("kernels")
    if isinstance(kernels, (list, tuple)):
        out["kernels"] = [{"spec": k.to_dict()} if isinstance(k, KernelSpec) else json_safe(k) for k in kernels]
    else:
        out["kernels"] = json_safe(kernels)
    out["client"] = None
    out["cache_dir"] = None if out.get("cache_dir") is None else str(out["cache_dir"])
    rs = out.get("random_state")
    out["random_state"] = int(rs) if isinstance(rs, (int, np.integer)) and not isinstance(rs, bool) else None
    try:
        out["solver_params"] = json_safe(out.get("solver_params"))
    except TypeError as exc:
        raise InvalidInputError(f"solver_params cannot be saved as JSON ({exc}); use numbers, strings and lists") from None
    return out


def params_from_json(params: dict) -> dict:
    out = dict(params)
    if isinstance(out.get("kernels"), list):
        out["kernels"] = [KernelSpec.from_dict(k["spec"]) if isinstance(k, dict) and set(k) == {"spec"} else k
                          for k in out["kernels"]]
    return out


def estimator_from_model(model: MKLModel, doc: dict):
    """The fitted estimator a model.json document describes (used by ``mklscale.load``)."""
    from mklscale.errors import ModelFileError

    est_doc = doc.get("estimator") or {}
    classes = {"MKLClassifier": MKLClassifier, "MKLRegressor": MKLRegressor, "MKLClassifierCV": MKLClassifierCV,
               "MKLRegressorCV": MKLRegressorCV}
    cls = classes.get(est_doc.get("class")) if isinstance(est_doc.get("class"), str) else None
    if cls is None:
        raise ModelFileError(f"model.json names estimator class {est_doc.get('class')!r}; expected one of "
                             f"{list(classes)}; re-save the model with this mklscale or refit it")
    params = params_from_json(est_doc.get("params") or {})
    unknown = sorted(set(params) - set(cls._get_param_names()))
    if unknown:
        raise ModelFileError(f"model.json gives {cls.__name__} unknown parameter(s) {unknown}; it was damaged or "
                             "edited, or written by another mklscale: refit the model")
    est = cls(**params)
    try:
        est._validate_params()
    except (ValueError, TypeError) as exc:
        raise ModelFileError(f"model.json's estimator parameters are invalid ({exc}); it was damaged or edited: "
                             "refit the model") from None
    est.model_ = model
    if issubclass(cls, MKLClassifier):
        est.classes_ = model.classes
    fitted = doc.get("fitted") or {}
    fitted = fitted if isinstance(fitted, dict) else {"n_features_in_": "not a table"}
    n_in, names_in = fitted.get("n_features_in_"), fitted.get("feature_names_in_")
    if (n_in is not None and (isinstance(n_in, bool) or not isinstance(n_in, int))) \
            or (names_in is not None and (not isinstance(names_in, list) or not all(isinstance(f, str) for f in names_in)
                                          or (n_in is not None and len(names_in) != n_in))):
        raise ModelFileError("model.json's fitted attributes (n_features_in_, feature_names_in_) are not a number of "
                             "columns and one name per column; it was damaged or edited: refit the model")
    if n_in is not None:
        est.n_features_in_ = n_in
    if names_in is not None:
        est.feature_names_in_ = np.asarray(names_in, dtype=object)
    est.fit_stats_ = fitted.get("fit_stats_", {})
    _set_model_attributes(est, model)
    return est


def feature_stability(estimator, X, y, n_resamples: int = 20, fraction: float = 0.5, Cs=None, random_state=None):
    """How often each feature is selected when ``estimator`` is refitted on subsamples of (X, y), or along
    its regularisation path: a :class:`mklscale.feature_selection.FeatureStability` (``frequency`` per
    feature, ``frequency_by_value`` per value of C, ``to_frame()`` a pandas DataFrame, the most often
    selected feature first, indexed by the DataFrame's column names when X is one).

    A feature is selected by a fit when its importance is non-zero (``feature_importances_``: some kept
    kernel uses it). ``estimator`` (fitted or not; a clone is fitted on X, y first, so its bank is built or
    taken from the cache, and C is chosen as its ``fit`` chooses it) gives the kernels, solver and
    parameters. Then, on that one bank (row views, nothing rebuilt):

    - ``n_resamples`` > 0 (stability selection, Meinshausen and Buehlmann 2010): each of ``n_resamples``
      subsamples draws ``fraction`` of every class's rows without replacement and fits at each value of
      ``Cs`` taken relative to the subsample's own scale (``feature_selection.stability``);
      ``Cs=None``: the fitted ``C_`` alone;
    - ``n_resamples=0``: one fit per value on all rows, along the warm-started path (cheaper);
      ``Cs=None``: the CV estimators' grid ``Cs_``, else the solver's 10-value "auto" grid.

    ``Cs``: None, an int (that many values of the "auto" grid) or a list of values. A ``class_weight`` of
    the estimator weighs every refit as it weighs the fit. ``random_state``: the
    subsamples' seed (default: the estimator's ``random_state``, else 0). The frequency of feature j is
    (fits that selected j) / (fits). Kernels over all features select every feature (see
    ``feature_importances_``): use kernels on feature subsets.
    """
    from mklscale.bank.cache import using
    from mklscale.bank.store import KernelBank
    from mklscale.feature_selection import check_settings, stability

    if not isinstance(estimator, _MKLBase):
        raise InvalidInputError(f"feature_stability takes an mklscale estimator (MKLClassifier, MKLRegressor or their CV "
                                f"versions); got {type(estimator).__name__}")
    if estimator._precomputed:
        raise InvalidInputError("kernels='precomputed': the Gram matrices have no input features, so no feature is "
                                "selected; give an estimator whose kernels are computed from features")
    check_settings(n_resamples, fraction)
    est = clone(estimator)
    est.fit(X, y)
    params = est._check_solver()
    seed_param = registry.info(est.solver).seed_param
    if seed_param and seed_param not in params and est._seed() is not None:
        params[seed_param] = est._seed()
    params.pop(registry.c_parameter(est.solver, est._task, params), None)
    y = column_or_1d(np.asarray(y), warn=False)
    classes = getattr(est, "classes_", None)
    sample_weight = est._row_weights(y, None)      # class_weight, as the fit applied it
    heads = head_targets(y, classes) if classes is not None else [np.asarray(y, dtype=np.float64)]
    if random_state is None:
        seed = est._seed() or 0
    elif isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        seed = int(random_state)
    else:
        seed = int(check_random_state(random_state).randint(2**31 - 1))
    path = Path(est.fit_stats_["bank"])
    with _client(est.client) as client, using(path.parent, path.name), \
            _engine_on(KernelBank.open(path), None, client, bool(est.progress)) as engine:
        values = _stability_values(est, engine, heads, params, Cs, n_resamples)
        return stability(est.solver, engine, engine.bank.specs, y, est._task, values, params, classes=classes,
                         n_features=int(est.n_features_in_), n_resamples=int(n_resamples), fraction=fraction,
                         seed=seed, feature_names=getattr(est, "feature_names_in_", None),
                         sample_weight=sample_weight)


def _stability_values(est, engine, heads, params: dict, Cs, n_resamples: int) -> list[float]:
    """The values of C ``feature_stability`` fits at (its docstring), checked for the solver."""
    reg = registry.regularisation(est.solver, est._task, params)
    if Cs is None:
        if n_resamples > 0:
            return [float(est.C_)]
        if hasattr(est, "Cs_"):
            return [float(v) for v in est.Cs_]
        return reg.grid(engine, heads, est._task, params, 10)[0]
    if isinstance(Cs, (int, np.integer)) and not isinstance(Cs, bool):
        if Cs < 1:
            raise InvalidInputError(f"Cs = {Cs} must be >= 1 (the number of values of the solver's grid) or a list")
        return reg.grid(engine, heads, est._task, params, int(Cs))[0]
    return _given_values(Cs, reg, est.solver, "None, an int or a list of numbers")


def _given_values(Cs, reg, solver: str, accepted: str) -> list[float]:
    """A list of values of C given by the user, each checked for the solver's regularisation ``reg``
    (its registry row), in the row's order (from the most regularised)."""
    try:
        values = [float(v) for v in np.asarray(Cs, dtype=np.float64).reshape(-1)]
    except (TypeError, ValueError):
        raise InvalidInputError(f"Cs must be {accepted}; got {Cs!r}") from None
    if not values:
        raise InvalidInputError(f"Cs is empty; give at least one value (Cs is {accepted})")
    for v in values:
        problem = reg.check(v, solver)
        if problem:
            raise InvalidInputError(f"Cs: {problem}")
    return reg.order(values)


def load(path):
    """Load a model directory written by ``MKLClassifier.save`` / ``MKLRegressor.save``.

    Returns the fitted estimator (``model_`` set), so ``mklscale.load(path).predict(X)`` works.
    The arrays are read with ``allow_pickle=False``. Raises ModelFileError when the directory is not
    a model, was written by a newer mklscale (upgrade mklscale), or its arrays file is truncated or
    corrupted (re-save the model or refit).
    """
    model, doc = MKLModel.read(path)
    return estimator_from_model(model, doc)
