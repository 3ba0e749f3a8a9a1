"""Kernel families: named recipes that turn the number of features d into a list of ``KernelSpec``.

One meaning per name. A family name means the same bank everywhere: the estimators'
``kernels="gaussian"``, a pipeline's ``[bank] family = "gaussian"`` and ``mklscale ... --family
gaussian`` are all ``{"family": "gaussian"}`` with the defaults below, and all three go through
:func:`resolve` (Python and TOML give the mapping, the CLI builds it from the options the user gave).
Every parameter is optional; a parameter the family does not take is an error naming the family,
the parameter and the ones it takes (never ignored). The defaults are spelled only here
(:data:`FAMILY_DEFAULTS`).

=================  ==============================================  ==================================
family             parameters (defaults)                           kernels, M
=================  ==============================================  ==================================
``auto``           none                                            Gaussian on all features at widths
                                                                   sqrt(d) (0.25, 0.5, 1, 2, 4), the
                                                                   linear kernel on all features, a
                                                                   Gaussian of width 1 on every single
                                                                   feature: M = 6 + d
``gaussian``       widths (the 24 SimpleMKL widths), features      one per width and feature set:
                   ("all+each")                                    24 (d + 1)
``polynomial``     degrees ((1, 2, 3)), offset (1.0), features     (<x,z> + offset)^p, one per degree
                   ("all+each")                                    and feature set: 3 (d + 1)
``linear``         features ("all+each")                           one per feature set: d + 1
``simplemkl``      widths (the 24 SimpleMKL widths), degrees       gaussian + polynomial (offset 1) on
                   ((1, 2, 3)); its feature sets are fixed         "all+each": 27 (d + 1)
                   ("all+each")
``random_subsets`` n_kernels (100), seed (0, or the estimator's    Gaussians on random feature subsets
                   random_state), max_subset (d)                   of random width: n_kernels
``per_feature``    widths ((0.5, 1, 2)), linear (true)             per feature: a Gaussian per width,
                                                                   then the linear kernel, on that one
                                                                   feature: d (len(widths) + 1)
``interactions``   pairs ("all", or [[i, j], ...]), widths         a Gaussian per width on each pair of
                   ((0.5, 1, 2))                                   features: len(pairs) widths; "all":
                                                                   d (d - 1) / 2 pairs
=================  ==============================================  ==================================

- ``simplemkl`` is the SimpleMKL / SpicyMKL UCI recipe (SpicyMKL §6.1): Gaussian widths 0.1 0.25
  0.5 0.75 1 2 3 ... 20 and polynomial degrees 1-3, each on every single variable and on all
  variables together.
- ``random_subsets`` is the SpicyMKL IDA recipe (§6.2): width s = 5 chi^2 + 0.1.
- ``per_feature`` is nonlinear feature selection (HSIC Lasso's one kernel per feature, with a width
  ladder): a kernel's weight is its feature's relevance. With d in the 10^4-10^6 of genomics data
  it is meant for a computed bank (``build_bank(..., computed=True)``: kernels never stored).
  ``interactions`` adds kernels on chosen feature pairs (a product or an XOR of two features).
- ``auto`` is a compact bank that solvers fit fast: on standardised features the typical distance
  between two rows is about sqrt(2 d), so the five widths sqrt(d) (0.25 ... 4) span it; the specs
  hold the absolute widths (computed from d when resolved), so a bank or model records them.

``features`` (gaussian, polynomial, linear) is "all" (one set: all features together), "each" (one
set per single feature), "all+each" (all, then every single feature: the SimpleMKL order), or a
list of column indices (one subset). Specs come feature set by feature set, the parameter values in
the order given within each set.

The command line spells the parameters ``--widths``, ``--degrees``, ``--offset``,
``--kernel-features`` (all, each, all+each or comma-separated indices), ``--n-kernels``, ``--seed``
and ``--max-subset``; a pipeline writes them beside ``family`` in ``[bank]`` (or in each table of
``families = [...]``).

The functions :func:`gaussian`, :func:`polynomial` and :func:`linear` are the building blocks: one
spec per parameter value on ONE feature set (``features=None``: all features).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from mklscale.bank.spec import KernelSpec
from mklscale.errors import SpecError

#: The 24 Gaussian widths of the SimpleMKL / SpicyMKL UCI experiments.
SIMPLEMKL_WIDTHS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75) + tuple(float(w) for w in range(1, 21))
SIMPLEMKL_DEGREES: tuple[int, ...] = (1, 2, 3)
#: ``auto``: Gaussian widths on all features, as multiples of sqrt(d), and the width on single features.
AUTO_WIDTH_RATIOS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
AUTO_FEATURE_WIDTH = 1.0
#: ``per_feature`` and ``interactions``: widths on one (or two) standardised features, whose typical
#: distance between two rows is about sqrt(2) (or 2).
FEATURE_WIDTHS: tuple[float, ...] = (0.5, 1.0, 2.0)
#: The values ``features`` takes besides a list of column indices.
FEATURE_SETS = ("all", "each", "all+each")

#: Each family's parameters and their defaults (random_subsets: seed None = resolve's seed, else 0;
#: max_subset None = d). ``resolve`` fills what a description leaves out from here.
FAMILY_DEFAULTS: dict[str, dict] = {
    "auto": {},
    "simplemkl": {"widths": SIMPLEMKL_WIDTHS, "degrees": SIMPLEMKL_DEGREES},
    "gaussian": {"widths": SIMPLEMKL_WIDTHS, "features": "all+each"},
    "polynomial": {"degrees": SIMPLEMKL_DEGREES, "offset": 1.0, "features": "all+each"},
    "linear": {"features": "all+each"},
    "random_subsets": {"n_kernels": 100, "seed": None, "max_subset": None},
    "per_feature": {"widths": FEATURE_WIDTHS, "linear": True},
    "interactions": {"pairs": "all", "widths": FEATURE_WIDTHS},
}
#: The parameters each family takes (besides ``family`` itself).
FAMILY_PARAMS: dict[str, tuple[str, ...]] = {f: tuple(p) for f, p in FAMILY_DEFAULTS.items()}
FAMILIES = tuple(FAMILY_DEFAULTS)


def gaussian(widths: Iterable[float], features=None) -> list[KernelSpec]:
    """One Gaussian spec exp(-||x-z||^2 / (2 s^2)) per width s, on ``features`` (None = all)."""
    return [KernelSpec.gaussian(w, features) for w in _nonempty(widths, "widths")]


def polynomial(degrees: Iterable[int], offset: float = 1.0, features=None) -> list[KernelSpec]:
    """One polynomial spec (<x,z> + offset)^p per degree p, on ``features`` (None = all)."""
    return [KernelSpec.polynomial(p, offset, features) for p in _nonempty(degrees, "degrees")]


def linear(features=None) -> list[KernelSpec]:
    """The linear spec <x,z> on ``features`` (None = all)."""
    return [KernelSpec.linear(features)]


def simplemkl(
    n_features: int,
    widths: Sequence[float] = SIMPLEMKL_WIDTHS,
    degrees: Sequence[int] = SIMPLEMKL_DEGREES,
) -> list[KernelSpec]:
    """Every single feature and all features together: (len(widths) + len(degrees)) (d + 1) specs.

    Ordered feature set by feature set (all features first, then feature 0, 1, ...), Gaussian
    widths then polynomial degrees within each set.
    """
    return [s for f in feature_sets("all+each", n_features) for s in gaussian(widths, f) + polynomial(degrees, 1.0, f)]


def auto(n_features: int) -> list[KernelSpec]:
    """The ``auto`` family: Gaussians at widths sqrt(d) * (0.25, 0.5, 1, 2, 4) and the linear kernel on
    all features, then a Gaussian of width 1 on each single feature (M = 6 + d)."""
    d = _positive_int(n_features, "n_features")
    on_all = gaussian([math.sqrt(d) * r for r in AUTO_WIDTH_RATIOS]) + linear()
    return on_all + [KernelSpec.gaussian(AUTO_FEATURE_WIDTH, (j,)) for j in range(d)]


def per_feature(n_features: int, widths: Iterable[float] = FEATURE_WIDTHS, linear: bool = True) -> list[KernelSpec]:
    """The ``per_feature`` family: for each feature j in order, a Gaussian of each width on feature j
    alone, then (``linear``) the linear kernel on it: M = d (len(widths) + 1). Kernels of one feature
    are adjacent, so the build and every pass share their pairwise base."""
    d = _positive_int(n_features, "n_features")
    widths = _nonempty(widths, "widths")
    if not isinstance(linear, (bool, np.bool_)):
        raise SpecError(f"linear must be true or false, got {linear!r}")
    out = []
    for j in range(d):
        out += gaussian(widths, (j,)) + ([KernelSpec.linear((j,))] if linear else [])
    return out


def interactions(pairs, widths: Iterable[float] = FEATURE_WIDTHS, n_features: int | None = None) -> list[KernelSpec]:
    """The ``interactions`` family: a Gaussian of each width on each given pair of features [i, j];
    ``pairs="all"``: every pair i < j of the ``n_features`` features."""
    if isinstance(pairs, str) and pairs == "all" and n_features is not None:
        pairs = [(i, j) for i in range(n_features) for j in range(i + 1, n_features)]
    if pairs is None or isinstance(pairs, (str, bytes)) or not len(pairs):
        raise SpecError("the interactions family needs pairs: \"all\" (every pair of at least two features) or a "
                        "list of feature pairs like [[0, 1], [2, 5]]")
    out = []
    for pair in pairs:
        if isinstance(pair, (str, bytes)) or np.ndim(pair) != 1 or len(pair) != 2 or pair[0] == pair[1]:
            raise SpecError(f"each of pairs must be two different feature indices [i, j]; got {pair!r}")
        out += gaussian(widths, tuple(sorted(int(f) for f in pair)))
    return out


def random_subsets(
    n_features: int,
    n_kernels: int,
    seed: int = 0,
    max_subset: int | None = None,
) -> list[KernelSpec]:
    """Gaussian kernels on random feature subsets with width s = 5 chi^2_1 + 0.1 (SpicyMKL §6.2).

    The paper leaves the subset size open; here each kernel draws a size uniformly from
    1..max_subset (default d) and then that many distinct features uniformly, all from
    ``np.random.default_rng(seed)``. The chi^2 has one degree of freedom.
    """
    d = _positive_int(n_features, "n_features")
    m = _positive_int(n_kernels, "n_kernels")
    top = d if max_subset is None else _positive_int(max_subset, "max_subset")
    if top > d:
        raise SpecError(f"max_subset={top} exceeds n_features={d}; give max_subset <= {d}")
    _check_spec_memory(m, top)
    rng = np.random.default_rng(seed)
    specs = []
    for _ in range(m):
        size = int(rng.integers(1, top + 1))
        feats = tuple(sorted(int(f) for f in rng.choice(d, size=size, replace=False)))
        width = 5.0 * float(rng.chisquare(1)) + 0.1
        specs.append(KernelSpec.gaussian(width, None if size == d else feats))
    return specs


def _check_spec_memory(n_kernels: int, max_subset: int) -> None:
    """Refuse, before generating any, more kernel descriptions than half the available memory holds
    (about 300 bytes + 16 per feature each, measured; their JSON in the bank about as much again)."""
    import psutil

    need = n_kernels * (300 + 16 * max_subset)
    available = psutil.virtual_memory().available
    if need > available / 2:
        raise SpecError(f"random_subsets with n_kernels={n_kernels:,} needs about {need / 1e9:,.1f} GB of memory for "
                        f"the kernel descriptions alone, over half of the {available / 1e9:.1f} GB available here; "
                        "ask for fewer kernels (n_kernels / --n-kernels)")


def feature_sets(features, n_features: int) -> list[tuple[int, ...] | None]:
    """The feature sets a ``features`` value names: "all" -> [None], "each" -> [(0,), ..., (d-1,)],
    "all+each" -> both in that order, a list of column indices -> that one subset."""
    d = _positive_int(n_features, "n_features")
    if isinstance(features, str):
        if features not in FEATURE_SETS:
            raise SpecError(f"features={features!r} is not one of {', '.join(map(repr, FEATURE_SETS))}; give one of "
                            "those or a list of column indices")
        return ([None] if features != "each" else []) + ([(j,) for j in range(d)] if features != "all" else [])
    if features is None or isinstance(features, (bool, float, dict)):
        raise SpecError(f"features={features!r}: give \"all\", \"each\", \"all+each\" or a list of column indices")
    return [KernelSpec.linear(features).features]  # one subset, checked (non-empty, >= 0, no repeats)


def parameters(description, seed: int | None = None) -> tuple[str, dict]:
    """(family, every parameter) of a family name or mapping ``{"family": name, **parameters}``: the
    parameters given over :data:`FAMILY_DEFAULTS`, checked (names and values; what depends on d,
    e.g. max_subset <= d, is checked by :func:`resolve`). random_subsets' seed defaults to ``seed``,
    else 0. A parameter the family does not take is a SpecError naming the ones it takes."""
    if isinstance(description, str):
        entry = {"family": description}
    elif isinstance(description, dict):
        entry = description
    else:
        raise SpecError(f"a kernel family is a name or a mapping like {{'family': 'gaussian', 'widths': [1, 2]}}; "
                        f"got {description!r}")
    family = entry.get("family")
    if family not in FAMILY_DEFAULTS:
        what = "kernel family" if isinstance(description, str) else "'family' in the kernel family mapping"
        raise SpecError(f"unknown {what} {family!r}; choose one of {', '.join(FAMILIES)} (or give a list of "
                        "KernelSpec)")
    given = {k: v for k, v in entry.items() if k != "family"}
    unknown = sorted(set(given) - set(FAMILY_PARAMS[family]))
    if unknown:
        takes = (f"use one of its parameters: {', '.join(FAMILY_PARAMS[family])}" if FAMILY_PARAMS[family] else
                 "it takes no parameters")
        raise SpecError(f"kernel family {family!r} does not take {', '.join(unknown)}; remove it or {takes}")
    params = {**FAMILY_DEFAULTS[family], **given}
    if family == "random_subsets":
        if params["seed"] is None:
            params["seed"] = 0 if seed is None else seed
        _positive_int(params["n_kernels"], "n_kernels")
        if params["max_subset"] is not None:
            _positive_int(params["max_subset"], "max_subset")
        if isinstance(params["seed"], bool) or not isinstance(params["seed"], (int, np.integer)) or params["seed"] < 0:
            raise SpecError(f"seed must be an integer >= 0, got {params['seed']!r}")
    else:  # the values on one feature (the feature sets depend on d; indices >= d fail when built)
        _specs(family, {**params, "features": "all"}, 2 if family == "interactions" else 1)  # a pair needs two
        if "features" in params:
            feature_sets(params["features"], 1)
    return family, params


def _specs(family: str, params: dict, d: int) -> list[KernelSpec]:
    """The specs of a family with its full parameters (from :func:`parameters`) for d features."""
    if family == "auto":
        return auto(d)
    if family == "simplemkl":
        return simplemkl(d, params["widths"], params["degrees"])
    if family == "random_subsets":
        return random_subsets(d, params["n_kernels"], params["seed"], params["max_subset"])
    if family == "per_feature":
        return per_feature(d, params["widths"], params["linear"])
    if family == "interactions":
        return interactions(params["pairs"], params["widths"], d)
    sets = feature_sets(params["features"], d)
    if family == "gaussian":
        return [s for f in sets for s in gaussian(params["widths"], f)]
    if family == "polynomial":
        return [s for f in sets for s in polynomial(params["degrees"], params["offset"], f)]
    return [s for f in sets for s in linear(f)]


def resolve(kernels, n_features: int, seed: int | None = None) -> list[KernelSpec]:
    """Specs from a short description, for data with ``n_features`` columns: the one function the
    estimators (``kernels=``), pipelines (``[bank]``) and the CLI (``--family``) turn kernels with.

    ``kernels`` is one of, or a list mixing (concatenated in order; duplicates are an error):

    - a family name (see the module docstring): the family with its defaults, exactly as
      ``{"family": name}``;
    - a family mapping ``{"family": name, **parameters}`` with the parameters of
      :data:`FAMILY_PARAMS` (random_subsets' seed defaults to ``seed``, else 0);
    - a ``KernelSpec`` or its ``to_dict()`` form (a mapping with ``params``).
    """
    d = _positive_int(n_features, "n_features")
    items = kernels if isinstance(kernels, (list, tuple)) else [kernels]
    if not items:
        raise SpecError("kernels is an empty list; give a family name, a family mapping or KernelSpecs")
    specs: list[KernelSpec] = []
    for item in items:
        if isinstance(item, KernelSpec):
            specs.append(item)
        elif isinstance(item, dict) and "params" in item:
            specs.append(KernelSpec.from_dict(item))
        elif isinstance(item, (str, dict)):
            specs += _specs(*parameters(item, seed), d)
        else:
            raise SpecError(f"kernels must be a family name ({', '.join(FAMILIES)}), a mapping like "
                            f"{{'family': 'gaussian', 'widths': [1, 2]}}, a KernelSpec or a list of these; got {item!r}")
    if len(set(specs)) != len(specs):
        raise SpecError("the kernel list has duplicate specs; remove the repeated family or parameter values")
    return specs


def _nonempty(values: Iterable, what: str) -> list:
    values = list(values) if not np.isscalar(values) else [values]
    if not values:
        raise SpecError(f"{what} is empty; give at least one value")
    return values


def _positive_int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise SpecError(f"{what} must be a positive integer, got {v!r}")
    return int(v)
