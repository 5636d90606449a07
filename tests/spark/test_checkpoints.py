"""Spark checkpoints are bound to the store they were made against."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from headrace.errors import OptionError
from headrace.spark.runner import checkpoint_root
from headrace.store import open_store


def test_default_checkpoints_of_a_recreated_store_start_afresh(tmp_path: Path) -> None:
    first = open_store(f"sqlite:///{tmp_path}/a.db")
    root = checkpoint_root(first, "t", None)
    assert root == checkpoint_root(first, "t", None)  # the same store resumes its own checkpoints
    first.close()
    (tmp_path / "a.db").unlink()
    again = open_store(f"sqlite:///{tmp_path}/a.db")
    assert checkpoint_root(again, "t", None) != root
    again.close()


def test_a_checkpoint_dir_of_another_store_is_refused(tmp_path: Path) -> None:
    one, other = open_store(f"sqlite:///{tmp_path}/one.db"), open_store(f"sqlite:///{tmp_path}/other.db")
    checkpoint_root(one, "t", str(tmp_path / "cp"))
    expected = (f"The Spark checkpoints in {tmp_path}/cp/t belong to another store (got '{one.instance_id()}'). "
                f"Hint: this store (sqlite:///{tmp_path}/other.db) is {other.instance_id()}: pass a checkpoint_dir "
                "of its own, or delete that directory to start the topology over")
    with pytest.raises(OptionError, match=f"^{re.escape(expected)}$"):
        checkpoint_root(other, "t", str(tmp_path / "cp"))
    assert checkpoint_root(other, "u", str(tmp_path / "cp")).endswith("/cp/u")  # another topology is another dir
