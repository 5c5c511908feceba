"""Shared fixtures: every async test runs under trio (pytest-trio, trio_mode)."""

from __future__ import annotations

import os

import pytest
import torch

# Triton kernels run in Triton's interpreter where there is no GPU; the switch is read
# when a kernel is defined, so it must be set before duplex.kernels modules are imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from duplex.metrics import MetricsRegistry


@pytest.fixture
def registry() -> MetricsRegistry:
    """A fresh metrics registry, so counts never leak between tests."""
    return MetricsRegistry()
