"""MKL solvers: plug-in losses and penalties (SpicyMKL §4 interface) and one module per algorithm.

Every solver takes an engine (``n``, ``M``, ``lambda_max``, ``quad_forms``, ``matvecs``, ``blocks``,
``stats``), the targets and its parameters, and returns a :class:`~mklscale.solvers.result.MKLResult`.
"""
