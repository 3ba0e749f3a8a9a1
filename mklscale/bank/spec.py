"""Kernel specs: small immutable descriptions that compute K(X, Z) for any X (n x d), Z (m x d).

A spec is (family, parameters, feature subset). Families and their formulas:

- ``gaussian(width=s)``:     k(x, z) = exp(-||x - z||^2 / (2 s^2))      (s > 0 is the standard deviation)
- ``polynomial(degree=p, offset=c)``: k(x, z) = (<x, z> + c)^p        (p >= 1 integer, c >= 0, default c = 1)
- ``linear()``:              k(x, z) = <x, z>
- ``precomputed(name=...)``: a Gram matrix imported with ``KernelBank.from_arrays``; it has no
  formula, so it cannot compute cross kernels on new data.

``features`` is ``None`` for all features or a sorted tuple of column indices; x and z above are the
rows restricted to those columns. Specs are plain data: they serialise to and from JSON and never
execute anything from a store.

Every family is a function of one pairwise *base* on the selected columns, either squared distances
or inner products; ``base_key`` names it so a build computes it once for all specs that share it
(e.g. the 24 Gaussian widths on one feature).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mklscale.bank import _compute
from mklscale.errors import SpecError

#: family -> (required parameters, optional parameters with defaults)
FAMILIES: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "gaussian": (("width",), {}),
    "polynomial": (("degree",), {"offset": 1.0}),
    "linear": ((), {}),
    "precomputed": (("name",), {}),
}


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """One kernel function. Build with the class methods or ``from_dict``; compare and hash freely.
    Slotted (a bank of 10^6 per-feature kernels holds 10^6 of them); specs read from a bank share their
    family's parameter tuple (``specs_from_entries``)."""

    family: str
    params: tuple[tuple[str, Any], ...] = ()
    features: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise SpecError(
                f"unknown kernel family {self.family!r}; choose one of {sorted(FAMILIES)}"
            )
        required, optional = FAMILIES[self.family]
        given = dict(self.params)
        unknown = set(given) - set(required) - set(optional)
        if unknown:
            raise SpecError(
                f"{self.family} kernel got unknown parameter(s) {sorted(unknown)}; "
                f"it takes {list(required) + list(optional)}"
            )
        missing = [p for p in required if p not in given]
        if missing:
            raise SpecError(f"{self.family} kernel needs parameter(s) {missing}")
        full = {**optional, **given}
        _validate_params(self.family, full)
        object.__setattr__(self, "params", tuple(sorted(full.items())))
        if self.features is not None:
            feats = tuple(int(f) for f in self.features)
            if not feats:
                raise SpecError("feature subset is empty; use features=None for all features")
            if min(feats) < 0:
                raise SpecError(f"feature indices must be >= 0, got {min(feats)}")
            if len(set(feats)) != len(feats):
                raise SpecError(f"feature subset {feats} repeats an index")
            object.__setattr__(self, "features", tuple(sorted(feats)))

    # ---- constructors -------------------------------------------------------------------------
    @classmethod
    def gaussian(cls, width: float, features=None) -> KernelSpec:
        return cls("gaussian", (("width", width),), _as_features(features))

    @classmethod
    def polynomial(cls, degree: int, offset: float = 1.0, features=None) -> KernelSpec:
        return cls("polynomial", (("degree", degree), ("offset", offset)), _as_features(features))

    @classmethod
    def linear(cls, features=None) -> KernelSpec:
        return cls("linear", (), _as_features(features))

    @classmethod
    def precomputed(cls, name: str) -> KernelSpec:
        return cls("precomputed", (("name", str(name)),), None)

    # ---- description --------------------------------------------------------------------------
    def param(self, name: str) -> Any:
        return dict(self.params)[name]

    @property
    def name(self) -> str:
        """A readable, unique label, e.g. ``gaussian(width=0.5)[3]`` or ``polynomial(degree=2,offset=1)[all]``."""
        return self.label()

    def label(self, feature_names=None) -> str:
        """:attr:`name` with the feature indices replaced by ``feature_names`` (one per column of the
        data, e.g. a DataFrame's columns), e.g. ``gaussian(width=0.5)[mean radius]``; without names,
        or when an index has no name, the index is kept."""
        if self.family == "precomputed":
            return str(self.param("name"))
        args = ",".join(f"{k}={_fmt(v)}" for k, v in self.params)
        return f"{self.family}({args})[{features_text(self.features, feature_names)}]"

    @property
    def base_key(self) -> tuple:
        """Which pairwise base this kernel is a function of: (kind, features)."""
        kind = "sqdist" if self.family == "gaussian" else "dot"
        return (kind, self.features)

    # ---- computation --------------------------------------------------------------------------
    def check_features(self, n_features: int) -> None:
        if self.features is not None and max(self.features) >= n_features:
            raise SpecError(
                f"kernel {self.name} uses feature {max(self.features)} but the data has only "
                f"{n_features} feature(s)"
            )

    def base(self, X: np.ndarray, Z: np.ndarray) -> np.ndarray:
        """The pairwise base (squared distances or inner products) on the selected columns."""
        if self.family == "precomputed":
            raise SpecError(
                f"kernel {self.name!r} was imported as a precomputed Gram matrix; it has no formula "
                "to evaluate on new data (supply its cross kernels when importing)"
            )
        self.check_features(X.shape[1])
        cols = slice(None) if self.features is None else list(self.features)
        fn = _compute.sqdist if self.base_key[0] == "sqdist" else _compute.dot
        return fn(X[:, cols], Z[:, cols])

    def from_base(self, B: np.ndarray) -> np.ndarray:
        """Map the pairwise base to kernel values (formulas in the module docstring)."""
        if self.family == "gaussian":  # one temporary, updated in place (B stays shared)
            w = float(self.param("width"))
            K = B * (-1.0 / (2.0 * w * w))
            return np.exp(K, out=K)
        if self.family == "polynomial":
            K = B + float(self.param("offset"))
            return np.power(K, int(self.param("degree")), out=K)
        return B.copy()  # linear

    def compute(self, X: np.ndarray, Z: np.ndarray | None = None) -> np.ndarray:
        """K(X, Z) as float64 (n, m); Z defaults to X."""
        return self.from_base(self.base(X, X if Z is None else Z))

    def diag(self, X: np.ndarray) -> np.ndarray:
        """k(x_i, x_i) for every row, without forming the n x n matrix."""
        if self.family == "gaussian":
            self.check_features(X.shape[1])
            return np.ones(X.shape[0])
        cols = slice(None) if self.features is None else list(self.features)
        if self.family == "precomputed":
            self.base(X, X)  # raises the explanatory error
        self.check_features(X.shape[1])
        sq = np.einsum("ij,ij->i", X[:, cols], X[:, cols])
        return self.from_base(sq)

    # ---- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "family": self.family,
            "params": dict(self.params),
            "features": None if self.features is None else list(self.features),
        }

    @classmethod
    def from_dict(cls, d: dict) -> KernelSpec:
        if not isinstance(d, dict) or set(d) - {"family", "params", "features"} or "family" not in d:
            raise SpecError(
                f"a kernel spec is a mapping with keys family, params, features; got {d!r}"
            )
        params = d.get("params") or {}
        if not isinstance(params, dict):
            raise SpecError(f"kernel spec params must be a mapping, got {params!r}")
        return cls(d["family"], tuple(params.items()), _as_features(d.get("features")))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> KernelSpec:
        return cls.from_dict(json.loads(s))


