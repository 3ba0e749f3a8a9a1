"""The bad-input table (issue 9 item 5, issue 8's bad-input list).

Every row feeds one bad input to the Python API, the ``mklscale`` command or a config file and
asserts three things:

1. the specific exception class (for the CLI: exit code 2 and no traceback);
2. a message that says what was wrong AND what to do (each regex matches the action: "give",
   "use", "choose", "pass", "remove", "upgrade", "run ... first", ...), checked on the message and
   on its ``__cause__``;
3. that nothing on disk changed: every file under the shared workspace is read before and after
   the case and compared byte for byte (nothing created, changed or deleted), and the outputs the
   call was asked to write do not exist.

The workspace is built once per module: a small bank (40 rows of breast_cancer, 4 kernels), a
model saved from ``MKLClassifier(solver="uniform")``, damaged copies of it, valid and broken
pipeline and cluster TOML files, and a few .npy / text files.

Labels unseen at fit (issue 8): scoring a classifier on y with labels it never saw is allowed
and counts them as errors, as in scikit-learn (``test_score_with_labels_unseen_at_fit``); fitting
on a bank with y of another length is an error (row ``api-fit_bank_y_of_other_n``).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import socket
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import mklscale
from mklscale import cli
from mklscale.bank import KernelSpec, build_bank, families
from mklscale.datasets import load as load_dataset
from mklscale.engine import Engine
from mklscale.errors import (
    BankMismatchError,
    ClusterUnavailableError,
    ConfigError,
    InvalidInputError,
    ModelFileError,
    NotABankError,
    SpecError,
)
from mklscale.estimators import MKLClassifier, MKLRegressor
from mklscale.model import SCHEMA_VERSION as MODEL_SCHEMA_VERSION
from mklscale.pipeline import load_pipeline
from mklscale.runtime.cluster import load_cluster_config, open_client
from mklscale.solvers import spicy

SPECS = families.gaussian([1, 2, 5]) + families.linear()
#: seconds an address config may try to connect; the case must fail within it plus MARGIN
DEAD_TIMEOUT_S = 2
MARGIN_S = 15

VALID_PIPELINE = """\
name = "bad-inputs"
seed = 0

[dataset]
name = "breast_cancer"
test_fraction = 0.3
max_train = 40

[bank]
families = [{ family = "gaussian", widths = [1, 2], features = "all" }]

[[solver]]
name = "uni"
solver = "uniform"

