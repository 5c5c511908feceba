"""Shared fixtures: every async test runs under trio (pytest-trio, trio_mode)."""

from __future__ import annotations

import pytest

from duplex.metrics import MetricsRegistry


@pytest.fixture
def registry() -> MetricsRegistry:
    """A fresh metrics registry, so counts never leak between tests."""
    return MetricsRegistry()
