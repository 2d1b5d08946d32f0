"""The requests' declarations (``actors.protocol.requests``) on their own: each one
agrees with the Ray method it stands for and with the coroutine that serves it, and
what the client frames the server reads back (no broker, no Ray)."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest

from actors.broker.broker import _PROCESSORS, Broker, _derive_served_methods
from actors.coordinator.txn import TransactionCoordinator
from actors.protocol import frames, requests
from actors.protocol.requests.declare import REQUIRED, Request


def _parameters(fn: Any) -> list[tuple[str, Any, bool]]:
    params = list(inspect.signature(fn).parameters.values())[1:]  # without self
    # without the tracing context ray.remote(cls) adds to an actor class's methods
    params = [p for p in params if not p.name.startswith("_ray_")]
    return [
        (
            p.name,
            REQUIRED if p.default is inspect.Parameter.empty else p.default,
            p.kind is inspect.Parameter.KEYWORD_ONLY,
        )
        for p in params
    ]


def _declared(request: Request) -> list[tuple[str, Any, bool]]:
    return [(f.name, f.default, f.keyword) for f in request.fields]


_ACTORS = [(Broker, r) for r in requests.BROKER] + [
    (TransactionCoordinator, r) for r in requests.COORDINATOR
]


@pytest.mark.parametrize(("actor", "request_"), _ACTORS, ids=lambda v: getattr(v, "name", ""))
def test_each_request_declares_its_ray_methods_arguments(actor: type, request_: Request) -> None:
    """The socket and Ray carry the same call: the declaration's fields are the Ray
    method's parameters, in order, with its defaults (a drift fails here)."""
    assert _declared(request_) == _parameters(getattr(actor, request_.method))


def _processors_coroutine(path: str) -> Any:
    """``"popper.pop_packed"``: the processor's coroutine that path names on a Broker."""
    attribute, name = path.split(".")
    return getattr(_PROCESSORS[attribute], name)


@pytest.mark.parametrize("request_", requests.BROKER, ids=lambda r: r.name)
def test_the_coroutine_serving_a_request_takes_its_fields(request_: Request) -> None:
    """The processor's coroutine serving a request on the socket (``serve``, or else
    ``served_by``) takes the same fields as the Ray method."""
    if request_.serving == request_.method:  # the Broker's own Ray method: checked above
        return
    serve = _processors_coroutine(request_.serving)
    assert inspect.iscoroutinefunction(serve)
    assert _parameters(serve) == _declared(request_)


_DERIVED = [r for r in requests.BROKER if r.served_by is not None]


@pytest.mark.parametrize("request_", _DERIVED, ids=lambda r: r.name)
def test_the_brokers_ray_method_of_a_request_is_derived_from_its_served_by(
    request_: Request,
) -> None:
    """``served_by=(attribute, method)`` makes ``Broker.<method>`` an async Ray method
    calling that processor's coroutine, with its signature."""
    ray_method = getattr(Broker, request_.method)
    processor_method = _processors_coroutine(".".join(request_.served_by or ()))
    assert inspect.iscoroutinefunction(ray_method)
    assert ray_method.__wrapped__ is processor_method
    assert ray_method.__name__ == request_.method
    assert ray_method.__doc__


def test_a_served_by_that_is_not_an_attribute_and_a_method_is_refused() -> None:
    for bad in (("sender",), ("sender", "send", "x"), ("sender", "send()")):
        with pytest.raises(ValueError, match="served_by"):
            Request("X", 99, "x", (), served_by=bad)  # type: ignore[arg-type]


def test_a_method_both_derived_and_written_on_the_broker_is_refused() -> None:
    """Deriving again finds each method already on the class: a declaration whose
    ``served_by`` names a Broker method also written by hand fails at import."""
    before = dict(vars(Broker))
    with pytest.raises(TypeError, match="written by hand too"):
        _derive_served_methods()
    assert dict(vars(Broker)) == before


def test_codes_and_wire_keys_are_each_used_once() -> None:
    all_requests = requests.BROKER + requests.COORDINATOR
    codes = [r.code for r in all_requests]
    assert len(set(codes)) == len(codes)
    for r in all_requests:
        named = frames.Code.__members__.get(r.name)
        assert named is None or int(named) == r.code
        keys = [f.key for f in r.fields if f.key is not None]
        assert len(set(keys)) == len(keys)


def test_every_error_a_request_declares_crosses_the_socket_as_its_type() -> None:
    for r in requests.BROKER + requests.COORDINATOR:
        for err in r.errors:
            back = frames.error_from(frames.error_fields(err("why")))
            assert type(back) is err and str(back) == "why"


