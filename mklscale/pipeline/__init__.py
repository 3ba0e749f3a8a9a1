"""Declarative pipelines: dataset -> bank -> solvers (and regularisation paths) -> evaluation -> report.

A pipeline is a TOML file (``pipelines/*.toml``); ``mklscale run PIPELINE.toml`` or
:func:`run_pipeline` runs it. One module per job:

- :mod:`~mklscale.pipeline.spec`: the TOML's format (documented there), read and checked into a
  :class:`Pipeline` before any work (:func:`load_pipeline`, :func:`with_dataset`);
- :mod:`~mklscale.pipeline.run`: the run (:func:`run_pipeline`): its directory, the cluster, the stages in
  order, resume and clean stops;
- :mod:`~mklscale.pipeline.data`, :mod:`~mklscale.pipeline.bank_stage`, :mod:`~mklscale.pipeline.fits`: the
  stages (the split, the bank, the solvers and paths on one engine over the bank);
- :mod:`~mklscale.pipeline.console`: the lines a run prints;
- :mod:`mklscale.results`: the schema of the ``results.json`` a run writes and the report reads.
"""

from mklscale.pipeline.console import CONSTANT_PREDICTOR, NOT_CONVERGED
from mklscale.pipeline.data import MIN_TRAIN_PER_CLASS
from mklscale.pipeline.run import run_pipeline
from mklscale.pipeline.spec import MAX_TAUS, Pipeline, load_pipeline, with_dataset
from mklscale.results import SCHEMA_VERSION, write_json_atomic


__all__ = ["CONSTANT_PREDICTOR", "MAX_TAUS", "MIN_TRAIN_PER_CLASS", "NOT_CONVERGED", "SCHEMA_VERSION", "Pipeline",
           "load_pipeline", "run_pipeline", "with_dataset", "write_json_atomic"]
