"""Spark checkpoints are bound to the store they were made against."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from headrace import read, run
from headrace.errors import OptionError
from headrace.spark.checkpoints import checkpoint_root
from headrace.store import open_store

from .pipelines import oracle, searches, three_stage


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


def test_a_query_killed_before_its_first_offset_was_written_resumes(spark: Any, tmp_path: Path) -> None:
    # what a driver SIGKILLed inside Spark's first offset write leaves: the query's checkpoint with
    # only the temporary file of offset 0 (Spark refuses such a checkpoint on every restart)
    url, checkpoints = f"sqlite:///{tmp_path}/store.db", tmp_path / "checkpoints"
    events = searches(600)
    store = open_store(url)
    root = Path(checkpoint_root(store, "three_stage", str(checkpoints)))
    store.close()
    for name in ("WindowCounter", "BucketTotals"):
        (root / name / "offsets").mkdir(parents=True)
        (root / name / "offsets" / f".0.{uuid.uuid4()}.tmp").write_text("v1\n")
        (root / name / "offsets" / f"..0.{uuid.uuid4()}.tmp.crc").write_bytes(b"")

    run(three_stage(events), store=url, spark=spark, progress=None, timeout_s=300, mode="microbatch",
        checkpoint_dir=str(checkpoints))

    window = {(r.value["query"], r.value["bucket"]): r.value["count"] for r in read("window_counts", url)}
    assert window == oracle(events)["window_counts"]
    assert not list(root.glob("*/offsets/.*.tmp*"))
