"""The machinery every solver shares, so a solver module holds only its algorithm.

- ``runlog``: the history of one solve (running totals of seconds, passes and bytes read within
  that solve, continued across a checkpoint resume), the checkpoint's share of it, the verbose line.
- ``screening``: one full pass of ||u||_{K_m} over the bank and the bound that proves kernels stay
  inactive without reading them, ||u'||_{K_m} <= ||u||_{K_m} + sqrt(lambda_max(K_m)) ||u' - u||_2.
- ``working_set``: the kernels a solver holds in the driver, under one memory budget, seen only
  through their operations (products, quadratic forms, weighted sums).
"""

from mklscale.solvers.toolkit.runlog import RunLog

__all__ = ["RunLog"]
