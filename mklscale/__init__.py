"""mklscale: multiple kernel learning over kernel banks far larger than memory.

Layers (dependencies point one way): ``bank`` <- ``engine`` <- ``solvers`` <- estimators / cli.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mklscale")           # the one version number is pyproject.toml's
except PackageNotFoundError:                    # a source tree used without installing it
    __version__ = "0+unknown"

# The estimators pull in scikit-learn, pandas and the solvers: import them only when asked for, so
# ``import mklscale`` stays cheap.
_LAZY = {"MKLClassifier": "mklscale.estimators", "MKLRegressor": "mklscale.estimators",
         "MKLClassifierCV": "mklscale.estimators", "MKLRegressorCV": "mklscale.estimators",
         "MKLModel": "mklscale.model", "load": "mklscale.estimators",
         "feature_stability": "mklscale.estimators"}

__all__ = ["MKLClassifier", "MKLClassifierCV", "MKLModel", "MKLRegressor", "MKLRegressorCV", "__version__", "feature_stability",
           "load"]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mklscale' has no attribute {name!r}")


def __dir__():
    """The module's names and the lazily imported ones, for dir(), tab completion and help()."""
    return sorted(set(globals()) | set(_LAZY))
