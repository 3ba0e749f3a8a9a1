"""Kernel families: functions that return lists of ``KernelSpec``.

- ``gaussian``, ``polynomial``, ``linear``: one spec per parameter value on one feature set.
- ``simplemkl``: the SimpleMKL / SpicyMKL UCI recipe (SpicyMKL §6.1): 24 Gaussian widths
  0.1 0.25 0.5 0.75 1 2 3 ... 20 and polynomial degrees 1-3, each on every single variable and on
  all variables together: M = 27 (d + 1).
- ``random_subsets``: the SpicyMKL IDA recipe (§6.2): Gaussian kernels on random feature subsets
  with random width s = 5 chi^2 + 0.1.

``resolve`` turns the short descriptions users write (a family name, a mapping from a TOML
``[bank]`` table or an estimator's ``kernels=`` argument, or a list of them) into specs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from mklscale.bank.spec import KernelSpec
from mklscale.errors import SpecError

#: The 24 Gaussian widths of the SimpleMKL / SpicyMKL UCI experiments.
SIMPLEMKL_WIDTHS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75) + tuple(float(w) for w in range(1, 21))
SIMPLEMKL_DEGREES: tuple[int, ...] = (1, 2, 3)


def gaussian(widths: Iterable[float], features=None) -> list[KernelSpec]:
    """One Gaussian spec exp(-||x-z||^2 / (2 s^2)) per width s, on ``features`` (None = all)."""
    return [KernelSpec.gaussian(w, features) for w in _nonempty(widths, "widths")]


def polynomial(degrees: Iterable[int], offset: float = 1.0, features=None) -> list[KernelSpec]:
    """One polynomial spec (<x,z> + offset)^p per degree p, on ``features`` (None = all)."""
    return [KernelSpec.polynomial(p, offset, features) for p in _nonempty(degrees, "degrees")]


def linear(features=None) -> list[KernelSpec]:
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
    d = _positive_int(n_features, "n_features")
    specs: list[KernelSpec] = []
    for feats in [None] + [(j,) for j in range(d)]:
        specs += gaussian(widths, feats) + polynomial(degrees, 1.0, feats)
    return specs


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
        raise SpecError(f"max_subset={top} exceeds n_features={d}")
    rng = np.random.default_rng(seed)
    specs = []
    for _ in range(m):
        size = int(rng.integers(1, top + 1))
        feats = tuple(sorted(int(f) for f in rng.choice(d, size=size, replace=False)))
        width = 5.0 * float(rng.chisquare(1)) + 0.1
        specs.append(KernelSpec.gaussian(width, None if size == d else feats))
    return specs


#: The parameters each family description accepts in ``resolve`` (besides ``family`` itself).
FAMILY_PARAMS: dict[str, tuple[str, ...]] = {
    "simplemkl": ("widths", "degrees"),
    "gaussian": ("widths", "features"),
    "polynomial": ("degrees", "offset", "features"),
    "linear": ("features",),
    "random_subsets": ("n_kernels", "seed", "max_subset"),
}
PRESETS = tuple(FAMILY_PARAMS)
RANDOM_SUBSET_KERNELS = 100


def resolve(kernels, n_features: int, seed: int | None = None) -> list[KernelSpec]:
    """Specs from a short description, for data with ``n_features`` columns.

    ``kernels`` is one of, or a list mixing (concatenated in order; duplicates are an error):

    - a preset name: "simplemkl" (27 (d + 1) kernels), "gaussian" (the 24 SimpleMKL widths) /
      "polynomial" (degrees 1-3) / "linear", each on all features and on every single feature,
      or "random_subsets" (100 kernels drawn with ``seed``, default 0);
    - a family mapping ``{"family": name, **parameters}`` with the parameters of
      :data:`FAMILY_PARAMS` (gaussian/polynomial/linear on all features unless ``features`` is
      given; random_subsets' seed defaults to ``seed``);
    - a ``KernelSpec`` or its ``to_dict()`` form (a mapping with ``params``).
    """
    d = _positive_int(n_features, "n_features")
    items = kernels if isinstance(kernels, (list, tuple)) else [kernels]
    if not items:
        raise SpecError("kernels is an empty list; give a preset name, a family mapping or KernelSpecs")
    specs: list[KernelSpec] = []
    for item in items:
        if isinstance(item, KernelSpec):
            specs.append(item)
        elif isinstance(item, dict) and "params" in item:
            specs.append(KernelSpec.from_dict(item))
        elif isinstance(item, str):
            specs += _preset(item, d, seed)
        elif isinstance(item, dict):
            specs += _family_specs(item, d, seed)
        else:
            raise SpecError(f"kernels must be a preset name ({', '.join(PRESETS)}), a mapping like "
                            f"{{'family': 'gaussian', 'widths': [1, 2]}}, a KernelSpec or a list of these; got {item!r}")
    if len(set(specs)) != len(specs):
        raise SpecError("the kernel list has duplicate specs; remove the repeated family or parameter values")
    return specs


def _preset(name: str, d: int, seed: int | None) -> list[KernelSpec]:
    every = [None] + [(j,) for j in range(d)]
    if name == "simplemkl":
        return simplemkl(d)
    if name == "gaussian":
        return [s for f in every for s in gaussian(SIMPLEMKL_WIDTHS, f)]
    if name == "polynomial":
        return [s for f in every for s in polynomial(SIMPLEMKL_DEGREES, 1.0, f)]
    if name == "linear":
        return [s for f in every for s in linear(f)]
    if name == "random_subsets":
        return random_subsets(d, RANDOM_SUBSET_KERNELS, seed=0 if seed is None else seed)
    raise SpecError(f"unknown kernel preset {name!r}; choose one of {', '.join(PRESETS)}, a family mapping "
                    "or a list of KernelSpec")


def _family_specs(entry: dict, d: int, seed: int | None) -> list[KernelSpec]:
    family = entry.get("family")
    if family not in FAMILY_PARAMS:
        raise SpecError(f"a kernel family mapping needs 'family' in {', '.join(PRESETS)}; got {entry!r}")
    params = {k: v for k, v in entry.items() if k != "family"}
    unknown = sorted(set(params) - set(FAMILY_PARAMS[family]))
    if unknown:
        raise SpecError(f"kernel family {family!r} does not take {', '.join(unknown)}; remove it or use one of "
                        f"its parameters: {', '.join(FAMILY_PARAMS[family]) or 'none'}")
    if family == "simplemkl":
        return simplemkl(d, **params)
    if family == "random_subsets":
        params.setdefault("n_kernels", RANDOM_SUBSET_KERNELS)
        params.setdefault("seed", 0 if seed is None else seed)
        return random_subsets(d, **params)
    if family == "gaussian":
        return gaussian(params.get("widths", SIMPLEMKL_WIDTHS), params.get("features"))
    if family == "polynomial":
        return polynomial(params.get("degrees", SIMPLEMKL_DEGREES), params.get("offset", 1.0), params.get("features"))
    return linear(params.get("features"))


def _nonempty(values: Iterable, what: str) -> list:
    values = list(values) if not np.isscalar(values) else [values]
    if not values:
        raise SpecError(f"{what} is empty; give at least one value")
    return values


def _positive_int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise SpecError(f"{what} must be a positive integer, got {v!r}")
    return int(v)
