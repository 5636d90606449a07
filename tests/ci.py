"""The short CI run: a variant of a test that CI leaves to ``scripts/test --long`` (CI sets CI=true)."""

from __future__ import annotations

import os

import pytest

__all__ = ["in_ci", "long_only"]


def in_ci() -> bool:
    """Whether this is the short CI run (a test that runs there in a shorter form asks this)."""
    return os.environ.get("CI") == "true"


def long_only(variant: str, covered_by: str) -> None:
    """Skip ``variant`` in CI, saying which variant CI runs instead; ``--long`` runs every one."""
    if in_ci():
        pytest.skip(f"CI runs {covered_by} instead of {variant}; scripts/test --long runs both")