def features_text(features, feature_names=None) -> str:
    """``all`` for None, else the features joined by commas: their names where ``feature_names``
    (one per data column) gives them, else their column indices."""
    if features is None:
        return "all"
    names = list(feature_names) if feature_names is not None else []
    return ",".join(str(names[f]) if 0 <= f < len(names) else str(f) for f in features)


def specs_to_json(specs) -> str:
    return json.dumps([s.to_dict() for s in specs], sort_keys=True)


def hash_specs_json(h, specs, batch: int = 4096) -> None:
    """``h.update(specs_to_json(specs).encode())``, a batch of specs at a time (json.dumps of a list
    is "[" + ", ".join(each item's dumps) + "]"), so no list of M dicts and no M-spec string is held."""
    h.update(b"[")
    for k in range(0, len(specs), batch):
        part = json.dumps([s.to_dict() for s in specs[k:k + batch]], sort_keys=True)[1:-1]
        h.update(((", " if k else "") + part).encode())
    h.update(b"]")


def specs_from_entries(entries) -> list[KernelSpec]:
    """``[KernelSpec.from_json(e) for e in entries]`` (a bank's ``spec`` array), faster for many specs:
    the family and parameters of each distinct (family, params) are validated once and their tuple
    shared, only the features are checked per entry (``__post_init__``'s rules). Anything unusual goes
    through ``from_json``, which raises what it always did."""
    protos: dict = {}
    out = []
    new = object.__new__
    for e in entries:
        d = json.loads(e)
        try:
            key = (d["family"], tuple(sorted(d["params"].items())))
            feats = d["features"]
            ok = len(d) == 3 and (feats is None or (type(feats) is list and feats
                                                   and all(type(f) is int and f >= 0 for f in feats)))
            proto = protos.get(key) if ok else None
        except (TypeError, KeyError, AttributeError):
            ok, proto = False, None
        if not ok:
            out.append(KernelSpec.from_dict(d))
            continue
        if proto is None:
            proto = protos[key] = KernelSpec.from_dict({"family": d["family"], "params": d["params"], "features": None})
        features = None if feats is None else tuple(sorted(feats))
        if features is not None and len(set(features)) != len(features):
            out.append(KernelSpec.from_dict(d))  # raises: a repeated index
            continue
        spec = new(KernelSpec)
        object.__setattr__(spec, "family", proto.family)
        object.__setattr__(spec, "params", proto.params)
        object.__setattr__(spec, "features", features)
        out.append(spec)
    return out


