"""mklscale: multiple kernel learning over kernel banks far larger than memory.

Layers (dependencies point one way): ``bank`` <- ``engine`` <- ``solvers`` <- estimators / cli.
"""

__version__ = "0.1.0"
