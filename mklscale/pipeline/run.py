"""Running a pipeline: the run directory, the cluster, then the stages in order (data, bank, fits,
results.json, report).

The run directory holds ``pipeline.toml`` (a copy of the spec), ``bank.zarr`` (unless the bank
path is absolute), ``models/<name>/`` (one model file per solver, see ``mklscale.model``),
``results.json`` (schema: :mod:`mklscale.results`; written atomically when the run ends), ``report/`` and
``checkpoints/``: each solver's state while it runs (see ``mklscale.runtime.checkpoint``) and, for
each finished solver, its results entry (``<name>.done.json``). On SIGTERM/SIGINT (preemption,
walltime, Ctrl-C) in any stage the run stops with ``Stopped`` (exit code 75), whose one line says
what was saved (bank kernels, finished solvers, the running solver's checkpoint) and the command
that resumes; a checkpointed solver saves its state first, Citi and the baselines start over.
``run_pipeline(..., resume=True)`` (``mklscale run ... --resume``) reuses the bank (builds resume
kernel by kernel), the finished solvers' entries and models, and continues the interrupted solver
from its checkpoint, giving the same results as an uninterrupted run; on a finished run it changes
nothing. A run directory holding an earlier run is refused unless ``resume`` or ``overwrite``.

Before any work (the cluster, the bank) every [[solver]]'s values are checked as the estimators
check them, the split must leave 2 training rows per class, and the bank must fit on its disk.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import time
from pathlib import Path

from mklscale import __version__, null_model
from mklscale.bank.storage.location import redact_options, redact_toml
from mklscale.engine import Engine
from mklscale.engine.core import small_bank_bytes
from mklscale.errors import ClusterUnavailableError, InvalidInputError, Preempted, Stopped
from mklscale.pipeline.bank_stage import prepare_bank
from mklscale.pipeline.console import Stage, null_text, resume_command, stop_message, summary
from mklscale.pipeline.data import load_data
from mklscale.pipeline.fits import check_solvers, run_path, run_solver
from mklscale.pipeline.spec import Pipeline, load_pipeline, with_dataset
from mklscale.results import RESULTS_FILE, SCHEMA_VERSION, write_json_atomic
from mklscale.runtime.interrupt import stop_cleanly
from mklscale.solvers.result import json_safe


def run_pipeline(spec, out: str | os.PathLike | None = None, cluster=None, quiet: bool = False,
                 resume: bool = False, overwrite: bool = False, dataset: str | None = None) -> dict:
    """Run every stage of a pipeline and return the results dict (also written to ``out/results.json``).

    ``spec``: a path, a dict or a :class:`Pipeline`. ``out``: the run directory (default
    ``runs/<name>``). ``cluster``: a cluster config path/dict for ``mklscale.runtime.cluster``
    (None: the embedded LocalCluster). ``quiet``: no progress bars, per-iteration lines or kernel
    lists; the summary lines (each solver's result or failure, bank warnings, where the results and
    the report went) are printed still.
    ``resume``: continue an interrupted run in ``out`` (see the module docstring); a finished run
    is returned as it is (its report written if it is missing). ``overwrite``: replace an earlier
    run in ``out`` (its bank too, when the bank lives in the run directory). An earlier run in
    ``out`` without either is refused. SIGTERM/SIGINT raise ``Stopped``, whose message says what
    was saved and how to resume. ``dataset``: an offline dataset that replaces the pipeline's
    [dataset] for this run (:func:`with_dataset`; the default ``out`` is then
    ``runs/<name>-<dataset>``).
    """
    pipe = spec if isinstance(spec, Pipeline) else load_pipeline(spec)
    if dataset is not None:
        pipe = with_dataset(pipe, dataset)
    label = pipe.name if pipe.dataset_option is None else f"{pipe.name}-{pipe.dataset_option}"
    run_dir = Path(out) if out is not None else Path("runs") / label
    stage = Stage()
    with stop_cleanly():
        try:
            return _run(pipe, run_dir, cluster, quiet, resume, overwrite, stage)
        except (Stopped, Preempted) as exc:
            raise Stopped(exc.signum, stop_message(exc, pipe, run_dir, stage)) from None


def _run(pipe: Pipeline, run_dir: Path, cluster, quiet: bool, resume: bool, overwrite: bool, stage: Stage) -> dict:
    from mklscale.runtime.cluster import load_cluster_config, open_client

    cluster_config = load_cluster_config(cluster) if cluster is not None else None
    _check_run_dir(run_dir, resume, overwrite)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    if resume and (run_dir / RESULTS_FILE).is_file():
        return _finished_run(pipe, run_dir, stage)
    started, t0 = _now(), time.perf_counter()
    data = load_data(pipe, say)
    check_solvers(pipe, data.task)
    say(f"[{pipe.name}] {data.name}: {len(data.y_train)} training rows, {len(data.y_test)} test rows, "
        + (f"{data.X_train.shape[0]} Gram matrices" if data.X_train.ndim == 3 else f"{data.X_train.shape[1]} features")
        + f" ({data.task})")
    null = null_model.null_model(data.task, data.y_train, data.y_test)
    say(f"[{pipe.name}] null model: {null_text(null)}")
    stage.doing = "starting the cluster"
    with open_client(cluster_config, quiet=quiet) as client:
        # the run folder is created only once the data loaded and the cluster answered, so a bad
        # dataset or an unreachable cluster leaves nothing on disk
        _prepare_run_dir(run_dir, pipe, overwrite)
        try:
            bank, bank_info = prepare_bank(pipe, data, run_dir, client, quiet, say, overwrite, stage)
            entries = []
            # one engine on the bank for the whole run: the kernels a solver's CV reads stay in its block
            # cache for the refit and the next solvers
            with Engine(bank, client=client, progress=False, local_bytes=small_bank_bytes()) as engine:
                for entry in pipe.solvers:
                    stage.doing, stage.solver = f"running solver {entry['name']}", entry["name"]
                    entries.append(run_solver(entry, engine, data, run_dir, client, quiet, say,
                                              pipe.checkpoint_every_s, resume, seed=pipe.seed))
                    stage.finished.append(entry["name"])
                for entry in pipe.paths:
                    stage.doing, stage.solver = f"running path {entry['name']}", entry["name"]
                    entries.append(run_path(entry, engine, data, quiet, say))
            stage.solver = None
        except ClusterUnavailableError as exc:
            raise ClusterUnavailableError(
                f"{exc}. The run's state is kept in {run_dir} (the bank, finished solvers and checkpoints in "
                f"{run_dir / 'checkpoints'}); when the cluster is back, resume with: "
                f"{resume_command(pipe, run_dir)}") from exc
        cluster_info = _cluster_info(cluster_config, client)
    results = {
        "schema_version": SCHEMA_VERSION, "mklscale_version": __version__,
        "pipeline": {"name": pipe.name, "description": pipe.description,
                     "path": str(pipe.source) if pipe.source else None, "config": _redacted(pipe.raw)},
        "started": started, "finished": _now(), "seconds": time.perf_counter() - t0,
        "machine": _machine(), "cluster": cluster_info,
        "dataset": {"name": data.name, "task": data.task, "n_train": int(len(data.y_train)),
                    "n_test": int(len(data.y_test)),
                    "n_features": None if data.X_train.ndim == 3 else int(data.X_train.shape[1]),
                    "classes": data.classes, "null_model": null,
                    "feature_names": None if data.feature_names is None else list(data.feature_names)},
        "bank": bank_info, "solvers": entries,
    }
    stage.doing = "writing the results"
    write_json_atomic(run_dir / RESULTS_FILE, json_safe(results))
    stage.doing = "writing the report"
    if pipe.report:
        from mklscale.report import write_report

        summary(f"[{pipe.name}] report: {write_report(run_dir, quiet=True)}")
    summary(f"[{pipe.name}] results: {run_dir / RESULTS_FILE}")
    return results


def _finished_run(pipe: Pipeline, run_dir: Path, stage: Stage) -> dict:
    """``resume`` on a run that finished: its results as they are (timings included); only a missing
    report is written."""
    from mklscale.report import write_report

    try:
        results = json.loads((run_dir / RESULTS_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"{run_dir / RESULTS_FILE} is unreadable ({exc}); rerun the pipeline with "
                                "--overwrite") from None
    summary(f"[{pipe.name}] finished before: {run_dir / RESULTS_FILE} kept as it is")
    if pipe.report and not (run_dir / "report" / "index.html").is_file():
        stage.doing = "writing the report"
        summary(f"[{pipe.name}] report: {write_report(run_dir, quiet=True)}")
    return results


#: what an earlier run leaves in its run directory
_RUN_OUTPUTS = (RESULTS_FILE, "checkpoints", "models", "report")


def _check_run_dir(run_dir: Path, resume: bool = False, overwrite: bool = False) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise InvalidInputError(f"--out {run_dir} exists and is not a directory; choose another run directory")
    earlier = [name for name in _RUN_OUTPUTS if (run_dir / name).exists()]
    if earlier and not (resume or overwrite):
        raise InvalidInputError(f"--out {run_dir} holds an earlier run ({', '.join(earlier)}); pass --resume to "
                                "continue it, --overwrite to replace it (run_pipeline: resume=True / "
                                "overwrite=True), or choose another --out")


def _redacted(raw: dict) -> dict:
    """The parsed spec with the secrets of its bank's storage options replaced (results.json)."""
    bank = raw.get("bank")
    if not isinstance(bank, dict) or not isinstance(bank.get("storage_options"), dict):
        return raw
    return {**raw, "bank": {**bank, "storage_options": redact_options(bank["storage_options"])}}


