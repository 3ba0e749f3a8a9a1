"""Kernel banks: specs that compute Gram matrices, the zarr store that holds them, and the build."""

from mklscale.bank import families
from mklscale.bank.build import build_bank
from mklscale.bank.spec import KernelSpec
from mklscale.bank.store import KernelBank, VerifyReport

__all__ = ["KernelBank", "KernelSpec", "VerifyReport", "build_bank", "families"]
