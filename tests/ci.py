"""The short CI run: a variant of a test that CI leaves to ``scripts/test --long`` (CI sets CI=true)."""

from __future__ import annotations

import os

import pytest

__all__ = ["long_only"]


def long_only(variant: str, covered_by: str) -> None:
    """Skip ``variant`` in CI, saying which variant CI runs instead; ``--long`` runs every one."""
    if os.environ.get("CI") == "true":
        pytest.skip(f"CI runs {covered_by} instead of {variant}; scripts/test --long runs both")
