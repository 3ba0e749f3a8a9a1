"""One meaning per family name (issue 28, item 5): the estimators' ``kernels=``, a pipeline's
``[bank]`` table and the CLI's ``--family`` options give the same specs, in the same order, for
every family and for a few parameter combinations; an option a family does not take is an error
everywhere; ``count_kernels`` agrees with ``resolve``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mklscale import cli
from mklscale.bank import KernelBank, KernelSpec, families
from mklscale.bank.size import count_kernels
from mklscale.datasets import load
from mklscale.errors import ConfigError, SpecError
from mklscale.estimators import MKLClassifier
from mklscale.pipeline import load_pipeline

#: (Python description, TOML [bank] lines, CLI options): the same family three ways
CASES = {
    "auto": ("auto", 'family = "auto"', ["--family", "auto"]),
    "simplemkl": ("simplemkl", 'family = "simplemkl"', ["--family", "simplemkl"]),
    "gaussian": ("gaussian", 'family = "gaussian"', ["--family", "gaussian"]),
    "polynomial": ("polynomial", 'family = "polynomial"', ["--family", "polynomial"]),
    "linear": ("linear", 'family = "linear"', ["--family", "linear"]),
    "random_subsets": ("random_subsets", 'family = "random_subsets"', ["--family", "random_subsets"]),
    "gaussian_each": ({"family": "gaussian", "widths": [0.5, 2.0], "features": "each"},
                      'family = "gaussian"\nwidths = [0.5, 2.0]\nfeatures = "each"',
                      ["--family", "gaussian", "--widths", "0.5", "2", "--kernel-features", "each"]),
    "gaussian_subset": ({"family": "gaussian", "widths": [1.0], "features": [0, 2]},
                        'family = "gaussian"\nwidths = [1.0]\nfeatures = [0, 2]',
                        ["--family", "gaussian", "--widths", "1", "--kernel-features", "0,2"]),
    "polynomial_all": ({"family": "polynomial", "degrees": [2], "offset": 0.5, "features": "all"},
                       'family = "polynomial"\ndegrees = [2]\noffset = 0.5\nfeatures = "all"',
                       ["--family", "polynomial", "--degrees", "2", "--offset", "0.5", "--kernel-features", "all"]),
    "linear_all": ({"family": "linear", "features": "all"}, 'family = "linear"\nfeatures = "all"',
                   ["--family", "linear", "--kernel-features", "all"]),
    "simplemkl_widths_degrees": ({"family": "simplemkl", "widths": [1.0, 2.0], "degrees": [1]},
                                 'family = "simplemkl"\nwidths = [1.0, 2.0]\ndegrees = [1]',
                                 ["--family", "simplemkl", "--widths", "1", "2", "--degrees", "1"]),
    "random_subsets_params": ({"family": "random_subsets", "n_kernels": 7, "seed": 3, "max_subset": 2},
                              'family = "random_subsets"\nn_kernels = 7\nseed = 3\nmax_subset = 2',
                              ["--family", "random_subsets", "--n-kernels", "7", "--seed", "3", "--max-subset", "2"]),
}
IRIS_D = 4
D = (IRIS_D, 13)


def _from_python(description, d: int) -> list[KernelSpec]:
    """As the estimators turn ``kernels=`` into specs (``_fit_features``)."""
    est = MKLClassifier(kernels=description)
    return families.resolve(est.kernels, d, est._seed())


def _from_toml(lines: str, d: int, tmp_path) -> list[KernelSpec]:
    """A pipeline file's [bank] table, loaded and resolved as the run's bank stage does (``pipeline.bank_stage.prepare_bank``)."""
    path = tmp_path / "p.toml"
    path.write_text(f'name = "t"\n[dataset]\nname = "iris"\n[bank]\n{lines}\n'
                    '[[solver]]\nname = "uni"\nsolver = "uniform"\n')
    return families.resolve(load_pipeline(path).bank["kernels"], d)


def _cli_description(options: list[str]) -> dict:
    return cli._kernels(cli._parser().parse_args(["bank", "build", "--dataset", "iris", *options, "--out", "b"]))


@pytest.mark.parametrize("d", D)
@pytest.mark.parametrize("case", CASES)
def test_python_toml_and_cli_give_the_same_specs(case, d, tmp_path):
    python, toml, options = CASES[case]
    specs = _from_python(python, d)
    assert _from_toml(toml, d, tmp_path) == specs
    assert families.resolve(_cli_description(options), d) == specs
    assert count_kernels(python, d) == len(specs) == count_kernels(_cli_description(options), d)
    if isinstance(python, str):  # a name is exactly {"family": name}
        assert families.resolve({"family": python}, d) == specs
        assert _cli_description(options) == {"family": python}


def _each(d):
    return [None] + [(j,) for j in range(d)]


@pytest.mark.parametrize("d", D)
def test_what_each_family_gives(d):
    """The semantics (families' module docstring), written out independently of families.py."""
    widths = (0.1, 0.25, 0.5, 0.75) + tuple(range(1, 21))
    assert families.resolve("gaussian", d) == [KernelSpec.gaussian(w, f) for f in _each(d) for w in widths]
    assert families.resolve("polynomial", d) == [KernelSpec.polynomial(p, 1.0, f) for f in _each(d) for p in (1, 2, 3)]
    assert families.resolve("linear", d) == [KernelSpec.linear(f) for f in _each(d)]
    assert families.resolve("simplemkl", d) == [
        s for f in _each(d) for s in [KernelSpec.gaussian(w, f) for w in widths]
        + [KernelSpec.polynomial(p, 1.0, f) for p in (1, 2, 3)]]
    assert len(families.resolve("simplemkl", d)) == 27 * (d + 1)
    assert families.resolve("random_subsets", d) == families.random_subsets(d, 100, seed=0)
    assert families.resolve({"family": "simplemkl", "widths": [1, 2], "degrees": [1]}, d) == [
        s for f in _each(d) for s in (KernelSpec.gaussian(1, f), KernelSpec.gaussian(2, f),
                                      KernelSpec.polynomial(1, 1.0, f))]
    assert families.resolve({"family": "gaussian", "widths": [1, 2], "features": "each"}, d) == [
        KernelSpec.gaussian(w, (j,)) for j in range(d) for w in (1, 2)]
    assert families.resolve({"family": "linear", "features": [2, 0]}, d) == [KernelSpec.linear((0, 2))]


@pytest.mark.parametrize("d", (1, IRIS_D, 13, 30))
def test_auto_is_six_plus_d_kernels_with_absolute_widths(d):
    specs = families.resolve("auto", d)
    assert len(specs) == 6 + d
    root = math.sqrt(d)
    assert specs == ([KernelSpec.gaussian(root * r) for r in (0.25, 0.5, 1, 2, 4)] + [KernelSpec.linear()]
                     + [KernelSpec.gaussian(1.0, (j,)) for j in range(d)])
    assert specs[0].param("width") == pytest.approx(0.25 * root)  # recorded as the width, not as a ratio


def test_random_subsets_seed_is_the_estimators_random_state_unless_given():
    assert _from_python("random_subsets", 6) == families.random_subsets(6, 100, seed=0)
    est = MKLClassifier(kernels="random_subsets", random_state=5)
    assert families.resolve(est.kernels, 6, est._seed()) == families.random_subsets(6, 100, seed=5)
    given = {"family": "random_subsets", "n_kernels": 4, "seed": 1}
    assert families.resolve(given, 6, seed=5) == families.random_subsets(6, 4, seed=1)


def test_the_estimator_fits_on_the_specs_resolve_gives(tmp_path):
    """The call path itself: a fit's bank holds resolve's specs (a name, and random_state's seed)."""
    ds = load("iris")
    X, y = ds.X[::5], ds.y[::5]
    for kernels, seed in (("linear", None), ({"family": "random_subsets", "n_kernels": 5}, 2)):
        est = MKLClassifier(kernels=kernels, solver="uniform", random_state=seed, cache_dir=tmp_path / "c").fit(X, y)
        assert KernelBank.open(est.fit_stats_["bank"]).specs == families.resolve(kernels, IRIS_D, seed)


@pytest.mark.parametrize("d", D)
def test_count_kernels_agrees_with_resolve_for_every_family(d):
    for name in families.FAMILIES:
        assert count_kernels(name, d) == len(families.resolve(name, d)), name
    mixed = ["auto", {"family": "random_subsets", "n_kernels": 3}, KernelSpec.gaussian(0.3).to_dict()]
    assert count_kernels(mixed, d) == len(families.resolve(mixed, d)) == 6 + d + 3 + 1
    assert count_kernels({"family": "random_subsets", "n_kernels": 10**12}, d) == 10**12  # nothing generated
    with pytest.raises(SpecError, match="n_kernels must be a positive integer"):
        count_kernels({"family": "random_subsets", "n_kernels": 0}, d)


#: for each family, a CLI option it does not take, and the options it takes
UNUSED = {
    "auto": (["--widths", "1"], "--widths; it takes no options"),
    "simplemkl": (["--n-kernels", "5"], "--n-kernels; it takes --widths, --degrees"),
    "gaussian": (["--degrees", "2"], "--degrees; it takes --widths, --kernel-features"),
    "polynomial": (["--widths", "1"], "--widths; it takes --degrees, --offset, --kernel-features"),
    "linear": (["--offset", "1"], "--offset; it takes --kernel-features"),
    "random_subsets": (["--kernel-features", "all"], "--kernel-features; it takes --n-kernels, --seed, --max-subset"),
}


@pytest.mark.parametrize("family", UNUSED)
@pytest.mark.parametrize("command", ("build", "fit"))
def test_cli_refuses_an_option_the_family_does_not_take(family, command, tmp_path, capsys):
    option, takes = UNUSED[family]
    out = tmp_path / "out"
    argv = (["bank", "build"] if command == "build" else ["fit"]) + ["--dataset", "iris", "--family", family, *option,
                                                                      "--out", str(out), "--quiet"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"mklscale: error: --family {family} does not take {takes}\n"
    assert not out.exists()


def test_cli_family_options_are_the_family_parameters():
    assert cli.FAMILY_CHOICES == families.FAMILIES
    assert set(cli.FAMILY_OPTIONS) == {p for params in families.FAMILY_PARAMS.values() for p in params}
    args = cli._parser().parse_args(["fit", "--dataset", "iris", "--out", "m"])
    assert cli._kernels(args) == {"family": "auto"}  # nothing given: the estimators' default, with its own defaults


def test_cli_bad_kernel_features_is_one_line(tmp_path, capsys):
    argv = ["bank", "build", "--dataset", "iris", "--family", "linear", "--kernel-features", "0;2", "--out",
            str(tmp_path / "b"), "--quiet"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == ("mklscale: error: --kernel-features '0;2': give all, each, all+each or "
                                       "comma-separated column indices such as 0,2,5\n")


@pytest.mark.parametrize("description, match", [
    ({"family": "polynomial", "widths": [1]}, "'polynomial' does not take widths; remove it or use one of its "
                                              "parameters: degrees, offset, features"),
    ({"family": "auto", "features": "all"}, "'auto' does not take features; remove it or it takes no parameters"),
    ({"family": "simplemkl", "features": "all"}, "'simplemkl' does not take features; .* widths, degrees$"),
    ({"family": "random_subsets", "widths": [1]}, "does not take widths; .* n_kernels, seed, max_subset"),
    ({"family": "gaussian", "features": "some"}, "features='some' is not one of 'all', 'each', 'all\\+each'"),
    ({"family": "gaussian", "features": None}, "give \"all\", \"each\", \"all\\+each\" or a list of column indices"),
    ("rbf", "unknown kernel family 'rbf'; choose one of auto, simplemkl"),
])
def test_python_refuses_what_a_family_does_not_take(description, match, tmp_path):
    X = np.random.default_rng(0).normal(size=(6, 3))
    with pytest.raises(SpecError, match=match):
        MKLClassifier(kernels=description, cache_dir=tmp_path / "c").fit(X, [0, 1] * 3)
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())  # no bank was started


@pytest.mark.parametrize("bank, match", [
    ('family = "polynomial"\nwidths = [1]', r"unknown key\(s\) widths for family 'polynomial'; remove or rename them "
                                           r"\(family parameters: degrees, offset, features; bank keys"),
    ('family = "auto"\nwidths = [1]', r"unknown key\(s\) widths for family 'auto'.*family parameters: none"),
    ('families = [{ family = "auto", widths = [1] }]',
     r"\[bank\].families\[0\]: kernel family 'auto' does not take widths; remove it or it takes no parameters"),
    ('families = ["auto", { family = "linear", features = "every" }]',
     r"\[bank\].families\[1\]: features='every' is not one of"),
    ('family = "gaussian"\nwidths = [-1.0]', r"\[bank\]: gaussian width must be a positive finite number"),
    ('families = []', r"families is empty"),
])
def test_pipelines_refuse_what_a_family_does_not_take(bank, match, tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(f'name = "t"\n[dataset]\nname = "iris"\n[bank]\n{bank}\n[[solver]]\nname = "u"\nsolver = "uniform"\n')
    with pytest.raises(ConfigError, match=match):
        load_pipeline(path)


def test_a_pipeline_mixes_names_and_tables(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('name = "t"\n[dataset]\nname = "iris"\n[bank]\nfamilies = ["auto", { family = "polynomial", '
                    'degrees = [2], features = "all" }]\n[[solver]]\nname = "u"\nsolver = "uniform"\n')
    specs = families.resolve(load_pipeline(path).bank["kernels"], IRIS_D)
    assert specs == families.resolve("auto", IRIS_D) + [KernelSpec.polynomial(2)]
