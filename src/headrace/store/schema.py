"""The store's tables, written once; each dialect fills in its integer and blob types and the
SQLite-only ``WITHOUT ROWID`` (every table has a primary key, so SQLite keeps rows in its index).

``segments`` and ``routes`` keep their rowid: their rows hold the bus's blobs, and in a table
without rowid every comparison of a seek loads the row's whole payload (its overflow chain). With
rowid, a seek walks the primary key's index and reads the one row it finds (``bench/store_layout.py``).
A rowid table, unlike one without, takes a NULL in a key column, so theirs say NOT NULL. The
columns are the same either way, so a store made with either layout reads and writes alike (one
made before keeps its slower layout).

``segments_by_time`` holds what the monitor counts (docs/monitoring.md): SQLite stores a row's
columns in order, so reading a segment's ``created_at`` from the table walks its whole ``data``
blob first (67 ms a status round over a 54 MB bus, 0.03 ms from the index)."""

from __future__ import annotations

__all__ = ["schema_statements"]

_TABLES = """
CREATE TABLE IF NOT EXISTS computations(
  name TEXT PRIMARY KEY, shards {INT} NOT NULL, sequencer {INT} NOT NULL DEFAULT 0,
  mode TEXT NOT NULL DEFAULT 'microbatch'){TABLE};
CREATE TABLE IF NOT EXISTS shards(
  computation TEXT, shard {INT}, version {INT} NOT NULL,
  input_watermark {INT} NOT NULL, output_watermark {INT} NOT NULL,
  sequencer {INT} NOT NULL DEFAULT 0, owner TEXT, lease_until {INT} NOT NULL DEFAULT 0,
  PRIMARY KEY(computation, shard)){TABLE};
CREATE INDEX IF NOT EXISTS shards_by_owner ON shards(owner);
CREATE INDEX IF NOT EXISTS shards_by_lease ON shards(lease_until, computation);
CREATE TABLE IF NOT EXISTS positions(
  computation TEXT, shard {INT}, producer TEXT, batch {INT} NOT NULL,
  PRIMARY KEY(computation, shard, producer)){TABLE};
CREATE TABLE IF NOT EXISTS state(
  computation TEXT, key TEXT, value {BLOB} NOT NULL, PRIMARY KEY(computation, key)){TABLE};
CREATE TABLE IF NOT EXISTS partials(
  computation TEXT, key TEXT, window_end {INT}, batch {INT}, shard {INT} NOT NULL, value {BLOB} NOT NULL,
  PRIMARY KEY(computation, key, window_end, batch)){TABLE};
CREATE INDEX IF NOT EXISTS partials_by_shard ON partials(computation, shard);
CREATE TABLE IF NOT EXISTS timers(
  computation TEXT, key TEXT, tag TEXT, shard {INT} NOT NULL, domain TEXT NOT NULL, timestamp {INT} NOT NULL,
  PRIMARY KEY(computation, key, tag)){TABLE};
CREATE INDEX IF NOT EXISTS timers_due ON timers(computation, shard, domain, timestamp);
CREATE INDEX IF NOT EXISTS timers_by_time ON timers(computation, domain, timestamp);
CREATE TABLE IF NOT EXISTS seen_ids(
  computation TEXT, shard {INT}, id TEXT, timestamp {INT} NOT NULL,
  PRIMARY KEY(computation, shard, id)){TABLE};
CREATE INDEX IF NOT EXISTS seen_ids_age ON seen_ids(computation, shard, timestamp);
CREATE TABLE IF NOT EXISTS seen_ranges(
  computation TEXT, shard {INT}, prefix TEXT, low {INT}, high {INT} NOT NULL, newest {INT} NOT NULL,
  bits {BLOB} NOT NULL, PRIMARY KEY(computation, shard, prefix, low)){TABLE};
CREATE INDEX IF NOT EXISTS seen_ranges_age ON seen_ranges(computation, shard, newest);
CREATE TABLE IF NOT EXISTS streams(
  stream TEXT, producer TEXT, PRIMARY KEY(stream, producer)){TABLE};
CREATE TABLE IF NOT EXISTS segments(
  stream TEXT NOT NULL, producer TEXT NOT NULL, batch {INT} NOT NULL, shard {INT} NOT NULL, count {INT} NOT NULL,
  data {BLOB} NOT NULL, created_at {INT} NOT NULL,
  PRIMARY KEY(stream, producer, batch, shard));
CREATE INDEX IF NOT EXISTS segments_by_batch ON segments(producer, batch, shard);
CREATE INDEX IF NOT EXISTS segments_by_time ON segments(producer, batch, created_at, count);
CREATE INDEX IF NOT EXISTS segments_by_stream ON segments(stream, producer);
CREATE TABLE IF NOT EXISTS batches(
  producer TEXT, batch {INT}, input_watermark {INT} NOT NULL, output_watermark {INT} NOT NULL,
  completed_at {INT} NOT NULL, plan TEXT, plan_since {INT}, PRIMARY KEY(producer, batch)){TABLE};
CREATE TABLE IF NOT EXISTS plans(id TEXT PRIMARY KEY, routes TEXT NOT NULL){TABLE};
CREATE TABLE IF NOT EXISTS routes(
  consumer TEXT NOT NULL, dest {INT} NOT NULL, producer TEXT NOT NULL, batch {INT} NOT NULL, stream TEXT NOT NULL,
  slot {INT} NOT NULL, count {INT} NOT NULL,
  data {BLOB} NOT NULL, PRIMARY KEY(consumer, dest, producer, batch, stream, slot));
CREATE INDEX IF NOT EXISTS routes_by_batch ON routes(consumer, producer, batch);
CREATE TABLE IF NOT EXISTS interval_groups(
  computation TEXT, sequencer {INT}, positions TEXT NOT NULL, input_watermark {INT} NOT NULL,
  output_watermark {INT} NOT NULL, PRIMARY KEY(computation, sequencer)){TABLE};
CREATE TABLE IF NOT EXISTS checkpoints(producer TEXT PRIMARY KEY, position TEXT){TABLE};
CREATE TABLE IF NOT EXISTS counters(
  computation TEXT, name TEXT, value {INT} NOT NULL, PRIMARY KEY(computation, name)){TABLE};
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL){TABLE};
CREATE TABLE IF NOT EXISTS events(
  name TEXT, at {INT}, kind TEXT, detail TEXT NOT NULL, PRIMARY KEY(name, kind, at)){TABLE};
CREATE TABLE IF NOT EXISTS samples(
  name TEXT, at {INT}, records {INT} NOT NULL, input_watermark {INT} NOT NULL, output_watermark {INT} NOT NULL,
  backlog {INT} NOT NULL, PRIMARY KEY(name, at)){TABLE}
"""

_DIALECTS = {
    "sqlite": {"INT": "INTEGER", "BLOB": "BLOB", "TABLE": " WITHOUT ROWID"},
    "postgresql": {"INT": "BIGINT", "BLOB": "BYTEA", "TABLE": ""},
}


def schema_statements(dialect: str) -> list[str]:
    """The CREATE statements for ``dialect`` (``sqlite`` or ``postgresql``), in order."""
    text = _TABLES.format(**_DIALECTS[dialect])
    return [s.strip() for s in text.split(";") if s.strip()]
