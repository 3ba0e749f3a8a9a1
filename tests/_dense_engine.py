"""The solver tests' name for the in-memory engine (it was a test double; it is now
``mklscale.engine.InMemoryEngine``, a supported engine checked by tests/test_engine_contract.py)."""

from mklscale.engine import InMemoryEngine as DenseEngine

__all__ = ["DenseEngine"]
