"""How a request of the framed protocol is declared (``actors.protocol.frames``).

A :class:`Request` says once what RocketMQ spreads over a ``RequestCode`` constant, a
``*RequestHeader`` class and the processor's switch: its code, the Ray method it stands
for (the client stub's attribute, the method the Ray path calls), its fields in that
method's order, each with its wire key and how its value crosses (a :class:`Codec`),
which field is the frame's body, how the answer crosses (an :class:`Answer`), which
coroutine serves it and the errors it may answer with. Both ends are derived from it:

* the client frames a call with :meth:`Request.encode` (``actors.protocol.data_path``),
  bound as the Ray method would bind it, and reads the answer with
  :attr:`Answer.read`;
* a server (``actors.broker.listener``, ``actors.coordinator.txn``) looks the code up
  in a :class:`Dispatch`, reads the fields back with :meth:`Request.decode` and calls
  the declared coroutine of its actor with them: the same the Ray method calls.

Nothing here is per message: one header dict per call, as before (a send's call is a
whole batch).
"""

from __future__ import annotations

import operator
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from actors.protocol.frames import FrameError
from storage.errors import RayMQError


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""A field's default when the call must give it."""


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True, slots=True)
class Codec:
    """How a field's value crosses: ``to_wire`` on the client (into msgpack's types; not
    called for None), ``from_wire`` on the server (back to what the processor takes,
    None too; a malformed value raises :class:`~actors.protocol.frames.FrameError`, a
    wrong one is left to the processor's own checks, which name it)."""

    to_wire: Callable[[Any], Any] = _same
    from_wire: Callable[[Any], Any] = _same


PLAIN = Codec()
"""Crosses as it is (msgpack's own types; the processor checks it)."""


@dataclass(frozen=True, slots=True)
class Field:
    """One argument of a request: ``name`` as the Ray method calls it, ``key`` in the
    frame's header (None: the frame's body). ``omit``: left out of the header when
    empty or None (the server reads the default). ``keyword``: keyword-only."""

    name: str
    key: str | None
    codec: Codec = PLAIN
    default: Any = REQUIRED
    omit: bool = False
    keyword: bool = False


def body(name: str) -> Field:
    """The field carried as the frame's body (bytes, a buffer, a ``uint8`` array)."""
    return Field(name, None)


Reply = tuple[dict[str, Any], list[Any]]


@dataclass(frozen=True, slots=True)
class Answer:
    """How an answer crosses: ``reply`` turns what the serving coroutine returned into
    the response's header fields and body parts; ``read`` turns them back on the client
    (the response header and body) into what the Ray method would have returned."""

    reply: Callable[[Any], Reply]
    read: Callable[[Mapping[str, Any], Any], Any]


def _reply_result(result: Any) -> Reply:
    return {"r": result}, []


def _read_result(h: Mapping[str, Any], body: Any) -> Any:
    return h.get("r")


def _reply_nothing(result: Any) -> Reply:
    return {}, []


def _read_nothing(h: Mapping[str, Any], body: Any) -> None:
    return None


def _reply_body(result: Any) -> Reply:
    return {}, [result]


def _read_body(h: Mapping[str, Any], body: Any) -> Any:
    return body


RESULT = Answer(_reply_result, _read_result)
"""The result in the header (``"r"``), as msgpack carries it."""
NOTHING = Answer(_reply_nothing, _read_nothing)
"""No result (the Ray method answers None)."""
BODY = Answer(_reply_body, _read_body)
"""The result is bytes, answered as the frame's body, not copied into the header."""


def result_as(convert: Callable[[Any], Any]) -> Answer:
    """:data:`RESULT`, read back through ``convert`` (a tuple msgpack made a list)."""

    def read(h: Mapping[str, Any], body: Any) -> Any:
        r = h.get("r")
        return None if r is None else convert(r)

    return Answer(_reply_result, read)


Encoded = tuple[dict[str, Any], list[Any], Callable[[Mapping[str, Any], Any], Any]]