_CALLS: dict[str, tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]] = {
    # method: (args, kwargs, what the server reads where it is not what was given)
    "send": ((b"batch",), {"auto_create_queue_nums": 4}, {}),
    "send_shared": (((1, 2, b"id"), 64, 128), {}, {}),
    "pull_packed": ((b"pulls",), {}, {}),
    "commit_offsets": (("g", {("T", 0): 5, ("T", 1): 7}, "c1", {("T", 0): (2, 9)}), {}, {}),
    "consumer_send_msg_back": (("g", [10, 20], 16, [1, 2]), {}, {}),
    "heartbeat": (("g", "c1", ("T", "U")), {"ttl_s": 3.0}, {"topics": ["T", "U"]}),
    "unregister_consumer": (("g", "c1"), {}, {}),
    "end_transaction": (("pg", 1234, "msg-id", True), {}, {}),
    "end_transaction_batch": (
        ("tx", True, [1, "id"], {"g": {("T", 0): 3}}, "tid", 2),
        {"retry": True},
        {},
    ),
    "end_transactions": (("pg", [(1, "a", True), (2, "b", False)]), {}, {}),
    "commit_one_phase": (
        ("tx", "tid", 1, np.arange(8, dtype=np.uint8), {"g": [["T", 0, 3]]}),
        {},
        {"blob": bytes(range(8))},
    ),
    "pop": (("g", "T", 8, 30_000), {"fifo": True, "client_id": "c1"}, {}),
    "ack_message": (("g", "T", ["h1", "h2"]), {}, {}),
    "change_invisible_duration": (("g", "T", "h1", 60_000), {}, {}),
    "min_max_offset": (("T", 3), {}, {}),
    "offset_by_time": (("T", 3), {"timestamp_ms": 1_700_000_000_000}, {}),
    "lite_send": (
        ("P", [("s1", b"a"), ("s2", b"b", {"tags": "t"})]),
        {},
        {"items": [["s1", b"a"], ["s2", b"b", {"tags": "t"}]]},
    ),
    "lite_subscribe": (
        ("g", "P", "c1", ("s1", "s2")),
        {"action": "remove"},
        {"lite_topics": ["s1", "s2"]},
    ),
    "lite_receive": (("g", "P", "c1", 8), {}, {}),
    "lite_ack": (("g", "P", "c1", "s1", 5), {}, {}),
    "lite_pull": (("P", "s1", 3), {"max_count": 4}, {}),
    "lite_committed_offset": (("g", "P", "s1"), {}, {}),
    "subscribe": (
        ("g", {("T", 0): 5, ("T", 1): 0}),
        {"tags": "a || b", "credit": 32, "credit_bytes": 1 << 20, "max_count": 16},
        {},
    ),
    "subscription_credit": ((3, 10), {"credit_bytes": 100}, {}),
    "update_subscription": ((3,), {"add": {("T", 2): 4}, "drop": [["T", 0]]}, {}),
    "unsubscribe": ((3,), {}, {}),
    "end": (
        ("tx", "tid", 3, True, {"b": (1, 2), "c": None}, {"b": {"g": [("T", 0, 5)]}}),
        {},
        {"halves": {"b": [1, 2], "c": None}, "offsets": {"b": {"g": [["T", 0, 5]]}}},
    ),
}


@pytest.mark.parametrize("request_", requests.BROKER + requests.COORDINATOR, ids=lambda r: r.name)
def test_what_the_client_frames_the_server_reads_back(request_: Request) -> None:
    args, kwargs, as_read = _CALLS[request_.method]
    header, parts, _ = request_.encode(*args, **kwargs)
    assert header["c"] == request_.code
    raw = b"".join(frames.encode({**header, "o": 1}, parts))  # as msgpack carries it
    hlen = int.from_bytes(raw[4:8], "big")
    got_args, got_kwargs = request_.decode(frames.decode_header(raw[8 : 8 + hlen]), raw[8 + hlen :])
    names = [f.name for f in request_.fields]
    expected = {**dict(zip(names, args)), **kwargs, **as_read}
    got = dict(zip(names, got_args)) | got_kwargs
    assert {n: v for n, v in got.items() if n in expected} == expected
    defaults = {f.name: f.default for f in request_.fields if f.name not in expected}
    assert {n: v for n, v in got.items() if n not in expected} == defaults


def test_an_answer_reads_back_as_the_ray_method_returns_it() -> None:
    bounds = requests.by_method(requests.BROKER)["min_max_offset"]
    fields, parts = bounds.answer.reply((3, 42))
    raw = b"".join(frames.encode({**fields, "c": 0, "o": 1}, parts))
    assert bounds.answer.read(frames.decode_header(raw[8:]), b"") == (3, 42)  # not a list


def test_a_call_is_bound_as_the_ray_method_would_bind_it() -> None:
    pop = requests.by_method(requests.BROKER)["pop"]
    with pytest.raises(TypeError, match="missing required argument 'invisible_ms'"):
        pop.encode("g", "T", 8)
    with pytest.raises(TypeError, match="positional"):
        pop.encode("g", "T", 8, 1000, 0, True)  # fifo is keyword-only
    with pytest.raises(TypeError, match="unexpected"):
        pop.encode("g", "T", 8, 1000, fifo=True, nope=1)
    with pytest.raises(TypeError, match="multiple values"):
        pop.encode("g", "T", 8, 1000, group="h")
    header, _, _ = pop.encode("g", "T", 8, invisible_ms=1000, tag_expr="a||b")
    assert header["x"] == "a||b" and header["w"] == 0 and header["ff"] is False


def test_a_field_a_frame_leaves_out_is_its_default_and_a_malformed_one_is_refused() -> None:
    send = requests.by_method(requests.BROKER)["send"]
    assert send.decode({"c": send.code}, b"x") == ([b"x", 0], {})
    with pytest.raises(frames.FrameError, match="expected an int"):
        send.decode({"c": send.code, "n": "4"}, b"x")
    commit = requests.by_method(requests.BROKER)["commit_offsets"]
    with pytest.raises(frames.FrameError, match="rows of 3"):
        commit.decode({"g": "g", "q": [["T", 0]]}, b"")
