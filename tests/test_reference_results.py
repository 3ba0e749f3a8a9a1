"""Every solver's results on two banks equal the saved reference (``tests/_reference.py``).

The reference was saved before the solver layer was restructured; a change that alters a result
must either be a documented defect fix (then the reference is saved anew in the same commit, and the
commit says why) or is a regression. Compared to 1e-9 relative so that another CPU's BLAS or numba
code paths do not fail CI; ``python tests/_reference.py check`` shows bit-identity on one machine.
"""

from __future__ import annotations

import numpy as np
import pytest
from _reference import STORE, difference, run_all


@pytest.fixture(scope="module")
def current():
    return run_all()


def test_every_saved_result_is_reproduced(current):
    saved = np.load(STORE)
    missing = sorted(set(saved.files) - set(current))
    assert not missing, f"cases no longer produced: {missing[:5]}"
    off = {}
    for key in saved.files:
        a, b = current[key].astype(np.float64), saved[key].astype(np.float64)
        scale = float(np.max(np.abs(b[~np.isnan(b)]), initial=1.0))
        if difference(a, b) > 1e-9 * max(scale, 1.0):
            off[key] = difference(a, b)
    assert not off, f"results differ from the reference: {off}"
