"""The Delta and Iceberg sinks' writers without Spark, on both stores: a retried batch is written
once, a writer a newer one superseded is refused before it reads the table, and one that read the
table before the newer writer committed the same batches cannot commit (the zombie's window)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from headrace.errors import FencedWriterError
from headrace.lake import LakeSink, open_lake_sink
from headrace.lake.delta import WRITER_KEY
from headrace.lake.iceberg import catalog_of
from headrace.names import lake_app_id


def rows(producer: str, batches: range, per_batch: int = 3) -> pa.Table:
    out: dict[str, list[Any]] = {"key": [], "n": [], "id": [], "producer": [], "batch": []}
    for b in batches:
        for i in range(per_batch):
            out["key"].append(f"k{i}")
            out["n"].append(b * 100 + i)
            out["id"].append(f"{producer}:{b}:{i}")
            out["producer"].append(producer)
            out["batch"].append(b)
    return pa.table({**out, "n": pa.array(out["n"], pa.int64()), "batch": pa.array(out["batch"], pa.int64())})


def sink(kind: str, store_url: str, tmp: Path) -> LakeSink:
    if kind == "delta":
        return open_lake_sink("delta", "out", store_url, str(tmp / "delta"))
    return open_lake_sink("iceberg", "out", store_url, "lake.out", warehouse=str(tmp / "warehouse"))


def ids(kind: str, store_url: str, tmp: Path) -> list[str]:
    if kind == "delta":
        table = DeltaTable(str(tmp / "delta")).to_pyarrow_table()
    else:
        table = catalog_of(store_url, str(tmp / "warehouse")).load_table("lake.out").scan().to_arrow()
    return sorted(table["id"].to_pylist())


@pytest.fixture(params=["delta", "iceberg"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_retried_batch_is_written_once(kind: str, each_store: str, tmp_path: Path) -> None:
    writer = sink(kind, each_store, tmp_path)
    assert writer.write(rows("A/0", range(1, 3))) == 6
    assert writer.write(rows("A/0", range(1, 3))) == 0, "the same batches again write nothing"
    # a batch of two producers, one of them partly written already: only the new batches go in
    assert writer.write(pa.concat_tables([rows("A/0", range(1, 4)), rows("B/1", range(1, 2))])) == 6
    expected = sorted(r for p, bs in (("A/0", range(1, 4)), ("B/1", range(1, 2))) for r in rows(p, bs)["id"].to_pylist())
    assert ids(kind, each_store, tmp_path) == expected
    if kind == "delta":
        table = DeltaTable(str(tmp_path / "delta"))
        assert table.transaction_version(lake_app_id("out", "A/0")) == 3
        assert table.transaction_version(lake_app_id("out", "B/1")) == 1
    writer.close()


def test_a_superseded_writer_is_refused_before_it_reads_the_table(kind: str, each_store: str, tmp_path: Path) -> None:
    zombie = sink(kind, each_store, tmp_path)
    zombie.write(rows("A/0", range(1, 2)))
    newer = sink(kind, each_store, tmp_path)
    with pytest.raises(FencedWriterError, match="^" + re.escape(
            f"The {zombie.kind} sink 'out' has a newer writer (got {newer.sequencer}). Hint: this writer is "
            f"{zombie.sequencer}: another driver took the sink over, and this one stops without writing") + "$"):
        zombie.write(rows("A/0", range(2, 3)))
    assert newer.write(rows("A/0", range(1, 3))) == 3
    assert len(ids(kind, each_store, tmp_path)) == 6
    zombie.close()
    newer.close()


def test_the_first_commit_of_two_writers_is_made_against_a_snapshot_too(kind: str, each_store: str,
                                                                        tmp_path: Path) -> None:
    """No table yet: the zombie makes it empty and reads it, then stalls; the newer writer writes."""
    zombie, batch = sink(kind, each_store, tmp_path), rows("A/0", range(1, 3))
    empty = zombie.snapshot(batch.schema)
    newer = sink(kind, each_store, tmp_path)
    assert newer.write(batch) == 6
    with pytest.raises(FencedWriterError, match=f"^The {zombie.kind} sink 'out' lost its commit to another writer"):
        zombie.commit(empty, batch, {"A/0": 2})
    assert ids(kind, each_store, tmp_path) == sorted(batch["id"].to_pylist())
    zombie.close()
    newer.close()


def test_a_writer_that_read_the_table_before_a_newer_one_wrote_cannot_commit(kind: str, each_store: str,
                                                                          tmp_path: Path) -> None:
    """The zombie's window: it passed its fence check and read the table, then stalled; a newer
    writer took over and wrote the same batches; the zombie resumes at its commit."""
    first = sink(kind, each_store, tmp_path)
    first.write(rows("A/0", range(1, 2)))
    zombie_rows = rows("A/0", range(2, 4))
    first.check_fence()
    zombie_rows_snapshot = first.snapshot(zombie_rows.schema)  # steps 1 and 2 of write() done, then stalled
    newer = sink(kind, each_store, tmp_path)
    assert newer.write(rows("A/0", range(1, 4))) == 6
    with pytest.raises(FencedWriterError, match=f"^The {first.kind} sink 'out' lost its commit to another writer"):
        first.commit(zombie_rows_snapshot, zombie_rows, {"A/0": 3})
    assert ids(kind, each_store, tmp_path) == sorted(rows("A/0", range(1, 4))["id"].to_pylist())
    if kind == "delta":
        writers = [c.get(WRITER_KEY) for c in DeltaTable(str(tmp_path / "delta")).history() if WRITER_KEY in c]
        assert sorted(writers) == [f"out:{first.sequencer}", f"out:{newer.sequencer}"]
    first.close()
    newer.close()


def test_a_value_field_named_like_a_record_column_is_refused_word_for_word(tmp_path: Path) -> None:
    from headrace.errors import OptionError
    from headrace.spark.lake_sinks import LakeWrite
    from headrace.sinkspec import SinkSpec

    spec = SinkSpec("counts-delta", "counts", "delta", delta=str(tmp_path / "d"))
    with pytest.raises(OptionError, match="^" + re.escape(
            "The delta sink 'counts-delta' cannot put the fields of stream 'counts' beside the record's own columns "
            "(got ['id', 'key']). Hint: rename them in the stream's schema: each row has ['key', 'timestamp', 'id', "
            "'producer', 'batch'] besides the value's fields") + "$"):
        LakeWrite(spec, f"sqlite:///{tmp_path}/store.db", ["Key", "count", "id"])
