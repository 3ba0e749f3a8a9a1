"""The estimators' bank cache: a size cap with least-recently-used eviction that never removes a bank
another process is using, and ``mklscale cache info|clear``. Real fits on tiny data, real zarr
banks, and a real second process holding a bank. A new bank larger than the cap is refused before
anything is written: tests/test_size_checks.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mklscale import MKLClassifier
from mklscale.bank import cache as bank_cache
from mklscale.cli import main as cli
from mklscale.errors import InvalidInputError

ONE = {"family": "gaussian", "widths": [1.0], "features": "all"}


def _fit(cache: Path, seed: int) -> Path:
    """A uniform-baseline fit on 20 rows of data ``seed``; the path of the bank it used."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(20, 2))
    y = np.where(X[:, 0] > 0, 1, -1)
    y[:2] = [1, -1]
    est = MKLClassifier(kernels=ONE, solver="uniform", cache_dir=cache).fit(X, y)
    return Path(est.fit_stats_["bank"])


@pytest.fixture
def three_banks(tmp_path, monkeypatch):
    """A cache holding banks a (used first), b and c (used last), and no cap while they are built."""
    monkeypatch.setenv("MKLSCALE_CACHE_MAX", "none")
    cache = tmp_path / "cache"
    paths = [_fit(cache, seed) for seed in range(3)]
    for age, path in zip((300, 200, 100), paths):  # last use: a 300 s ago, b 200 s ago, c 100 s ago
        t = path.stat().st_mtime - age
        os.utime(path, (t, t))
    return cache, paths


class _Holder:
    """Another process fitting on (holding the use lock of) a cached bank until closed."""

    def __init__(self, cache: Path, name: str):
        code = ("import sys; from mklscale.bank import cache; "
                "ctx = cache.using(sys.argv[1], sys.argv[2]); ctx.__enter__(); print('held', flush=True); "
                "sys.stdin.read()")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(cache), name], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        if self.proc.stdout.readline().strip() != "held":
            self.proc.kill()
            self.close()
            pytest.fail("the holding process did not start")

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


def test_eviction_removes_least_recently_used_banks_not_in_use(three_banks):
    cache, (a, b, c) = three_banks
    assert [x.path for x in bank_cache.banks(cache)] == [a, b, c]
    sizes = {x.path: x.nbytes for x in bank_cache.banks(cache)}
    holder = _Holder(cache, a.name)  # a, the least recently used, is in use elsewhere
    try:
        assert bank_cache.evict(cache, keep=c, limit=sizes[a] + sizes[c]) == [b]
        assert a.is_dir() and not b.exists() and c.is_dir()
        assert bank_cache.evict(cache, keep=c, limit=0) == []  # a is still in use: never removed
        removed, busy = bank_cache.clear(cache)
        assert [x.path for x in removed] == [c] and [x.path for x in busy] == [a]
    finally:
        holder.close()
    assert bank_cache.evict(cache, limit=0) == [a]
    assert bank_cache.banks(cache) == []


def test_a_fit_keeps_the_cache_under_the_cap_and_keeps_its_own_bank(three_banks, monkeypatch):
    """With the cap set to one bank's size a new fit leaves only its own bank (the others are older)."""
    cache, old = three_banks
    monkeypatch.setenv("MKLSCALE_CACHE_MAX", str(bank_cache.banks(cache)[-1].nbytes))
    new = _fit(cache, seed=3)
    assert [x.path for x in bank_cache.banks(cache)] == [new] and not any(p.exists() for p in old)
    # a fit that reuses a bank marks it used: it now outlives the one built after it
    monkeypatch.setenv("MKLSCALE_CACHE_MAX", "none")
    other = _fit(cache, seed=4)
    assert _fit(cache, seed=3) == new
    assert [x.path for x in bank_cache.banks(cache)] == [other, new]
    assert bank_cache.evict(cache, limit=bank_cache.banks(cache)[-1].nbytes) == [other]


def test_cap_from_the_environment(monkeypatch):
    monkeypatch.delenv("MKLSCALE_CACHE_MAX", raising=False)
    assert bank_cache.max_bytes() == 2 * 10**9 and bank_cache.max_setting() == "2GB"
    for text, value in (("500MB", 500 * 10**6), (" 3GiB", 3 * 2**30), ("none", None), ("0", 0)):
        monkeypatch.setenv("MKLSCALE_CACHE_MAX", text)
        assert bank_cache.max_bytes() == value and bank_cache.max_setting() == text.strip()
    monkeypatch.setenv("MKLSCALE_CACHE_MAX", "lots")
    with pytest.raises(InvalidInputError, match="MKLSCALE_CACHE_MAX='lots' is not a size; set it to a size such as"):
        bank_cache.max_bytes()


def test_cache_info_and_clear_commands(three_banks, capsys):
    cache, paths = three_banks
    total = sum(x.nbytes for x in bank_cache.banks(cache))
    assert cli(["cache", "info", "--dir", str(cache), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info == {"path": str(cache), "bytes": total, "n_banks": 3, "max_bytes": None}
    assert cli(["cache", "info", "--dir", str(cache)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"bank cache: {cache}", f"  size: {total / 1e9:.3f} GB in 3 bank(s)  (no cap, $MKLSCALE_CACHE_MAX)"]
    holder = _Holder(cache, paths[1].name)
    try:
        assert cli(["cache", "clear", "--dir", str(cache)]) == 0
    finally:
        holder.close()
    out = capsys.readouterr().out
    assert out.startswith(f"bank cache: {cache}: removed 2 bank(s), ") and "1 in use by a running fit left in place" in out
    assert [x.path for x in bank_cache.banks(cache)] == [paths[1]]


def test_only_the_caches_own_bank_folders_are_counted_or_removed(three_banks):
    cache, paths = three_banks
    mine = [cache / "bank-mine", cache / "notes"]
    for folder in mine:
        folder.mkdir()
        (folder / "data.txt").write_text("keep me")
    assert [x.path for x in bank_cache.banks(cache)] == paths
    assert bank_cache.evict(cache, limit=0) == paths
    assert all((folder / "data.txt").is_file() for folder in mine)
