"""Lite topic names: the naming rule, and the append-only file that binds names to ids.

A lite topic is known inside the store by a small integer id (its slot in the
in-memory table, :mod:`storage.lite.table`) and a generation: an id freed by expiry is
given again with the next generation, so index entries of the topic that held it before
are told apart from the new topic's. The file ``names`` records, in order:

* ``P``: a parent topic's id and name;
* ``b``: id, generation, parent id, lite topic name and *where*: a lite topic is
  created (an incarnation of its name begins);
* ``d``: id, generation and *where*: that lite topic is deleted (by hand or expired).

*Where* is a CommitLog position, the same on every member of a group: the offset of the
record that created or deleted the topic (its first lite message, the subscription or
the delete record), or for an expiry (a member's own decision) the CommitLog offset up
to which its store had applied the log when it expired it. Replaying a consumer state
record after a crash uses them to tell which incarnation of a name the record meant
(:mod:`storage.lite.store`). Files written before positions were kept hold ``B`` and
``D`` records instead (no *where*): they read as created before any record a replay
meets.

Each record is ``>BIIIH`` (kind, id, generation, parent id, name length), the UTF-8
name, and for ``b`` and ``d`` a ``>q`` position. Records are written with ``os.write``
before the index entries that use them, so a killed process keeps them (the page cache
survives it); ``flush`` fsyncs. A torn last record (power lost mid-write) is cut off at
open. A power loss may cut whole records off too while the index entries of their
topics survive: the lite store binds those topics again at open from their CommitLog
records; and it fsyncs the file before creating a topic after a delete, so no power
loss keeps the new topic and loses the delete.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path

from .errors import IllegalLiteTopicError

MAX_NAME_LEN = 128
NAME_RE = re.compile(r"[A-Za-z0-9_.:@=-]{1,128}")
"""Letters, digits and ``_ . : @ = -``, 1 to 128 characters (a session id, a UUID, an
agent's path like ``planner.step-3``, a tenant key like ``tenant=acme``)."""

REC = struct.Struct(">BIIIH")
AT = struct.Struct(">q")
PARENT, BIND, DELETE = b"P"[0], b"b"[0], b"d"[0]
OLD_BIND, OLD_DELETE = b"B"[0], b"D"[0]
"""The records of files written before positions were kept (read, never written)."""
_KINDS = {PARENT: PARENT, BIND: BIND, DELETE: DELETE, OLD_BIND: BIND, OLD_DELETE: DELETE}
NOWHERE = -1
"""The position an old record reads with: before any CommitLog record."""


_VALID: set[str] = set()
"""Names found legal lately (a str's, matched once): a send to a lite topic it named
before costs a set lookup, not a regular expression's match."""
_VALID_MOST = 1 << 16


def validate_lite_name(name: object) -> str:
    """``name`` if it is a legal lite topic name, else :class:`IllegalLiteTopicError`."""
    if name.__class__ is str and name in _VALID:
        return name  # type: ignore[return-value]
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        shown = name if not isinstance(name, str) or len(name) <= 160 else name[:160] + "..."
        raise IllegalLiteTopicError(
            f"lite topic {shown!r}: must be 1 to {MAX_NAME_LEN} characters of letters, "
            "digits and _ . : @ = -"
        )
    if name.__class__ is str:  # a subclass's value could change its hash or equality
        if len(_VALID) >= _VALID_MOST:
            _VALID.clear()
        _VALID.add(name)
    return name


def encode(kind: int, lid: int, gen: int, pid: int, name: str = "", at: int = NOWHERE) -> bytes:
    """One record; ``at``: the position of a ``b`` or ``d`` record."""
    raw = name.encode("utf-8")
    head = REC.pack(kind, lid, gen, pid, len(raw)) + raw
    return head + AT.pack(at) if kind != PARENT else head


class NameLog:
    """The ``names`` file: read whole at open, appended to after."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records = 0  # records in the file (what a compaction would drop shows here)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)

    def read(self) -> Iterator[tuple[int, int, int, int, str, int]]:
        """Every whole record as (kind, id, generation, parent id, name, position), the
        kinds of old files read as the new (``B`` as ``b``, ``D`` as ``d``, position
        :data:`NOWHERE`); a torn tail is truncated away."""
        data = self.path.read_bytes()
        pos, end, size = 0, len(data), REC.size
        unpack, unpack_at = REC.unpack_from, AT.unpack_from
        n = 0
        while pos + size <= end:
            raw_kind, lid, gen, pid, length = unpack(data, pos)
            kind = _KINDS.get(raw_kind)
            extra = AT.size if raw_kind in (BIND, DELETE) else 0
            if kind is None or pos + size + length + extra > end:
                break
            name = data[pos + size : pos + size + length].decode("utf-8") if length else ""
            at = unpack_at(data, pos + size + length)[0] if extra else NOWHERE
            pos += size + length + extra
            n += 1
            yield kind, lid, gen, pid, name, at
        self.records = n
        if pos != end:
            os.truncate(self.path, pos)

    def write(self, data: bytes) -> None:
        if data:
            os.write(self._fd, data)

    def count(self, records: int) -> None:
        self.records += records

    def replace(self, data: bytes, records: int) -> None:
        """Rewrite the file as ``data`` (a compaction), atomically."""
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self.records = records

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
