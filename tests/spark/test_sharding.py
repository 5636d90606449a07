from __future__ import annotations

from typing import Any

from headrace.spark.rows import partition_labels, spark_hash_int


def test_our_murmur3_is_sparks_hash_and_labels_give_one_shard_per_partition(spark: Any) -> None:
    from pyspark.sql import functions as F

    values = [0, 1, 2, 7, 42, -1, -123456, 2**31 - 1, -(2**31)]
    rows = spark.createDataFrame([(v,) for v in values], "v INT").select("v", F.hash("v").alias("h")).collect()
    assert {r.v: r.h for r in rows} == {v: spark_hash_int(v) for v in values}
    for shards in (1, 2, 3, 4, 8, 13):
        labels = partition_labels(shards)
        df = spark.createDataFrame([(shard, label) for shard, label in enumerate(labels)], "shard INT, part INT")
        placed = df.repartition(shards, "part").rdd.mapPartitionsWithIndex(
            lambda i, rows: [(i, r.shard) for r in rows]).collect()
        assert sorted(placed) == [(i, i) for i in range(shards)]
