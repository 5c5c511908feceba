"""Whether Triton kernels can run.

Triton is optional: it ships with CUDA builds of torch and is absent from the
CPU build. Kernels are compiled for CUDA tensors; with ``TRITON_INTERPRET=1``
set before a kernel module is imported, Triton's interpreter runs the same
kernels on host tensors (numpy), which is how CI without a GPU tests every
kernel against its torch reference (tests/conftest.py sets it).
"""

from __future__ import annotations

import functools
import importlib.util

__all__ = ["available"]


@functools.cache
def available() -> bool:
    """Triton is importable (it need not find a GPU)."""
    return importlib.util.find_spec("triton") is not None
