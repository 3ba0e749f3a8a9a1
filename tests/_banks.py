"""Small in-memory kernel banks shared by solver tests."""

from __future__ import annotations

import numpy as np


def subset_gaussian_bank(n: int, M: int, seed: int):
    """Unit-diagonal Gaussian kernels on random feature subsets with varying widths, and labels."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    y = np.where(X[:, 0] * X[:, 1] + 0.5 * X[:, 2] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    grams = []
    for _ in range(M):
        feats = rng.choice(5, size=int(rng.integers(1, 4)), replace=False)
        sq = ((X[:, None, feats] - X[None, :, feats]) ** 2).sum(-1)
        grams.append(np.exp(-sq / (2.0 * (0.5 + 3.0 * rng.random()) ** 2)))
    return np.array(grams), y


def widths_and_linear_bank(n: int = 30, seed: int = 0):
    """(grams, X, y): Gaussian kernels of widths 0.3, 1, 3 and linear kernels of single features on
    random data; y a smooth function of two features plus noise (regression)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 4))
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    grams = [np.exp(-d2 / (2 * w * w)) for w in (0.3, 1.0, 3.0)]
    grams += [np.outer(X[:, j], X[:, j]) for j in range(3)]
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] ** 2 + 0.05 * rng.standard_normal(n)
    return np.stack(grams), X, y


def centred_alignment_terms(grams, y):
    """(y_c, b, F) of the alignment oracles: b_i = y_c^T K_{i,c} y_c and F with F^T F = M,
    M_ij = <K_{i,c}, K_{j,c}>_F (centred kernels K_c = H K H)."""
    from mklscale.solvers._final_fit import centre

    yc = y - y.mean()
    Kc = np.stack([centre(K) for K in grams])
    b = np.einsum("i,mij,j->m", yc, Kc, yc)
    w, V = np.linalg.eigh(np.einsum("aij,bij->ab", Kc, Kc))
    return yc, b, np.sqrt(np.maximum(w, 0))[:, None] * V.T


def build_killed_after(tmp_path, X, n_kernels: int, seed: int, after: int = 10, **build_kw):
    """Run ``build_bank(X, families.random_subsets(d, n_kernels, seed), ...)`` in a child process and
    SIGKILL it once ``after`` kernels are flagged complete; returns the bank's path (asserts the kill
    landed mid-build). ``build_kw`` are build_bank's keyword arguments (numbers and strings)."""
    import signal
    import subprocess
    import sys
    import textwrap
    import time

    from mklscale.bank import KernelBank

    np.save(tmp_path / "X.npy", X)
    script = textwrap.dedent(f"""
        import numpy as np, sys
        from mklscale.bank import build_bank, families
        X = np.load({str(tmp_path / 'X.npy')!r})
        build_bank(X, families.random_subsets({X.shape[1]}, {n_kernels}, seed={seed}), sys.argv[1], progress=False,
                   flush_every_s=0, **{build_kw!r})
    """)
    target = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", script, str(target)])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            done = int(KernelBank.open(target).complete.sum())
        except Exception:
            done = 0
        if done >= after:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the build finished before it could be killed; make it larger"
    return target
