"""MKL solvers: one module per algorithm, the shared toolkit (``toolkit``: run log, screening, held
kernels), the plug-in losses and penalties (SpicyMKL §4 interface) and their duality (``duality``).

Every solver takes an engine (a :class:`~mklscale.engine.contract.KernelEngine`; SGD and GCD also a
kernel family), the targets and its parameters, and returns a :class:`~mklscale.solvers.result.MKLResult`.
"""
