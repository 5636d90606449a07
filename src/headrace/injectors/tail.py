"""``files()``: the lines of the files in a directory, tailed.

Files are known by their path under the directory (``a/1.jsonl`` and ``b/1.jsonl`` are two files)
and read from where the last published batch stopped: the resume point is, per file, the byte
offset and the number of records taken, so lines appended after a file was first read are
injected, exactly once across restarts (the offsets are published in the same transaction as the
records). A file is the same file while its inode and its first bytes are; one replaced under an
old name (or truncated) starts again from its beginning, under a new generation so its record ids
(``<path>:<n>``, then ``<path>#<generation>:<n>``) never repeat an old file's. A line that cannot
be decoded, parsed or stamped goes to the stream's dead-letter stream naming file and line.

Unbounded, only complete lines (ending in a newline) are taken: a line still being written waits.
A CSV file's header is its first line; a quoted field spanning lines is not supported.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import json
import os
import stat
import time
from typing import Any, Callable, Iterator

from ..errors import OptionError
from ..model import END_OF_TIME
from . import InjectedBatch, Injector

__all__ = ["FilesInjector"]

HEAD = 64  # bytes of a file's beginning that tell it from another file under the same path
MAX_BATCH_BYTES = 4 << 20  # one batch reads at most this much of one file


_HEADER = object()


class _Bad(Exception):
    pass


class FilesInjector(Injector):
    """See the module docstring; ``injectors.files`` makes one."""

    def __init__(self, path: str, format: str, stamp: Callable[[Any], int], bounded: bool, pattern: str,
                 poll_s: float, clock: Callable[[], int]):
        if format not in ("jsonl", "csv", "text"):
            raise OptionError("Unknown file format", got=format, hint="use format='jsonl', 'csv' or 'text'")
        self.path, self.format, self.pattern, self.poll_s = path, format, pattern, poll_s
        self.bounded = bounded
        self._clock = clock
        self._ts = stamp

    # -- resume state: {"files": {path: [offset, records, lines, inode, head length, head hash, generation,
    #    csv header or None]}, "gen": next generation} ----------------------------------------------

    def _load(self, resume: str | None) -> tuple[dict[str, list[Any]], int, set[str]]:
        if not resume:
            return {}, 1, set()
        state = json.loads(resume)
        if isinstance(state, list):  # the old format: basenames of files read whole
            return {}, 1, set(state)
        return state["files"], state["gen"], set()

    def batches(self, resume: str | None) -> Iterator[InjectedBatch]:
        files, gen, legacy = self._load(resume)
        if not os.path.isdir(self.path):
            # without this a mistyped path was an empty stream: a bounded one ended at once, silently
            raise OptionError("files() reads a directory that does not exist", got=self.path,
                              hint="create it first, or fix the path")

        def checkpoint() -> str:
            return json.dumps({"files": files, "gen": gen}, sort_keys=True)

        while True:
            stats = {}
            for p in glob.glob(os.path.join(self.path, self.pattern)):
                try:  # a file may go between the listing and the look (rotation)
                    st = os.stat(p)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    stats[p] = st
            pending: list[tuple[str, str]] = []
            for p in sorted(stats, key=lambda p: (stats[p].st_mtime, p)):
                rel = os.path.relpath(p, self.path)
                entry = files.get(rel)
                if entry is None or not self._same_file(p, stats[p], entry):
                    if entry is None and os.path.basename(p) in legacy:
                        entry = files[rel] = self._read_whole(p)
                    else:
                        entry = files[rel] = [0, 0, 0, stats[p].st_ino, 0, "", 0 if entry is None else gen, None]
                        gen += 0 if entry[6] == 0 else 1
                if stats[p].st_size > entry[0]:
                    pending.append((p, rel))
            for i, (p, rel) in enumerate(pending):
                while True:
                    records, dead, more = self._read(p, rel, files[rel])
                    rest = pending[i + (0 if more else 1):]
                    # MillWheel Figure 10: the oldest creation time among files not yet read through
                    watermark = min((int(stats[q].st_mtime * 1000) for q, _ in rest), default=self._clock())
                    if records or dead or more:
                        yield InjectedBatch(records, watermark, checkpoint(), dead)
                    if not more:
                        break
            if self.bounded:
                yield InjectedBatch([], END_OF_TIME, checkpoint())
                return
            yield InjectedBatch([], self._clock(), checkpoint())
            time.sleep(self.poll_s)

    def _same_file(self, path: str, st: os.stat_result, entry: list[Any]) -> bool:
        if st.st_ino != entry[3] or st.st_size < entry[0]:
            return False
        if entry[4] == 0:
            return True
        try:
            with open(path, "rb") as f:
                return hashlib.sha1(f.read(entry[4])).hexdigest() == entry[5]
        except OSError:  # gone since: nothing to read of it now
            return True

    def _read_whole(self, path: str) -> list[Any]:
        """A file the old resume format says was read whole: where its reading stopped."""
        entry = [0, 0, 0, os.stat(path).st_ino, 0, "", 0, None]
        with open(path, "rb") as f:
            data = f.read()
        entry[0], entry[2] = len(data), data.count(b"\n")
        lines = [line for line in data.splitlines() if line.strip()]
        entry[1] = len(lines) - (self.format == "csv" and bool(lines))
        if self.format == "csv" and lines:
            entry[7] = next(csv.reader([lines[0].decode("utf-8", "replace")]))
        entry[4] = head = min(HEAD, len(data))
        entry[5] = hashlib.sha1(data[:head]).hexdigest()
        return entry

    def _read(self, path: str, rel: str, entry: list[Any]) -> tuple[list[Any], list[Any], bool]:
        """The next records of one file (and its bad lines), and whether more is left to read now."""
        try:
            f = open(path, "rb")
        except OSError:  # gone since it was listed: what it had unread is lost with it
            return [], [], False
        with f:
            f.seek(entry[0])
            data = f.read(MAX_BATCH_BYTES + 1)
            if entry[4] < HEAD:
                f.seek(0)
                head = f.read(HEAD)
                entry[4], entry[5] = len(head), hashlib.sha1(head).hexdigest()
        more = len(data) > MAX_BATCH_BYTES
        data = data[:MAX_BATCH_BYTES]
        end = data.rfind(b"\n") + 1
        if not more and self.bounded:
            end = len(data)  # a bounded file is complete: its last line needs no newline
        elif end == 0:  # not one complete line yet
            return [], [], False
        records: list[Any] = []
        dead: list[Any] = []
        prefix = rel if entry[6] == 0 else f"{rel}#{entry[6]}"
        lines = data[:end].split(b"\n")  # not splitlines: a lone "\r" inside a line is no line break
        if lines[-1] == b"":
            lines.pop()
        for raw in lines:
            entry[2] += 1
            if not raw.strip():
                continue
            rid = f"{prefix}:{entry[1]}"
            try:
                value = self._parse(raw, entry)
                if value is _HEADER:
                    continue
                try:
                    stamp = self._ts(value)
                except Exception as exc:
                    raise _Bad(f"{type(exc).__name__}: {exc}") from None
                records.append((value, stamp, rid))
            except _Bad as bad:
                dead.append(({"file": rel, "line": entry[2], "error": str(bad), "text": raw}, self._clock(), rid))
            entry[1] += 1
        entry[0] += end
        return records, dead, more

    def _parse(self, raw: bytes, entry: list[Any]) -> Any:
        """A line's value (``_HEADER`` for a CSV header), or ``_Bad`` saying why it has none."""
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as exc:
            raise _Bad(f"UnicodeDecodeError: {exc}") from None
        if self.format == "text":
            return line
        if self.format == "jsonl":
            try:
                return json.loads(line)
            except ValueError as exc:
                raise _Bad(f"{type(exc).__name__}: {exc}") from None
        row = next(csv.reader([line]))
        if entry[7] is None:
            entry[7] = row  # the header: no record
            return _HEADER
        if len(row) > len(entry[7]):
            raise _Bad(f"{len(row)} fields under a header of {len(entry[7])}")
        return dict(zip(entry[7], row + [None] * (len(entry[7]) - len(row))))
