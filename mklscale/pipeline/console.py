"""What a run tells its user: the summary lines ``quiet`` keeps, a solver's result line, and the one
line of a stop (what was saved, the command that resumes), from the :class:`Stage` the run reached.

A solver that did not converge is flagged on its console line (``!! NOT CONVERGED (gap ...)``,
followed by the warning's text) and in the report; the run goes on. The console line shows the
majority rate (or the mean predictor's R^2) beside the solver's test metric, the cross-validated
value, and ``!! CONSTANT PREDICTOR (every row ...)`` for a model that predicts one class / value.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mklscale import null_model
from mklscale.errors import Preempted, Stopped
from mklscale.pipeline.spec import Pipeline
from mklscale.results import RESULTS_FILE


#: the flag the console line of an unconverged solver carries (the report shows its own)
NOT_CONVERGED = "!! NOT CONVERGED"
#: the flag of a model that predicts one class (or one value) for every train and test row
CONSTANT_PREDICTOR = "!! CONSTANT PREDICTOR"


@dataclasses.dataclass
class Stage:
    """How far a run got, for the message of a stop: what it was doing, the bank, finished solvers."""

    doing: str = "loading the data"
    bank: Path | None = None
    finished: list = dataclasses.field(default_factory=list)
    solver: str | None = None


def summary(line: str) -> None:
    """Print a line ``quiet`` keeps: a solver's result or failure, a bank warning, where the results went."""
    print(line, flush=True)


def null_text(null: dict) -> str:
    if null["kind"] == "majority_class":
        return f"majority class {null['label']!r}: test accuracy {null['test_accuracy']:.4f}"
    return f"training mean {null['value']:.4g}: test r2 {null['test_r2']:.4f}, test rmse {null['test_rmse']:.4g}"


def say_solver(say, record: dict, M: int) -> None:
    """Print a solver's test metric beside the null model's, the cross-validated value, its cost and its
    flags (not converged, constant predictor) (a summary line, printed under ``quiet`` too), then
    through ``say`` its convergence advice and kept kernels (the 5 largest shares of the total weight,
    as the report shows them)."""
    from mklscale.plots import share_lines

    metric = null_model.test_metric(record["metrics"])
    gap = record["gap"]  # json_safe: a float, or "inf"/"nan"
    flag = "" if record["converged"] else f"  {NOT_CONVERGED} (gap {gap:.3g})" if isinstance(gap, float) \
        else f"  {NOT_CONVERGED} (gap {gap})"
    constant = record.get("constant_predictor") or {}
    if constant.get("constant"):
        flag += f"  {CONSTANT_PREDICTOR} (every row {constant['value']!r})"
    versus = record.get("null_model")
    beside = "" if not versus else f" ({'majority' if metric == 'test_accuracy' else 'mean'} {versus['null']:.4f})"
    chosen = "" if not record.get("cv") else f"  cv {record['cv']['key']} = {record['cv']['chosen']:.4g}"
    summary(f"[{record['name']}] {metric} {record['metrics'][metric]:.4f}{beside}{chosen}  kept {record['n_active']}/"
            f"{M} kernels  passes {record['passes']}  {record['seconds']:.1f} s  converged {record['converged']}{flag}")
    if record.get("convergence_warning"):
        say(f"    {record['convergence_warning']}")
    for line in share_lines(record["kernels"], top=5):
        say(f"    {line}")


def stop_message(exc: Stopped | Preempted, pipe: Pipeline, run_dir: Path, stage: Stage) -> str:
    """One line: the signal, what the run was doing, what is saved, and the command that resumes."""
    import signal as signals

    saved = []
    if stage.bank is not None:
        saved.append(_bank_progress(stage.bank))
    if stage.finished:
        saved.append(f"finished solver(s) {', '.join(stage.finished)}")
    if isinstance(exc, Preempted) and exc.checkpoint:
        saved.append(f"the state of {stage.solver} ({exc.checkpoint})")
    if (run_dir / RESULTS_FILE).is_file():
        saved.append(RESULTS_FILE)
    note = "" if stage.solver is None or isinstance(exc, Preempted) and exc.checkpoint else \
        f" ({stage.solver} keeps no checkpoint and starts over)"
    return (f"stopped by {signals.Signals(exc.signum).name} while {stage.doing}: saved "
            f"{'; '.join(saved) if saved else 'nothing yet'}{note}; resume with: {resume_command(pipe, run_dir)}")


def resume_command(pipe: Pipeline, run_dir: Path) -> str:
    """The command that continues this run (with the --dataset it was started with)."""
    source = pipe.source if pipe.source is not None else "PIPELINE.toml"
    option = "" if pipe.dataset_option is None else f" --dataset {pipe.dataset_option}"
    return f"mklscale run {source}{option} --out {run_dir} --resume"


def _bank_progress(path: Path) -> str:
    from mklscale.bank import KernelBank

    try:
        bank = KernelBank.open(path)
        done = int(bank.complete.sum())
    except Exception:  # noqa: BLE001 - a message about a stop must not fail on a bank it cannot read
        return f"the bank {path}"
    return f"{done} of {len(bank)} bank kernels ({path})"