def _prepare_run_dir(run_dir: Path, pipe: Pipeline, overwrite: bool = False) -> None:
    """Create the run directory and keep a copy of the spec that produced it; with ``overwrite``, the
    earlier run's outputs go first (an earlier bank is replaced by the build)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise InvalidInputError(f"--out {run_dir} exists and is not a directory; choose another run directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    if overwrite:
        (run_dir / RESULTS_FILE).unlink(missing_ok=True)
        for name in ("checkpoints", "models", "report"):
            shutil.rmtree(run_dir / name, ignore_errors=True)
    if pipe.source is not None:
        # the copy never holds credentials of a [bank.storage_options] table
        text = redact_toml(Path(pipe.source).read_text())
        if pipe.dataset_option is not None:
            text = (f"# run with --dataset {pipe.dataset_option}: [dataset] name = \"{pipe.dataset_option}\" replaced "
                    "the [dataset] below (results.json records it)\n") + text
        (run_dir / "pipeline.toml").write_text(text)


def _cluster_info(config, client) -> dict:
    info = client.scheduler_info()
    dashboard = client.dashboard_link if "dashboard" in info.get("services", {}) else None
    return {"kind": "local" if config is None else config.kind, "dashboard": dashboard,
            "workers": len(info.get("workers", {}))}


def _machine() -> dict:
    import platform

    return {"hostname": platform.node(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform()}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
