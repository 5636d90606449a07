"""The server store: PostgreSQL, for clusters whose workers cannot share one SQLite file.

Same tables and same logic as SQLite (``SQLStore``); what differs is concurrency. Writers run in
READ COMMITTED transactions of their own: a shard's commit reads its shard's row (and sequencer)
``FOR UPDATE`` (so a takeover waits for commits in flight, then fences every later one) and moves
its version with ``UPDATE … WHERE version = base`` (a concurrent attempt that lost finds no row).
Journal writes of one producer are serialized by a transaction-scoped advisory lock.
"""

from __future__ import annotations

import hashlib
import json
import re
import select
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from ..errors import StoreError
from .connection import Failpoint
from .redact import redact_url
from .schema import schema_statements
from .sql import SQLStore
from .versions import check_schema

__all__ = ["PostgresStore", "channel"]

SCHEMA_LOCK = 0x68656164  # advisory lock id: processes that open a fresh database at once create it once

# Commits wake the workers that read them (LISTEN/NOTIFY, docs/architecture.md §4.2 "Wake-ups"):
# a journaled batch notifies its producer's computation (or injected stream), a quiet report its
# computation, and a ``meta`` row (a stop, a new driver) everyone. In triggers, so that no commit
# pays a round trip for it; a notification is delivered when its transaction commits.
WAKE_UPS = [
    """CREATE OR REPLACE FUNCTION headrace_wake() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF TG_TABLE_NAME = 'batches' THEN
        PERFORM pg_notify('hr_' || md5(regexp_replace(NEW.producer, '/[0-9]+$', '')), '');
      ELSIF TG_TABLE_NAME = 'interval_groups' THEN
        PERFORM pg_notify('hr_' || md5(NEW.computation), '');
      ELSE
        PERFORM pg_notify('hr_meta', NEW.name);
      END IF;
      RETURN NULL;
    END $$""",
    "DROP TRIGGER IF EXISTS headrace_wake ON batches",
    "CREATE TRIGGER headrace_wake AFTER INSERT ON batches FOR EACH ROW EXECUTE FUNCTION headrace_wake()",
    "DROP TRIGGER IF EXISTS headrace_wake ON interval_groups",
    "CREATE TRIGGER headrace_wake AFTER INSERT OR UPDATE ON interval_groups FOR EACH ROW "
    "EXECUTE FUNCTION headrace_wake()",
    "DROP TRIGGER IF EXISTS headrace_wake ON meta",
    "CREATE TRIGGER headrace_wake AFTER INSERT OR UPDATE ON meta FOR EACH ROW EXECUTE FUNCTION headrace_wake()",
]
META_CHANNEL = "hr_meta"

# INDEX_PLANS. A writer's session (a worker, an injector, a driver) plans no sequential scan
# where an index serves. What it sends on its hot paths looks rows up by a key prefix (a
# producer's last batch written ``ORDER BY ... LIMIT 1``: MAX or MIN may be planned as a read of
# every row of the prefix), and the rest reads small tables (samples, events, meta, reports).
# Left to its statistics, the server plans from a table's size as last recorded (a trim's
# VACUUM, autovacuum), and keeps a prepared statement's generic plan until the next such record:
# the bus's tables grow from a few rows to thousands within seconds of a start, and a worker's
# read of its producers' heads, planned as a scan of the whole journal while it held a few
# rows, read 220-390 pages a pass (0.7-1.6 ms) instead of 27 (0.07 ms).