[report]
enabled = false
"""

#: broken pipeline files: name -> (text replaced, replacement)
BAD_PIPELINES = {
    "unknown_key": ("seed = 0", "seed = 0\ncolour = \"red\""),
    "wrong_type": ("test_fraction = 0.3", "test_fraction = \"0.3\""),
    "unknown_family_param": ("families = [{ family = \"gaussian\", widths = [1, 2], features = \"all\" }]",
                             "family = \"gaussian\"\nwidth = [1, 2]"),
    "unknown_solver": ("solver = \"uniform\"", "solver = \"newton\""),
    "duplicate_names": ("solver = \"uniform\"\n", "solver = \"uniform\"\n\n[[solver]]\nname = \"uni\"\nsolver = \"spicy\"\n"),
    "unknown_solver_param": ("solver = \"uniform\"", "solver = \"uniform\"\nloss = \"hinge\""),
    "unknown_dataset": ("name = \"breast_cancer\"", "name = \"no_such_dataset\""),
    "syntax_error": ("[bank]", "[bank"),
    "seed_negative": ("seed = 0", "seed = -1"),
    "seed_huge": ("seed = 0", f"seed = {2**70}"),
    "n_taus_huge": ("[report]", "[[path]]\nname = \"p\"\nn_taus = 1000000000\n\n[report]"),
    "test_fraction_0999": ("test_fraction = 0.3", "test_fraction = 0.999"),
    "loss_typo": ("solver = \"uniform\"", "solver = \"spicy\"\nloss = \"logistc\""),
    "standardise": ("max_train = 40", "max_train = 40\noptions = { standardise = true }"),
}

#: broken cluster files: name -> text
BAD_CLUSTERS = {
    "unknown_key": 'kind = "local"\nn_worker = 2\n',
    "wrong_type": 'kind = "local"\nn_workers = "2"\n',
    "unknown_kind": 'kind = "kubernetes"\n',
    "no_qsub": 'kind = "pbs"\ncores = 1\nstartup_timeout_s = 5\n',
}


#: crafted model files (issue 18): name -> (model copied, arrays.npz members replaced, model.json entries
#: replaced); the checksum in model.json is updated, as someone editing a model would
CRAFTED_MODELS = {
    "model_narrow_X_rows": ("model", lambda a: {"X_rows": a["X_rows"][:, :2].copy()}, {}),
    "model_nan_weights": ("model", lambda a: {"weights": np.full_like(a["weights"], np.nan)}, {}),
    "model_float32_weights": ("model", lambda a: {"weights": a["weights"].astype(np.float32)}, {}),
    "model_nan_mean": ("model", lambda a: {"mean": np.where(np.arange(a["mean"].size) == 3, np.nan, a["mean"])}, {}),
    "model_zero_scale": ("model", lambda a: {"scale": np.where(np.arange(a["scale"].size) == 1, 0.0, a["scale"])},
                         {}),
    "model_row_out_of_range": ("model", lambda a: {"rows": a["rows"] + 1000}, {}),
    "model_unknown_task": ("model", None, {"task": "clustering"}),
    "model_unknown_normalize": ("model", None, {"normalize": "max"}),
    "factor_narrow_landmarks": ("model_factor",
                                lambda a: {"factor_landmark_rows": a["factor_landmark_rows"][:, :2].copy()}, {}),
    "factor_landmark_out_of_range": ("model_factor",
                                     lambda a: {"factor_landmark_index": a["factor_landmark_index"] + 10**6}, {}),
    "factor_nan_coef": ("model_factor", lambda a: {"factor_coef": a["factor_coef"] * np.nan}, {}),
    "factor_short_transforms": ("model_factor", lambda a: {"factor_transforms": a["factor_transforms"][:, :3].copy()},
                                {}),
}


def _craft(src: Path, dst: Path, arrays, doc: dict) -> None:
    """Copy model ``src`` to ``dst`` with arrays and model.json entries replaced and the checksum updated."""
    shutil.copytree(src, dst)
    with np.load(dst / "arrays.npz") as npz:
        a = {k: npz[k] for k in npz.files}
    a.update(arrays(a) if arrays else {})
    with open(dst / "arrays.npz", "wb") as f:
        np.savez(f, **a)
    meta = json.loads((dst / "model.json").read_text())
    meta.update(doc)
    data = (dst / "arrays.npz").read_bytes()
    meta["arrays"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (dst / "model.json").write_text(json.dumps(meta))


# ---- the workspace -----------------------------------------------------------------------------------
def _free_port() -> int:
    """A local port nothing listens on (bound, read and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """The shared workspace (see the module docstring); cases must leave it byte for byte as it is."""
    ws = tmp_path_factory.mktemp("bad-inputs")
    ds = load_dataset("breast_cancer")
    rows = np.concatenate([np.flatnonzero(ds.y > 0)[:20], np.flatnonzero(ds.y < 0)[:20]])
    X, y = ds.X[rows], ds.y[rows]
    np.save(ws / "X.npy", X)
    np.save(ws / "y.npy", y)
    np.save(ws / "X_wrong_width.npy", X[:5, :3])
    np.save(ws / "y_objects.npy", np.array(list(y), dtype=object), allow_pickle=True)
    X_nan = X.copy()
    X_nan[3, 2] = np.nan
    np.save(ws / "X_nan.npy", X_nan)
    (ws / "features.txt").write_text("1.0 2.0 3.0\n4.0 5.0 6.0\n")
    build_bank(X, SPECS, ws / "bank", progress=False)

    est = MKLClassifier(kernels=SPECS, solver="uniform", cache_dir=ws / "cache").fit(X, y)
    est.save(ws / "model")
    shutil.copytree(ws / "model", ws / "model_truncated")
    arrays = ws / "model_truncated" / "arrays.npz"
    arrays.write_bytes(arrays.read_bytes()[: arrays.stat().st_size // 2])
    shutil.copytree(ws / "model", ws / "model_json_truncated")
    doc = ws / "model_json_truncated" / "model.json"
    doc.write_text(doc.read_text()[:200])
    shutil.copytree(ws / "model", ws / "model_newer")
    doc = ws / "model_newer" / "model.json"
    meta = json.loads(doc.read_text())
    meta["schema_version"] = MODEL_SCHEMA_VERSION + 1  # newer than any layout this mklscale reads
    doc.write_text(json.dumps(meta))

    with warnings.catch_warnings():  # rank 8 approximates these kernels coarsely; the file is what matters here
        warnings.simplefilter("ignore", UserWarning)
        factor = MKLClassifier(kernels=SPECS, solver="uniform", rank=8, cache_dir=ws / "cache").fit(X, y)
    factor.save(ws / "model_factor")
    for name, (src, arrays, doc) in CRAFTED_MODELS.items():
        _craft(ws / src, ws / name, arrays, doc)

    for folder in ("not_a_model", "not_a_bank"):
        (ws / folder).mkdir()
        (ws / folder / "notes.txt").write_text("someone else's files\n")
    (ws / "empty_run").mkdir()

    (ws / "pipelines").mkdir()
    (ws / "pipelines" / "valid.toml").write_text(VALID_PIPELINE)
    for name, (old, new) in BAD_PIPELINES.items():
        assert old in VALID_PIPELINE, name
        (ws / "pipelines" / f"{name}.toml").write_text(VALID_PIPELINE.replace(old, new, 1))
    (ws / "clusters").mkdir()
    (ws / "clusters" / "local.toml").write_text('kind = "local"\nn_workers = 1\nprocesses = false\n')
    for name, text in BAD_CLUSTERS.items():
        (ws / "clusters" / f"{name}.toml").write_text(text)
    (ws / "clusters" / "dead.toml").write_text(
        f'kind = "address"\naddress = "tcp://127.0.0.1:{_free_port()}"\ntimeout_s = {DEAD_TIMEOUT_S}\n')
    # the valid files are valid: the broken ones fail for the one reason they were made for
    load_pipeline(ws / "pipelines" / "valid.toml")
    load_cluster_config(ws / "clusters" / "local.toml")
    return ws


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file's bytes (and every folder, as None) under ``root``, by relative path."""
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = None if path.is_dir() else path.read_bytes()
    return out


# ---- the table ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One bad input.

    run(ws) triggers it (Python API: raises; CLI: returns the argv for ``cli.main``); error is the
    exception class (None for CLI rows: exit code 2 instead); match is a regex the message (or,
    for the CLI, stderr) must contain, including what to do; absent are workspace paths the call
    was asked to write; max_seconds bounds the wall time (cluster timeouts).
    """

    id: str
    run: Callable[[Path], object]
    error: type[BaseException] | None
    match: str
    absent: tuple[str, ...] = ()
    max_seconds: float | None = None


def _X(ws: Path) -> np.ndarray:
    return np.load(ws / "X.npy")


def _y(ws: Path) -> np.ndarray:
    return np.load(ws / "y.npy")


def _with(X: np.ndarray, value: float) -> np.ndarray:
    X = X.copy()
    X[3, 2] = value
    return X


def _spicy(ws: Path, y=None, **kwargs):
    with Engine(ws / "bank") as engine:
        return spicy.fit(engine, _y(ws) if y is None else y, **{"C": 0.1, **kwargs})


def _model(ws: Path):
    return mklscale.load(ws / "model")


def _clf(ws: Path, **kwargs) -> MKLClassifier:
    return MKLClassifier(kernels=SPECS, cache_dir=ws / "cache", **kwargs)


def _nan_weights(est):
    est.model_.weights = np.full_like(est.model_.weights, np.nan)
    return est


def _open(ws: Path, name: str):
    with open_client(ws / "clusters" / f"{name}.toml", quiet=True):
        pass


def _cli(*args):
    """A CLI row: argv with {ws} filled in when run."""
    return lambda ws: [a.format(ws=ws) for a in args]


API = [
    # -- bank ------------------------------------------------------------------------------------------
    Case("build_bank_nan_X", lambda ws: build_bank(_with(_X(ws), np.nan), SPECS, ws / "out", progress=False),
         InvalidInputError, r"NaN/inf.*impute or drop", absent=("out",)),
    Case("build_bank_inf_X", lambda ws: build_bank(_with(_X(ws), np.inf), SPECS, ws / "out", progress=False),
         InvalidInputError, r"NaN/inf.*impute or drop", absent=("out",)),
    Case("build_bank_1d_X", lambda ws: build_bank(_X(ws)[:, 0], SPECS, ws / "out", progress=False),
         InvalidInputError, r"2-D.*\b(reshape|pass)\b", absent=("out",)),
    Case("build_bank_string_dtype", lambda ws: build_bank(_X(ws).astype(str), SPECS, ws / "out", progress=False),
         InvalidInputError, r"numeric.*\b(convert|encode)\b", absent=("out",)),
    Case("build_bank_row_ids_wrong_length",
         lambda ws: build_bank(_X(ws), SPECS, ws / "out", row_ids=[0, 1, 2], progress=False),
         InvalidInputError, r"row_ids.*\bpass\b", absent=("out",)),
    Case("kernelspec_negative_width", lambda ws: KernelSpec.gaussian(-1.0), SpecError,
         r"width.*\bgive\b"),
    Case("families_empty_widths", lambda ws: families.gaussian([]), SpecError, r"widths is empty; give"),
    Case("family_unknown_parameter", lambda ws: families.resolve({"family": "gaussian", "width": [1]}, 5),
         SpecError, r"does not take width.*\b(remove|use)\b"),
    Case("bank_of_other_data_at_existing_path",
         lambda ws: build_bank(_X(ws)[:30], SPECS, ws / "bank", progress=False),
         BankMismatchError, r"different data.*pass overwrite=True.*choose another path"),
    Case("build_bank_over_a_folder_that_is_not_a_bank",
         lambda ws: build_bank(_X(ws), SPECS, ws / "not_a_bank", progress=False),
         NotABankError, r"not an mklscale kernel bank; choose another path"),
    Case("engine_on_a_folder_that_is_not_a_bank", lambda ws: Engine(ws / "not_a_bank"), NotABankError,
         r"not an mklscale kernel bank.*\b(give|build|pass)\b"),
    Case("engine_on_a_missing_path", lambda ws: Engine(ws / "no_such_bank"), NotABankError,
         r"does not exist \(build one with build_bank", absent=("no_such_bank",)),
    # -- solvers on the engine -----------------------------------------------------------------------------
    Case("spicy_y_of_wrong_length", lambda ws: _spicy(ws, y=_y(ws)[:-1]), InvalidInputError,
         r"y has 39 entries.*n = 40.*pass the targets"),
    Case("spicy_one_class_only", lambda ws: _spicy(ws, y=np.ones(40)), InvalidInputError,
               r"both classes.*\bgive\b"),
    Case("spicy_C_not_positive", lambda ws: _spicy(ws, C=-1.0), InvalidInputError, r"C must.*\bpass\b"),
    Case("spicy_elastic_net_lam_outside_0_1",
               lambda ws: _spicy(ws, penalty="elastic_net", lam=1.5), InvalidInputError, r"lam.*\b(give|pass|use)\b"),
    Case("spicy_block_q_not_above_1", lambda ws: _spicy(ws, penalty="block_q", q=1.0), InvalidInputError,
         r"q > 1.*use penalty='l1'"),
    Case("spicy_nan_in_y", lambda ws: _spicy(ws, y=np.where(np.arange(40) == 5, np.nan, _y(ws))), InvalidInputError,
         r"NaN/inf.*drop or impute"),
    # -- estimators --------------------------------------------------------------------------------------
    Case("estimator_fit_nan_X", lambda ws: _clf(ws).fit(_with(_X(ws), np.nan), _y(ws)), InvalidInputError,
         r"NaN.*Impute or drop"),
    Case("estimator_fit_string_X", lambda ws: _clf(ws).fit(np.full((40, 5), "abc"), _y(ws)), InvalidInputError,
         r"could not convert.*Convert X to numbers"),
    Case("estimator_fit_y_of_wrong_length", lambda ws: _clf(ws).fit(_X(ws), _y(ws)[:-1]), InvalidInputError,
         r"inconsistent numbers of samples.*Pass one target per row"),
    Case("estimator_fit_one_class", lambda ws: _clf(ws).fit(_X(ws), np.ones(40)), InvalidInputError,
         r"only one class.*give labels of at least two classes"),
    Case("estimator_unknown_solver", lambda ws: _clf(ws, solver="newton").fit(_X(ws), _y(ws)), InvalidInputError,
         r"unknown solver 'newton'; choose one of"),
    Case("estimator_unknown_solver_parameter",
               lambda ws: _clf(ws, solver_params={"nonsense": 1}).fit(_X(ws), _y(ws)), InvalidInputError,
               r"does not take parameter\(s\) \['nonsense'\].*\b(remove|use)\b"),
    Case("estimator_solver_without_the_task",
         lambda ws: MKLRegressor(kernels=SPECS, solver="smo", cache_dir=ws / "cache").fit(_X(ws), _y(ws)),
         InvalidInputError, r"does not support regression.*Use one of"),
    Case("estimator_C_not_positive", lambda ws: _clf(ws, C=-1.0).fit(_X(ws), _y(ws)), InvalidInputError,
         r'C = -1.0 .*pass a finite number > 0, or C="auto"'),
    Case("estimator_C_zero", lambda ws: _clf(ws, solver="smo", C=0).fit(_X(ws), _y(ws)), InvalidInputError,
         r"C = 0 .*pass a finite number > 0"),
    Case("estimator_fit_lam_outside_0_1_builds_no_bank",
               lambda ws: _clf(ws, solver_params={"penalty": "elastic_net", "lam": 1.5}).fit(_X(ws)[:30], _y(ws)[:30]),
               InvalidInputError, r"lam.*\b(give|pass|use)\b"),
    Case("predict_with_wrong_width", lambda ws: _model(ws).predict(_X(ws)[:, :3]), InvalidInputError,
         r"X has 3 features, but MKLClassifier is expecting 30.*Pass X with the same columns"),
    Case("predict_nan_X", lambda ws: _model(ws).predict(_with(_X(ws), np.nan)), InvalidInputError,
         r"NaN.*Impute or drop"),
    Case("predict_proba_without_a_probability_model", lambda ws: _model(ws).predict_proba(_X(ws)), AttributeError,
         r"solver='spicy' with loss='logistic'.*Use decision_function"),
    Case("fit_bank_y_of_other_n", lambda ws: MKLClassifier(solver="uniform").fit_bank(ws / "bank", _y(ws)[:30]),
         InvalidInputError, r"y has 30 entries but the bank .* n = 40 .*pass the targets"),
    Case("decision_from_kernels_of_wrong_shape",
         lambda ws: _model(ws).decision_function_from_kernels(np.zeros((4, 5, 39))), InvalidInputError,
         r"K_cross must have shape.*Pass K_m\(X_new, X_train\)"),
    # -- model files -------------------------------------------------------------------------------------
    Case("load_truncated_arrays", lambda ws: mklscale.load(ws / "model_truncated"), ModelFileError,
         r"truncated or corrupted.*re-save the model or refit"),
    Case("load_truncated_model_json", lambda ws: mklscale.load(ws / "model_json_truncated"), ModelFileError,
         r"unreadable or truncated.*re-save the model or refit"),
    Case("load_newer_schema", lambda ws: mklscale.load(ws / "model_newer"), ModelFileError,
         rf"schema version {MODEL_SCHEMA_VERSION + 1}.*newer.*upgrade mklscale"),
    Case("load_a_folder_that_is_not_a_model", lambda ws: mklscale.load(ws / "not_a_model"), ModelFileError,
         r"model.json is missing; give the folder written by est.save"),
    Case("save_over_a_folder_that_is_not_a_model", lambda ws: _model(ws).save(ws / "not_a_model"), ModelFileError,
         r"not an mklscale model directory; choose another path"),
    # -- crafted model files (issue 18): every field checked before compiled code reads it ---------------------
    Case("load_model_with_X_rows_narrower_than_n_features", lambda ws: mklscale.load(ws / "model_narrow_X_rows"),
         ModelFileError, r"X_rows has shape \(\d+, 2\); expected \(\d+, 30\).*refit the model"),
    Case("load_model_with_nan_weights", lambda ws: mklscale.load(ws / "model_nan_weights"), ModelFileError,
         r"weights contains NaN or inf.*refit the model"),
    Case("load_model_with_float32_weights", lambda ws: mklscale.load(ws / "model_float32_weights"), ModelFileError,
         r"weights must be a float64 array; got float32.*refit the model"),
    Case("load_model_with_nan_mean", lambda ws: mklscale.load(ws / "model_nan_mean"), ModelFileError,
         r"mean contains NaN or inf.*refit the model"),
    Case("load_model_with_zero_scale", lambda ws: mklscale.load(ws / "model_zero_scale"), ModelFileError,
         r"scale has entries <= 0.*refit the model"),
    Case("load_model_with_rows_out_of_range", lambda ws: mklscale.load(ws / "model_row_out_of_range"), ModelFileError,
         r"rows must be increasing indices in \[0, 40\).*refit the model"),
    Case("load_model_with_unknown_task", lambda ws: mklscale.load(ws / "model_unknown_task"), ModelFileError,
         r"task 'clustering' is not one of.*refit the model"),
    Case("load_model_with_unknown_normalize", lambda ws: mklscale.load(ws / "model_unknown_normalize"),
         ModelFileError, r"normalize 'max' is not one of.*refit the model"),
    Case("load_factor_model_with_landmarks_narrower_than_n_features",
         lambda ws: mklscale.load(ws / "factor_narrow_landmarks"), ModelFileError,
         r"factor_landmark_rows has 2 columns but n_features is 30.*refit the model"),
    Case("load_factor_model_with_landmark_index_out_of_range",
         lambda ws: mklscale.load(ws / "factor_landmark_out_of_range"), ModelFileError,
         r"factor_landmark_index must lie in \[-1, \d+\).*refit the model"),
    Case("load_factor_model_with_nan_coef", lambda ws: mklscale.load(ws / "factor_nan_coef"), ModelFileError,
         r"factor_coef contains NaN or inf.*refit the model"),
    Case("load_factor_model_with_short_transforms", lambda ws: mklscale.load(ws / "factor_short_transforms"),
         ModelFileError, r"factor_transforms has shape .*expected.*refit the model"),
    Case("save_a_model_whose_weights_were_set_to_nan", lambda ws: _nan_weights(_model(ws)).save(ws / "out"),
         InvalidInputError, r"weights contains NaN or inf.*refit it", absent=("out",)),
]

CONFIGS = [
    Case("pipeline_unknown_key", lambda ws: load_pipeline(ws / "pipelines" / "unknown_key.toml"), ConfigError,
         r"unknown key\(s\) colour; remove or rename"),
    Case("pipeline_wrong_type", lambda ws: load_pipeline(ws / "pipelines" / "wrong_type.toml"), ConfigError,
         r"test_fraction must be float, got a string '0.3'; write a float without quotes"),
    Case("pipeline_unknown_family_parameter",
         lambda ws: load_pipeline(ws / "pipelines" / "unknown_family_param.toml"), ConfigError,
         r"unknown key\(s\) width for family 'gaussian'; remove or rename .*widths"),
    Case("pipeline_unknown_solver", lambda ws: load_pipeline(ws / "pipelines" / "unknown_solver.toml"), ConfigError,
         r"unknown solver 'newton'; choose one of"),
    Case("pipeline_duplicate_names", lambda ws: load_pipeline(ws / "pipelines" / "duplicate_names.toml"), ConfigError,
         r"repeated: uni; rename"),
    Case("pipeline_unknown_solver_parameter",
         lambda ws: load_pipeline(ws / "pipelines" / "unknown_solver_param.toml"), ConfigError,
         r"does not take loss; remove it or use one of"),
    Case("pipeline_toml_syntax_error", lambda ws: load_pipeline(ws / "pipelines" / "syntax_error.toml"), ConfigError,
         r"not valid TOML.*fix the syntax"),
    Case("pipeline_negative_seed", lambda ws: load_pipeline(ws / "pipelines" / "seed_negative.toml"), ConfigError,
         r"seed: must be between 0 and 2\*\*32 - 1.*give a seed in that range"),
    Case("pipeline_seed_above_2_32", lambda ws: load_pipeline(ws / "pipelines" / "seed_huge.toml"), ConfigError,
         r"seed: must be between 0 and 2\*\*32 - 1.*give a seed"),
    Case("pipeline_a_billion_taus", lambda ws: load_pipeline(ws / "pipelines" / "n_taus_huge.toml"), ConfigError,
         r"n_taus: must be between 1 and 10000.*give fewer values", max_seconds=5),
    Case("cluster_unknown_key", lambda ws: load_cluster_config(ws / "clusters" / "unknown_key.toml"), ConfigError,
         r"unknown key\(s\) 'n_worker'.*remove or rename.*n_workers"),
    Case("cluster_wrong_type", lambda ws: load_cluster_config(ws / "clusters" / "wrong_type.toml"), ConfigError,
         r"'n_workers'.*expected an integer.*set it to an integer without quotes"),
    Case("cluster_unknown_kind", lambda ws: load_cluster_config(ws / "clusters" / "unknown_kind.toml"), ConfigError,
         r"'kubernetes'; set kind to one of"),
    Case("cluster_missing_file", lambda ws: load_cluster_config(ws / "clusters" / "absent.toml"), ConfigError,
         r"does not exist; give the path"),
    Case("cluster_address_with_nothing_listening", lambda ws: _open(ws, "dead"), ClusterUnavailableError,
         r"no Dask scheduler answered.*Check that `dask scheduler` runs there.*raise timeout_s",
         max_seconds=DEAD_TIMEOUT_S + MARGIN_S),
    pytest.param(Case("cluster_pbs_without_qsub", lambda ws: _open(ws, "no_qsub"), ClusterUnavailableError,
                      r"`qsub` is not on PATH; run on a login node|pip install", max_seconds=30),
                 id="cluster_pbs_without_qsub",
                 marks=pytest.mark.skipif(shutil.which("qsub") is not None, reason="qsub exists here")),
]

CLI = [
    Case("build_a_billion_kernels", _cli("bank", "build", "--features", "{ws}/X.npy", "--family", "random_subsets",
                                         "--n-kernels", "1000000000", "--out", "{ws}/out", "--quiet"),
         None, r"1000000000 kernels over n = 40 rows .*takes 6.5\d* TB, more than the .* free on the disk holding "
         r".*Remedies: fewer kernels: at most \d+ of the 1000000000 fit.*give --out a path on a disk with",
         absent=("out",), max_seconds=20),
    Case("build_width_1e-300", _cli("bank", "build", "--features", "{ws}/X.npy", "--family", "gaussian", "--widths",
                                    "1e-300", "--out", "{ws}/out", "--quiet"),
         None, r"width 1e-300 is below 1e-06.*give a width of about 0.1 to 20", absent=("out",)),
    Case("build_width_1e-160", _cli("bank", "build", "--features", "{ws}/X.npy", "--family", "gaussian", "--widths",
                                    "1", "1e-160", "--out", "{ws}/out", "--quiet"),
         None, r"width 1e-160 is below 1e-06.*give a width", absent=("out",)),
    Case("build_degree_1000", _cli("bank", "build", "--features", "{ws}/X.npy", "--family", "polynomial", "--degrees",
                                   "2", "1000", "--out", "{ws}/out", "--quiet"),
         None, r"degree 1000 is above 20.*give a degree from 1 to 20", absent=("out",)),
    Case("build_widths_with_polynomial", _cli("bank", "build", "--features", "{ws}/X.npy", "--family", "polynomial",
                                              "--widths", "1", "2", "--out", "{ws}/out", "--quiet"),
         None, r"^mklscale: error: --family polynomial does not take --widths; it takes --degrees, --offset, "
               r"--kernel-features$", absent=("out",)),
    Case("fit_object_dtype_labels", _cli("fit", "--features", "{ws}/X.npy", "--labels", "{ws}/y_objects.npy", "--task",
                                         "classification", "--cache-dir", "{ws}/cache", "--out", "{ws}/out", "--quiet"),
         None, r"--labels .*holds Python objects \(dtype object\).*save plain numbers or strings", absent=("out",)),
    Case("run_test_fraction_0999", _cli("run", "{ws}/pipelines/test_fraction_0999.toml", "--out", "{ws}/out",
                                        "--quiet"),
         None, r"test_fraction = 0.999.*give a smaller test_fraction", absent=("out",), max_seconds=30),
    Case("run_loss_typo_before_any_work", _cli("run", "{ws}/pipelines/loss_typo.toml", "--out", "{ws}/out", "--quiet"),
         None, r"\[\[solver\]\] #1 \(uni\): spicy loss 'logistc' does not fit task 'classification'; use one of",
         absent=("out",), max_seconds=30),
    Case("fit_unknown_dataset", _cli("fit", "--dataset", "no_such_dataset", "--cache-dir", "{ws}/cache",
                                     "--out", "{ws}/out"),
         None, r"unknown dataset 'no_such_dataset'; choose one of", absent=("out",)),
    Case("build_missing_features_file", _cli("bank", "build", "--features", "{ws}/missing.npy", "--out", "{ws}/out",
                                             "--quiet"),
         None, r"missing.npy: no such file; give the path of an existing .npy", absent=("out",)),
    Case("build_features_not_npy", _cli("bank", "build", "--features", "{ws}/features.txt", "--out", "{ws}/out",
                                        "--quiet"),
         None, r"not a plain .npy array.*save the array with numpy.save", absent=("out",)),
    Case("build_nan_features", _cli("bank", "build", "--features", "{ws}/X_nan.npy", "--family", "linear",
                                    "--kernel-features", "all", "--out", "{ws}/out", "--quiet"),
         None, r"NaN/inf.*impute or drop", absent=("out",)),
    Case("build_rows_below_2", _cli("bank", "build", "--features", "{ws}/X.npy", "--rows", "1", "--out", "{ws}/out",
                                    "--quiet"),
         None, r"--rows must be >= 2.*give --rows 2 or more", absent=("out",)),
    Case("build_over_a_folder_that_is_not_a_bank",
         _cli("bank", "build", "--features", "{ws}/X.npy", "--family", "linear", "--kernel-features", "all",
              "--out", "{ws}/not_a_bank", "--quiet"),
         None, r"not an mklscale kernel bank; choose another path"),
    Case("unknown_family_choice", _cli("bank", "build", "--features", "{ws}/X.npy", "--family", "rbf",
                                       "--out", "{ws}/out"),
         None, r"invalid choice: 'rbf' \(choose from", absent=("out",)),
    Case("fit_bad_param_syntax", _cli("fit", "--dataset", "breast_cancer", "--param", "loss", "--cache-dir",
                                      "{ws}/cache", "--out", "{ws}/out", "--quiet"),
         None, r"--param 'loss': write KEY=VALUE", absent=("out",)),
    Case("fit_features_without_labels", _cli("fit", "--features", "{ws}/X.npy", "--cache-dir", "{ws}/cache",
                                             "--out", "{ws}/out", "--quiet"),
         None, r"pass --labels y.npy and --task", absent=("out",)),
    Case("predict_wrong_width_npy", _cli("predict", "{ws}/model", "--features", "{ws}/X_wrong_width.npy",
                                         "--out", "{ws}/pred.npy"),
         None, r"X has 3 features, but MKLClassifier is expecting 30.*Pass X with the same columns",
         absent=("pred.npy",)),
    Case("predict_proba_flag_without_a_probability_model",
         _cli("predict", "{ws}/model", "--features", "{ws}/X.npy", "--proba", "--out", "{ws}/pred.npy"),
         None, r"--proba: predict_proba is available only for solver='spicy'.*leave out --proba",
         absent=("pred.npy",)),
    Case("predict_with_a_folder_that_is_not_a_model",
         _cli("predict", "{ws}/not_a_model", "--features", "{ws}/X.npy", "--out", "{ws}/pred.npy"),
         None, r"model.json is missing; give the folder", absent=("pred.npy",)),
    Case("predict_with_X_rows_narrower_than_n_features",
         _cli("predict", "{ws}/model_narrow_X_rows", "--features", "{ws}/X.npy", "--out", "{ws}/pred.npy"),
         None, r"X_rows has shape \(\d+, 2\); expected \(\d+, 30\).*refit the model", absent=("pred.npy",)),
    Case("predict_with_factor_landmarks_narrower_than_n_features",
         _cli("predict", "{ws}/factor_narrow_landmarks", "--features", "{ws}/X.npy", "--out", "{ws}/pred.npy"),
         None, r"factor_landmark_rows has 2 columns.*refit the model", absent=("pred.npy",)),
    Case("predict_with_nan_weights", _cli("predict", "{ws}/model_nan_weights", "--features", "{ws}/X.npy"),
         None, r"weights contains NaN or inf.*refit the model"),
    Case("predict_out_into_a_missing_folder",
         _cli("predict", "{ws}/model", "--features", "{ws}/X.npy", "--out", "{ws}/no_such_dir/pred.npy"),
         None, r"cannot write the predictions to .*pred.npy: .*choose another path", absent=("no_such_dir",)),
    Case("run_pipeline_asking_for_standardised_features",
         _cli("run", "{ws}/pipelines/standardise.toml", "--out", "{ws}/out", "--quiet"),
         None, r"standardise = true is not allowed.*remove standardise", absent=("out",)),
    Case("verify_a_folder_that_is_not_a_bank", _cli("bank", "verify", "{ws}/not_a_bank", "--quiet"),
         None, r"not an mklscale kernel bank.*give the folder written by `mklscale bank build"),
    Case("info_a_missing_bank", _cli("bank", "info", "{ws}/no_such_bank"),
         None, r"does not exist \(build one with build_bank or `mklscale bank build`"),
    Case("report_without_results", _cli("report", "{ws}/empty_run"),
         None, r"results.json not found.*run the pipeline first"),
    Case("run_pipeline_with_unknown_key", _cli("run", "{ws}/pipelines/unknown_key.toml", "--out", "{ws}/out",
                                               "--quiet"),
         None, r"unknown key\(s\) colour; remove or rename", absent=("out",)),
    Case("run_pipeline_with_unknown_dataset", _cli("run", "{ws}/pipelines/unknown_dataset.toml", "--out",
                                                   "{ws}/out", "--quiet"),
         None, r"unknown dataset 'no_such_dataset'; choose one of", absent=("out",)),
    Case("run_with_a_bad_cluster_file", _cli("run", "{ws}/pipelines/valid.toml", "--cluster",
                                             "{ws}/clusters/wrong_type.toml", "--out", "{ws}/out", "--quiet"),
         None, r"'n_workers'.*set it to an integer", absent=("out",)),
    Case("run_with_a_cluster_address_with_nothing_listening",
         _cli("run", "{ws}/pipelines/valid.toml", "--cluster", "{ws}/clusters/dead.toml", "--out", "{ws}/out",
              "--quiet"),
         None, r"no Dask scheduler answered.*raise timeout_s", absent=("out",), max_seconds=DEAD_TIMEOUT_S + MARGIN_S),
]


def _params(cases: list, prefix: str) -> list:
    out = []
    for c in cases:
        if isinstance(c, Case):
            out.append(pytest.param(c, id=f"{prefix}-{c.id}"))
        else:  # already a pytest.param (skipif): prefix its id
            out.append(pytest.param(*c.values, id=f"{prefix}-{c.id}", marks=c.marks))
    return out


def _message(exc: BaseException) -> str:
    """The message and its cause (scikit-learn's available_if keeps the reason in __cause__)."""
    parts = [str(exc)]
    if exc.__cause__ is not None:
        parts.append(str(exc.__cause__))
    return " | ".join(parts)


@pytest.mark.parametrize("case", _params(API, "api") + _params(CONFIGS, "config") + _params(CLI, "cli"))
def test_bad_input(case: Case, ws: Path, capsys):
    before = snapshot(ws)
    t0 = time.monotonic()
    if case.error is None:
        argv = case.run(ws)
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse rejects the command line itself
            code = exc.code
        seconds = time.monotonic() - t0
        err = capsys.readouterr().err
        assert code == 2, f"exit code {code}, stderr: {err}"
        assert "Traceback" not in err
        message = err
    else:
        with pytest.raises(case.error) as info:
            case.run(ws)
        seconds = time.monotonic() - t0
        assert type(info.value) is case.error, f"{type(info.value).__name__}: {info.value}"
        message = _message(info.value)
    assert re.search(case.match, message, re.DOTALL), f"message does not say what to do:\n{message}"
    if case.max_seconds is not None:
        assert seconds < case.max_seconds, f"took {seconds:.1f} s"
    for rel in case.absent:
        assert not (ws / rel).exists(), f"{rel} was created"
    after = snapshot(ws)
    created, removed = sorted(set(after) - set(before)), sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    assert not (created or removed or changed), f"created {created}, removed {removed}, changed {changed}"


def test_the_table_is_large_and_says_what_to_do():
    """At least 30 rows, spread over the three surfaces; every regex names an action, not just the problem."""
    rows = [c if isinstance(c, Case) else c.values[0] for c in API + CONFIGS + CLI]
    assert len(rows) >= 30 and len(API) >= 10 and len(CONFIGS) >= 8 and len(CLI) >= 8
    assert len({r.id for r in rows}) == len(rows)
    actions = re.compile(r"give|use|Use|choose|pass|Pass|remove|rename|upgrade|run the|re-save|refit|set|write|"
                         r"impute|Impute|drop|convert|Convert|reshape|fix|save|leave out|build one|raise|Check|install")
    for r in rows:
        assert actions.search(r.match), f"{r.id}: the regex checks no action"


def test_score_with_labels_unseen_at_fit(ws: Path):
    """Labels never seen at fit are scored as errors, as scikit-learn does; nothing is raised."""
    model = mklscale.load(ws / "model")
    X, y = _X(ws), _y(ws)
    expected = model.score(X, y)
    y_unseen = y.copy()
    y_unseen[:4] = 7.0  # a class the model cannot predict
    assert set(model.predict(X)) <= set(model.classes_)
    right = model.predict(X)[:4] == y[:4]
    assert model.score(X, y_unseen) == pytest.approx(expected - right.sum() / len(y))