def specs_from_json(s: str) -> list[KernelSpec]:
    return [KernelSpec.from_dict(d) for d in json.loads(s)]


def _as_features(features) -> tuple[int, ...] | None:
    if features is None:
        return None
    if isinstance(features, (int, np.integer)):
        return (int(features),)
    return tuple(int(f) for f in features)


def _fmt(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return f"{v:g}" if isinstance(v, float) else str(v)


#: the smallest Gaussian width: below it 1 / (2 s^2) overflows or every off-diagonal entry is 0
MIN_WIDTH = 1e-6
#: the largest polynomial degree: (<x,z> + 1)^p of standardised features overflows float32 beyond it
MAX_DEGREE = 20


def _validate_params(family: str, p: dict) -> None:
    if family == "gaussian":
        w = p["width"]
        if not isinstance(w, (int, float, np.floating, np.integer)) or not math.isfinite(w) or w <= 0:
            raise SpecError(f"gaussian width must be a positive finite number, got {w!r}; give the standard deviation "
                            "s > 0 of exp(-||x-z||^2/(2 s^2)), e.g. 1.0")
        if w < MIN_WIDTH:
            raise SpecError(f"gaussian width {w!r} is below {MIN_WIDTH:g}: exp(-||x-z||^2/(2 s^2)) underflows to 0 "
                            "(or 2 s^2 to 0) for every pair of distinct rows of standardised features; give a width "
                            "of about 0.1 to 20")
        p["width"] = float(w)
    elif family == "polynomial":
        deg, off = p["degree"], p["offset"]
        if isinstance(deg, bool) or not float(deg).is_integer() or deg < 1:
            raise SpecError(f"polynomial degree must be an integer >= 1, got {deg!r}; give a degree such as 2")
        if deg > MAX_DEGREE:
            raise SpecError(f"polynomial degree {deg!r} is above {MAX_DEGREE}: (<x,z> + c)^p overflows on standardised "
                            f"features; give a degree from 1 to {MAX_DEGREE} (SimpleMKL uses 1-3)")
        if not math.isfinite(off) or off < 0:
            raise SpecError(f"polynomial offset must be finite and >= 0, got {off!r}")
        p["degree"], p["offset"] = int(deg), float(off)