# ``INSERT INTO t[(columns)] VALUES (one row)[ ON CONFLICT …]``: its row repeated, for many rows
_ONE_ROW_INSERT = re.compile(r"^(INSERT INTO \w+(?:\s*\([^()]*\))?\s+VALUES\s*)(\([^()]*\))(.*)$", re.S)
# ``DELETE FROM t WHERE a = ? AND b < ? …``: each row's tests, a VALUES list's row joined to t
_CONJUNCTIVE_DELETE = re.compile(r"^DELETE FROM (\w+) WHERE (.+)$", re.S)
_COLUMN_TEST = re.compile(r"(\w+) (=|<|<=|>|>=) \?")
MAX_PARAMETERS = 30_000  # a statement's parameters (the protocol allows 65,535)
_WRITE = re.compile(r"^(INSERT|UPDATE|DELETE)\b")
MAX_HELD_BYTES = 64 << 20  # held writes' values in one statement (the server refuses a message past 1 GB)
_INLINED_KINDS = (type(None), bool, int, str)  # not float: a quoted 1.5 is numeric, a bound one double precision
MAX_INLINED_CHARS = 8_192  # a transaction's first statement's text parameters, quoted into its text
MAX_FIRST_PREPARED = 64  # first statements a session prepares by name (``_first_prepared``)
# after these psycopg deallocates every prepared statement of the session, ours too, if it had any of its own
_FLUSHES_PREPARED = ("DROP ", "ALTER ", "ROLLBACK", "DISCARD ALL", "DEALLOCATE ALL")


def _statement_of_many(sql: str, width: int) -> Callable[[int], str] | None:
    """For a statement of one row of ``width`` parameters, the statement of ``n`` rows, where it
    has one (``_ONE_ROW_INSERT``, ``_CONJUNCTIVE_DELETE``)."""
    insert = _ONE_ROW_INSERT.match(sql)
    if insert is not None and "?" not in insert.group(3):  # a parameter after the row: not repeatable
        head, row, tail = insert.groups()
        return lambda n: head + ", ".join([row] * n) + tail
    delete = _CONJUNCTIVE_DELETE.match(sql)
    tests = [_COLUMN_TEST.fullmatch(t.strip()) for t in delete.group(2).split(" AND ")] if delete else []
    if delete is None or len(tests) != width or any(t is None for t in tests):
        return None
    table = delete.group(1)
    columns = ", ".join(f"c{i}" for i in range(width))
    joined = " AND ".join(f"{table}.{t.group(1)} {t.group(2)} v.c{i}" for i, t in enumerate(tests) if t)
    row = "(" + ", ".join(["?"] * width) + ")"
    return lambda n: f"DELETE FROM {table} USING (VALUES {', '.join([row] * n)}) AS v({columns}) WHERE {joined}"


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (bytes, bytearray, memoryview, str)) else 8


def _with(carried: Sequence[tuple[str, Sequence[Any]]], sql: str) -> str:
    """``sql`` with the ``carried`` statements in front of it as data-modifying WITH clauses."""
    if not carried:
        return sql
    return "WITH " + ", ".join(f"held{i} AS ({text})" for i, (text, _) in enumerate(carried)) + " " + sql


def channel(name: str) -> str:
    """The notification channel of a producer's computation or injected stream (``C/3`` -> ``C``)."""
    base, slash, shard = name.rpartition("/")
    return "hr_" + hashlib.md5((base if slash and shard.isdigit() else name).encode()).hexdigest()


