"""What a put answers: one batch's outcome as arrays, and a list view of it.

A batch of a thousand messages is stored in a few microseconds a message; building
a :class:`~storage.message.PutResult` for each (a tuple and an offset message id)
cost about as much again. So the store keeps a batch's outcome as arrays
(:class:`PutBatchResult`, what the broker's path reads), and
:meth:`MessageStore.put_batch` answers :class:`PutResults`, which reads as the list
of ``PutResult`` it always returned but builds each only when it is read.

Invariant: ``PutResults(r)[i]`` is the ``PutResult`` of the batch's ``i``-th
message, equal to ``r.results()[i]``, whichever way it is reached (index, slice,
iteration, comparison).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, SupportsIndex, overload

import numpy as np

from . import codec
from .message import PutResult, PutStatus


@dataclass(slots=True, eq=False, repr=False)
class PutBatchResult:
    """The outcome of one batch put, kept as arrays (one object per batch, not per message)."""

    status: PutStatus
    topics: tuple[str, ...]
    topic_idx: np.ndarray
    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    commitlog_offsets: np.ndarray
    uniq_keys: Sequence[str]
    store_host: str

    def __len__(self) -> int:
        return len(self.queue_offsets)

    def _prefix(self) -> str:
        """The offset message id's first half: the store host's address in hex."""
        return codec.host_to_bytes(self.store_host).hex().upper()

    def result(self, i: int) -> PutResult:
        """The ``i``-th message's result (0 <= i < len)."""
        phys = int(self.commitlog_offsets[i])
        return PutResult(
            self.status,
            self.uniq_keys[i],
            int(self.queue_ids[i]),
            int(self.queue_offsets[i]),
            phys,
            f"{self._prefix()}{phys:016X}",
            self.topics[int(self.topic_idx[i])],
        )

    def results(self) -> list[PutResult]:
        prefix = self._prefix()
        topics = self.topics
        return [
            PutResult(self.status, uk, qid, qoff, phys, f"{prefix}{phys:016X}", topics[ti])
            for uk, qid, qoff, phys, ti in zip(
                self.uniq_keys,
                self.queue_ids.tolist(),
                self.queue_offsets.tolist(),
                self.commitlog_offsets.tolist(),
                self.topic_idx.tolist(),
            )
        ]


class PutResults(Sequence[PutResult]):
    """A batch's results as a read-only list of :class:`PutResult`, each built when read.

    Reads as the list :meth:`MessageStore.put_batch` returned before: ``len``,
    indexing (negative too), slicing (a ``list``), iteration, ``in``, equality with a
    list or another ``PutResults``, ``self + list``. A list extends with it in place
    (``results += store.put_batch(...)``), which is why there is no ``__radd__``
    (Python would take it for ``+=`` and build a new list): ``list + PutResults``
    raises as ``list + tuple`` does. Pickled, it travels as a plain list. Iterating, slicing or comparing builds the whole list once and keeps it;
    one index builds one result.
    """

    __slots__ = ("_batch", "_all")

    def __init__(self, batch: PutBatchResult) -> None:
        self._batch = batch
        self._all: list[PutResult] | None = None

    @property
    def batch(self) -> PutBatchResult:
        """The arrays the results are read from."""
        return self._batch

    def _list(self) -> list[PutResult]:
        if self._all is None:
            self._all = self._batch.results()
        return self._all

    def __len__(self) -> int:
        return len(self._batch)

    @overload
    def __getitem__(self, index: SupportsIndex) -> PutResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[PutResult]: ...

    def __getitem__(self, index: SupportsIndex | slice) -> PutResult | list[PutResult]:
        if isinstance(index, slice):
            return self._list()[index]
        if self._all is not None:
            return self._all[index]
        n = len(self._batch)
        i = index.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("put result index out of range")
        return self._batch.result(i)

    def __iter__(self) -> Iterator[PutResult]:
        return iter(self._list())

    def __reversed__(self) -> Iterator[PutResult]:
        return reversed(self._list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PutResults):
            return self._list() == other._list()
        if isinstance(other, list):
            return self._list() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Any) -> list[PutResult]:
        if isinstance(other, PutResults):
            other = other._list()
        if not isinstance(other, list):
            return NotImplemented
        return self._list() + other

    def __reduce__(self) -> Any:  # sent elsewhere (a Ray answer), it travels as the list
        return (list, (self._list(),))

    def __repr__(self) -> str:
        return repr(self._list())