@dataclass(frozen=True)
class Request:
    """One request of the framed protocol, declared once (see the module's docstring).

    ``method``: the Ray method the request stands for; ``served_by``: (the attribute
    holding the processor, the processor's coroutine) that is that Ray method: the
    broker's ``Broker`` gets ``method`` from it (``actors.broker.broker``), and its
    socket serves the request with it unless ``serve`` names another coroutine, as
    attribute names from the server's actor ("popper.pop_packed"; without either, the
    server's ``method`` itself); ``ordered``: whether it must reach the broker after
    the calls made before it through Ray (a send) or takes the socket at once (a read
    the broker may hold); ``errors``: what it may answer with besides a broken
    connection (the client raises the same type).
    """

    name: str
    code: int
    method: str
    fields: tuple[Field, ...]
    answer: Answer = RESULT
    serve: str | None = None
    served_by: tuple[str, str] | None = None
    ordered: bool = True
    errors: tuple[type[RayMQError], ...] = ()
    doc: str = ""
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _positional: int = field(init=False, repr=False, compare=False)
    _defaults: tuple[Any, ...] = field(init=False, repr=False, compare=False)
    _plan: tuple[tuple[str | None, Any, bool], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: a field named twice in {names}")
        keys = [f.key for f in self.fields if f.key is not None]
        if len(set(keys)) != len(keys) or {"c", "o", "f", "v"} & set(keys):
            raise ValueError(f"{self.name}: wire keys {keys} repeat or take the frame's own")
        if sum(f.key is None for f in self.fields) > 1:
            raise ValueError(f"{self.name}: one body at most")
        positional = [f for f in self.fields if not f.keyword]
        if positional != list(self.fields[: len(positional)]):
            raise ValueError(f"{self.name}: keyword-only fields come last")
        if self.served_by is not None and (
            len(self.served_by) != 2 or not all(n.isidentifier() for n in self.served_by)
        ):
            raise ValueError(
                f"{self.name}: served_by {self.served_by!r} is not (attribute, method)"
            )
        object.__setattr__(self, "_index", {n: i for i, n in enumerate(names)})
        object.__setattr__(self, "_positional", len(positional))
        object.__setattr__(self, "_defaults", tuple(f.default for f in self.fields))
        # per field: its key (None: the body), its to_wire (None: as it is), omit
        plan = tuple(
            (f.key, None if f.codec.to_wire is _same else f.codec.to_wire, f.omit)
            for f in self.fields
        )
        object.__setattr__(self, "_plan", plan)

    @property
    def serving(self) -> str:
        """The coroutine serving the request on the socket, as attribute names from the
        server's actor ("popper.pop_packed")."""
        if self.serve is not None:
            return self.serve
        return ".".join(self.served_by) if self.served_by is not None else self.method

    # ------------------------------------------------------------ the client's side
    def encode(self, *args: Any, **kwargs: Any) -> Encoded:
        """The call ``method(*args, **kwargs)`` as a frame: (header, body parts, how to
        read the answer). Binds its arguments as the Ray method would (a TypeError for
        a call it would refuse). A send's path: one dict per call, no object per field."""
        values = args if not kwargs and len(args) == len(self.fields) else self._bind(args, kwargs)
        header: dict[str, Any] = {"c": self.code}
        parts: list[Any] = []
        for (key, to_wire, omit), value in zip(self._plan, values):
            if key is None:
                parts.append(value)
            elif value is None or to_wire is None:
                if not (omit and not value):
                    header[key] = value
            elif not (omit and not value):
                header[key] = to_wire(value)
        return header, parts, self.answer.read

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        if len(args) > self._positional:
            raise TypeError(
                f"{self.method}() takes {self._positional} positional arguments "
                f"but {len(args)} were given"
            )
        values = [*args, *self._defaults[len(args) :]]
        for key, value in kwargs.items():
            i = self._index.get(key)
            if i is None or i < len(args):
                why = "an unexpected" if i is None else "multiple values for"
                raise TypeError(f"{self.method}() got {why} argument {key!r}")
            values[i] = value
        for f, value in zip(self.fields, values):
            if value is REQUIRED:
                raise TypeError(f"{self.method}() missing required argument {f.name!r}")
        return values

    # ------------------------------------------------------------ the server's side
    def decode(self, h: Mapping[str, Any], body: Any) -> tuple[list[Any], dict[str, Any]]:
        """A request's header and body as the serving coroutine's (args, kwargs). A
        field the frame left out is its default (None for a required one: the
        processor's own checks name it)."""
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for f in self.fields:
            if f.key is None:
                value = body
            else:
                value = f.codec.from_wire(
                    h.get(f.key, None if f.default is REQUIRED else f.default)
                )
            if f.keyword:
                kwargs[f.name] = value
            else:
                args.append(value)
        return args, kwargs


Handler = Callable[..., Awaitable[Any]]


class Dispatch:
    """A server's table: request code -> (its declaration, the coroutine serving it),
    the coroutines found on ``target`` (the actor) by each declaration's ``serve``."""

    def __init__(self, target: object, requests: Iterable[Request]) -> None:
        self.table: dict[int, tuple[Request, Handler]] = {
            r.code: (r, operator.attrgetter(r.serving)(target)) for r in requests
        }

    async def __call__(self, code: int, h: Mapping[str, Any], body: Any) -> Reply:
        entry = self.table.get(code)
        if entry is None:
            raise FrameError(f"unknown request code {code}")
        request, serve = entry
        args, kwargs = request.decode(h, body)
        return request.answer.reply(await serve(*args, **kwargs))


def by_method(requests: Sequence[Request]) -> dict[str, Request]:
    """The client's table: Ray method name -> its declaration."""
    return {r.method: r for r in requests}


# ------------------------------------------------------------ codecs of the requests
def strict_int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise FrameError(f"expected an int, got {value!r:.80}")
    return value


def rows(value: Any, width: int) -> list[tuple[Any, ...]]:
    """Rows of ``width`` as msgpack carries them (lists), each a tuple."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(r, list) and len(r) == width for r in value
    ):
        raise FrameError(f"expected rows of {width}, got {value!r:.80}")
    return [tuple(r) for r in value]


def by_group(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise FrameError(f"expected a map by group, got {value!r:.80}")
    return value


INT = Codec(int, strict_int)
"""An int, refused as a malformed frame when it is not one."""
INTS = Codec(lambda v: [int(x) for x in v])
"""A sequence of ints, as a list."""
LIST = Codec(list)
"""A sequence, as a list (the processor checks its items)."""
QUEUE_OFFSETS = Codec(
    lambda v: [[t, q, o] for (t, q), o in v.items()],
    lambda v: {(t, q): o for t, q, o in rows(v, 3)},
)
"""``{(topic, queue id): offset}`` as ``[[topic, queue id, offset]]``."""