class PostgresStore(SQLStore):
    """``postgresql://user[:password]@host[:port]/database[?libpq options]``."""

    BEGIN_WRITE = "BEGIN"
    BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
    FOR_SHARE = " FOR SHARE"
    FOR_UPDATE = " FOR UPDATE"
    GREATEST = "GREATEST"

    def __init__(self, url: str, *, failpoint: Failpoint | None = None, clock: Callable[[], int] | None = None,
                 name: str | None = None, read_only: bool = False):
        import psycopg
        from psycopg import pq

        self.url, self.failpoint = url, failpoint
        if clock is not None:
            self.clock = clock
        self._listening: set[str] = set()
        self._woken = False
        self._idle = pq.TransactionStatus.IDLE
        self._sql: dict[str, str] = {}
        self._held: list[tuple[str, Sequence[Any]]] | None = None  # writes held by _together
        self._held_params = self._held_bytes = 0  # their parameters' count and size, kept as they are held
        self._begun: list[str] | None = None  # a BEGIN held by _begin (and a lock after it), to go with the next statement
        self._first: dict[str, str | None] = {}  # a first statement's text: its prepared name (None: not preparable)
        try:
            # ``name``: who this connection is, as pg_stat_activity and the server's log show it
            # (a URL's own application_name wins)
            conninfo = url if not name or "application_name" in url else psycopg.conninfo.make_conninfo(
                url, application_name=name)
            # raw queries (``$1`` placeholders): psycopg parses a query with ``%s`` ones at every
            # execution once it is longer than 4 kB, and a commit's rows make several that long
            self._db = psycopg.connect(conninfo, autocommit=True, connect_timeout=30,
                                       cursor_factory=psycopg.RawCursor)
        except (psycopg.OperationalError, psycopg.ProgrammingError) as e:
            # libpq may quote the connection string it could not parse: redact what it says too
            reason = redact_url(' '.join(str(e).split()))
            raise StoreError(f"Cannot connect to the PostgreSQL store: {reason}", got=redact_url(url),
                             hint="start the server and check host, port, user and database in the URL") from None
        self._quoter = psycopg.ClientCursor(self._db)  # quotes parameters into a statement's text
        try:
            if read_only:  # a tool that only reads: the server refuses any write of this session
                self._x("SET default_transaction_read_only = on")
            else:
                self._x("SET enable_seqscan = off")  # see INDEX_PLANS
            check_schema(self, read_only)
        except BaseException:
            self._db.close()
            raise
        self._db.add_notify_handler(self._on_notify)

    def _table_columns(self) -> dict[str, set[str]]:
        tables: dict[str, set[str]] = {}
        for table, column in self._all("SELECT table_name, column_name FROM information_schema.columns "
                                       "WHERE table_schema = current_schema()"):
            tables.setdefault(str(table), set()).add(str(column))
        return tables

    def _lock_schema(self) -> None:
        self._x("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))

    def _create_schema(self) -> None:
        # only when a table or the version is missing: CREATE INDEX IF NOT EXISTS would queue behind every open commit
        self._send_begin()  # the schema lock's statement has sent it already; a guard, should the order change
        for statement in [*schema_statements("postgresql"), *WAKE_UPS]:
            self._db.execute(statement)
        self._first.clear()  # its DROPs may have deallocated them (_FLUSHES_PREPARED)

    def _begin(self, begin: str) -> None:
        """Held, to go out in one message with the transaction's first statement (``_x``): a pass's
        commit begins with a read of its intervals' rows, and its ``BEGIN`` was a round trip of
        its own, 8 % of a worker's time at 2,000 records/s."""
        self._begun = [begin]

    def _send_begin(self) -> None:
        """A held ``BEGIN`` on its own, before a statement that cannot carry it."""
        if self._begun is not None:
            begun, self._begun = self._begun, None
            self._db.execute("; ".join(begun))

    def _with_begin(self, sql: str, params: Sequence[Any]) -> Any:
        """``sql`` after the held ``BEGIN`` (and a lock, ``_lock_producer``), in one message (the
        simple query protocol, its parameters quoted into its text), where its parameters are few
        and plain; else None and nothing sent. The server arms
        ``idle_in_transaction_session_timeout`` once it has answered them all, as after any
        statement. The statement runs by name where the session has prepared it
        (``_first_prepared``), so that the server does not plan it each time (a pass's check of its
        intervals' rows: 94 µs of the server's CPU); else as text, planned afresh."""
        import psycopg

        if self._held:
            return None
        items = [item for param in params for item in (param if isinstance(param, list) else (param,))]
        if any(type(item) not in _INLINED_KINDS for item in items) or sum(map(_size, items)) > MAX_INLINED_CHARS:
            return None
        begun, self._begun = self._begun or [], None
        begin = "; ".join(begun)
        name = self._first_prepared(sql)
        if name is not None:
            arguments = f"({self._quoter.mogrify(', '.join(['%s'] * len(params)), params)})" if params else ""
            try:
                cur = self._db.execute(f"{begin}; EXECUTE {name}{arguments}", prepare=False)
                for _ in begun:
                    cur.nextset()  # past the BEGIN's result (and a lock's), to the statement's
                return cur
            except psycopg.errors.InvalidSqlStatementName:  # deallocated behind our back: its transaction failed at once
                self._db.execute("ROLLBACK")
                self._first.clear()
        text = self._quoter.mogrify(sql.replace("%", "%%").replace("?", "%s"), params)
        cur = self._db.execute(f"{begin}; {text}", prepare=False)  # prepared, it could hold one statement only
        for _ in begun:
            cur.nextset()
        return cur

    def _first_prepared(self, sql: str) -> str | None:
        """The name under which this session prepared ``sql``, a transaction's first statement,
        preparing it on its first use (outside any transaction); None for a statement the server
        cannot prepare (``SET``, a parameter of no type), or past ``MAX_FIRST_PREPARED`` of them.
        The name is the text's: a statement prepared again after psycopg may have deallocated them
        all (``_FLUSHES_PREPARED``) is found where it did not."""
        import psycopg

        if sql in self._first:
            return self._first[sql]
        if len(self._first) >= MAX_FIRST_PREPARED:
            return None
        name: str | None = "headrace_" + hashlib.md5(sql.encode()).hexdigest()[:24]
        try:
            self._db.execute(f"PREPARE {name} AS {self._translate(sql)}", prepare=False)
        except psycopg.errors.DuplicatePreparedStatement:
            pass  # it outlived the last rollback: psycopg deallocates only once it has prepared some of its own
        except (psycopg.ProgrammingError, psycopg.NotSupportedError):  # not a statement PREPARE takes, a parameter of no type
            name = None
        self._first[sql] = name
        return name

    def _x(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if self._begun is not None and sql in ("COMMIT", "ROLLBACK"):  # the transaction sent nothing: nothing to end
            self._begun = None
            return None
        if sql.startswith(_FLUSHES_PREPARED):  # (a COMMIT of a failed transaction is one too: _with_begin's fallback covers it)
            self._first.clear()
        if self._begun is not None:
            cur = self._with_begin(sql, params)
            if cur is not None:
                return cur
            self._send_begin()
        if self._held:  # a write carries the held ones as WITH clauses of its own statement; a read goes after them
            if _WRITE.match(sql) and self._fits(params, sum(map(_size, params))):
                held = self._take_held()
                return self._db.execute(self._translate(_with(held, sql), cache=False),
                                        [x for _, p in held for x in p] + list(params))
            self._send_held()
        return self._db.execute(self._translate(sql), params)

    @contextmanager
    def _together(self) -> Iterator[None]:
        """Hold the writes of ``_write`` and ``_xmany`` and send them as data-modifying WITH clauses of one statement: of
        the next ``_x`` write, whose result (its row count) is then its own, or at the block's end.
        A commit's writes go out as two round trips instead of some twelve. Each clause sees the
        transaction as it was before the statement, not the other clauses' rows, so the writes of
        one block must touch no row twice, and the one ``_x`` write in a commit's block, the
        versions' ``UPDATE`` (``_advance_versions``), reads no row they write."""
        if self._held is not None:
            yield
            return
        self._held = []
        try:
            yield
            self._send_held()
        finally:
            self._take_held()
            self._held = None

    def _fits(self, params: Sequence[Any], size: int) -> bool:
        """Whether ``params`` (of ``size`` bytes) fit in one statement with the held writes' (parameters,
        and bytes: the server refuses a message past 1 GB, and a pass's segments may be large)."""
        return self._held_params + len(params) <= MAX_PARAMETERS and self._held_bytes + size <= MAX_HELD_BYTES

    def _write(self, sql: str, params: Sequence[Any]) -> None:
        """A write whose result nobody reads: held in a ``_together`` block, else sent now."""
        if self._held is None:
            self._x(sql, params)
            return
        size = sum(map(_size, params))
        if not self._fits(params, size):
            self._send_held()
        self._held.append((sql, params))
        self._held_params += len(params)
        self._held_bytes += size

    def _take_held(self) -> list[tuple[str, Sequence[Any]]]:
        """The held writes, handed over; none held after."""
        held, self._held = self._held or [], []
        self._held_params = self._held_bytes = 0
        return held

    def _send_held(self) -> None:
        if not self._held:
            return
        held = self._take_held()
        self._send_begin()
        *carried, (last, _) = held
        self._db.execute(self._translate(_with(carried, last), cache=False), [x for _, p in held for x in p])

    def _xmany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """``sql`` once per row. An ``INSERT … VALUES (?, …)`` goes as one statement of many rows
        (so no two rows may update one row ``ON CONFLICT``), and a ``DELETE FROM t WHERE a = ? AND
        b < ? …`` as one joined to a ``VALUES`` list of them: a statement is a round trip, and
        psycopg's executemany (pipeline mode) costs 0.2-0.4 ms even for a few rows. Worse, after a
        pipeline the server arms no idle-transaction timer (``limit_idle_transactions``) until the
        next plain statement, so a writer stopped right after one held its row locks for as long as
        it was silent: executemany only for what neither form fits."""
        if len(rows) == 1:  # executemany's pipeline costs a round trip of its own: 130 µs instead of 80
            self._write(sql, rows[0])
        elif rows:
            statement = _statement_of_many(sql, len(rows[0]))
            if statement is None:
                if self._held:
                    self._send_held()
                self._send_begin()
                with self._db.cursor() as cur:
                    cur.executemany(self._translate(sql), rows)
                return
            per = max(1, MAX_PARAMETERS // len(rows[0]))
            for at in range(0, len(rows), per):
                chunk = rows[at:at + per]
                self._write(statement(len(chunk)), [x for r in chunk for x in r])

    def _translate(self, sql: str, cache: bool = True) -> str:
        """The shared queries use ``?``; PostgreSQL's own placeholders are ``$1``, ``$2``, …
        (``cache``: keep the text for the next time; not a commit's held writes, nearly every pass's
        its own)."""
        out = self._sql.get(sql)
        if out is None:
            parts = sql.split("?")
            out = parts[0] + "".join(f"${n}{part}" for n, part in enumerate(parts[1:], 1))
            if cache and len(out) < 50_000 and len(self._sql) < 5_000:  # a statement of many rows is a text per row count
                self._sql[sql] = out
        return out

    def _in_transaction(self) -> bool:
        return self._begun is not None or self._db.info.transaction_status != self._idle

    def _reclaim(self) -> None:
        """VACUUM the bus's tables after a trim, so the next writes reuse the space its deletes
        freed. Autovacuum visits a database once a minute and a table once a fifth of it is dead,
        so a bus whose replay window is a minute otherwise carries up to a window of dead rows and
        their TOAST beside the live ones (the 20-minute soak's database: 1.16x of minute five). A
        plain VACUUM blocks no writer; SKIP_LOCKED passes a table another vacuum holds."""
        if not self._in_transaction():  # VACUUM cannot run inside a transaction block
            self._x("VACUUM (SKIP_LOCKED) segments, routes, batches")

    def _in_list(self, column: str, values: list[Any]) -> tuple[str, Any]:
        if values and all(isinstance(v, int) for v in values):
            # psycopg sends small ints as integer[]; bigint = ANY(integer[]) cannot be hashed, so a filter
            # tests each row against the whole array (100,000 intervals: 12 s instead of 0.1 s)
            return f"{column} = ANY(?::bigint[])", list(values)
        return f"{column} = ANY(?)", list(values)

    def _values(self, column: str, values: list[str]) -> tuple[str, Any]:
        return f"unnest(?::text[]) AS v({column})", list(values)

    def _records(self, columns: str, rows: Sequence[Sequence[Any]]) -> tuple[str, Any]:
        names = [c.split()[0] for c in columns.split(",")]
        return f"jsonb_to_recordset(?::jsonb) AS v({columns})", json.dumps([dict(zip(names, r)) for r in rows])

    def _in_row_list(self, column: str, values: str) -> str:
        return f"{column} = ANY({values})"

    def _per_range(self, ranges: str, rows: str, condition: str) -> str:
        # a lateral subquery the planner may not flatten (OFFSET 0): an index lookup per range. A
        # plain join is planned as a hash join over every row of the table that matches the
        # condition's constant part (jsonb_to_recordset is estimated at 100 rows, fresh tables at a
        # few): a worker's read of its routed segments took 2-6 ms, growing with the routes kept
        alias = rows.split()[-1]
        return f"{ranges} CROSS JOIN LATERAL (SELECT * FROM {rows} WHERE {condition} OFFSET 0) {alias}"

    def _latest_batch(self, producer: str, alias: str, join: str = "JOIN") -> str:
        # the row itself, by the index backwards: planned as a join, the journal is hashed whole
        # whenever the server's size for it is stale (INDEX_PLANS), and MAX(batch) reads every
        # batch of the producer forwards once sequential scans are off
        return (f"{join} LATERAL (SELECT * FROM batches WHERE producer = {producer} "
                f"ORDER BY batch DESC LIMIT 1) {alias} ON TRUE")

    def _on_notify(self, _: Any) -> None:
        self._woken = True

    def wait_for_commits(self, channels: Sequence[str], timeout_s: float) -> bool:
        """Sleep until a producer of one of ``channels`` (producer names) commits, a ``meta`` row
        changes, or ``timeout_s`` passes: no statement is sent while it sleeps. True if woken."""
        wanted = {channel(c) for c in channels} | {META_CHANNEL}
        new = sorted(wanted - self._listening)
        for name in new:
            self._db.execute(f'LISTEN "{name}"')
            self._listening.add(name)
        if new:  # a commit before the LISTEN notified nobody: the caller looks once, from now on it is told
            return True
        if not self._woken:  # else a notification arrived while other statements ran
            pgconn = self._db.pgconn
            if select.select([pgconn.socket], [], [], max(0.0, timeout_s))[0]:
                pgconn.consume_input()
                while pgconn.notifies() is not None:
                    self._woken = True
        woken, self._woken = self._woken, False
        return woken

    def _lock_producer(self, producer: str) -> None:
        """The producer's lock for this transaction. Right after its ``BEGIN`` it waits to go in one
        message with them and the statement after it (a producer's last batch: a round trip of its
        own before), which then reads once the lock is granted: READ COMMITTED takes a snapshot per
        statement, also within one message."""
        if self._begun is not None and not self._held:
            self._begun.append(self._quoter.mogrify("SELECT pg_advisory_xact_lock(hashtext(%s))", (producer,)))
        else:
            self._x("SELECT pg_advisory_xact_lock(hashtext(?))", (producer,))

    def limit_idle_transactions(self, idle_ms: int) -> None:
        """Have the server end this connection, rolling its transaction back, once the client has
        sent nothing for ``idle_ms`` inside a transaction: a client cut off from the server in the
        middle of a commit then holds its row locks (its shards', the computation's counters) that
        long, not for as long as its network is down (``idle_in_transaction_session_timeout``)."""
        self._x("SELECT set_config('idle_in_transaction_session_timeout', ?, false)", (str(idle_ms),))

    @property
    def shown_url(self) -> str:
        return redact_url(self.url)

    def close(self) -> None:
        self._db.close()
