"""A lite put's records through the C encoder (plain messages: their ``__LITE_TOPIC``
a property all records share when they name one lite topic, each record's own when
they name several) are byte for byte what the general loop writes for messages
carrying that property, which stays the path of messages with properties of their
own."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from store_sizes import small_config

from storage import Message, MessageStore, codec, properties, record
from storage import _fast_encode as fast
from storage.lite import PROP_LITE_TOPIC, LiteConfig, LiteStore

needs_native = pytest.mark.skipif(record._native is None, reason="storage._native not built")


class Keys(codec.UniqueKeyGenerator):
    """Unique keys from 1000 on, whichever way an encoder asks for them."""

    def __init__(self) -> None:
        super().__init__("10.0.0.1")
        self.prefix = "0A000001ABCD12345678"
        self._counter = itertools.count(1000)

    def take(self, n: int) -> int:
        return 1000


CASES = {
    "one": [Message("Chat", b"token")],
    "tags": [Message("Chat", b"t%d" % i, tags="Reply") for i in range(3)],
    "keyed": [Message("Chat", b"k%d" % i, keys=f"turn-{i}") for i in range(4)],
    "a long name": [Message("Chat", b"x" * 300)],
}


@needs_native
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_c_encoder_writes_a_lite_record_as_the_general_loop_does(case: str) -> None:
    messages = CASES[case]
    name = "n" * 128 if case == "a long name" else "chat-42"
    born = codec.host_to_bytes("127.0.0.1:0")
    got = fast.encode_plain(messages, 1 << 20, 7, born, Keys(), shared={PROP_LITE_TOPIC: name})
    tagged = [Message(m.topic, m.body, m.tags, m.keys, {PROP_LITE_TOPIC: name}) for m in messages]
    want = codec.encode_batch(tagged, born_timestamp=7, uniq=Keys())
    assert got is not None
    assert bytes(got.data) == bytes(want.data)
    assert got.sizes.tolist() == want.sizes.tolist()
    assert list(got.uniq_keys) == list(want.uniq_keys)
    assert got.key_hashes.tolist() == want.key_hashes.tolist()
    assert got.tag_codes.tolist() == want.tag_codes.tolist()
    got.check_structure()


@needs_native
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_c_encoder_writes_records_naming_lite_topics_of_their_own_as_the_loop_does(
    case: str,
) -> None:
    messages = CASES[case]
    names = ["n" * 128 if case == "a long name" else f"chat-{i % 2}" for i in range(len(messages))]
    extras = [properties.encode_properties({PROP_LITE_TOPIC: n}) for n in names]
    if case == "tags":  # messages with properties of their own, written before the name
        messages = [
            Message(m.topic, m.body, m.tags, m.keys, {"trace": f"t{i}", "turn": "x" * i})
            for i, m in enumerate(messages)
        ]
        extras = [
            properties.encode_properties({**m.properties, PROP_LITE_TOPIC: n})
            for m, n in zip(messages, names)
        ]
    born = codec.host_to_bytes("127.0.0.1:0")
    got = fast.encode_plain(messages, 1 << 20, 7, born, Keys(), extras=extras)
    tagged = [
        Message(m.topic, m.body, m.tags, m.keys, {**(m.properties or {}), PROP_LITE_TOPIC: n})
        for m, n in zip(messages, names)
    ]
    want = codec.encode_batch(tagged, born_timestamp=7, uniq=Keys())
    assert got is not None
    assert bytes(got.data) == bytes(want.data)
    assert got.sizes.tolist() == want.sizes.tolist()
    assert list(got.uniq_keys) == list(want.uniq_keys)
    assert got.key_hashes.tolist() == want.key_hashes.tolist()
    got.check_structure()
    with pytest.raises(ValueError):  # one per message
        fast.encode_plain(messages, 1 << 20, 7, born, Keys(), extras=extras + [b""])


def test_a_lite_store_puts_through_either_path_the_same_records(tmp_path: Path) -> None:
    store = MessageStore(small_config(tmp_path / "s"), start_services=False)
    lite = LiteStore(store, LiteConfig(index_file_entries=64))
    lite.declare_parent("Chat", quota=10, ttl_ms=3_600_000)
    try:
        # plain messages, to one lite topic or several, or with properties of their
        # own: the C encoder (when built); a message naming its unique key: the loop
        lite.put_batch("Chat", [("a", Message("Chat", b"a%d" % i, tags="T")) for i in range(3)])
        lite.put_batch("Chat", [("a", Message("Chat", b"a3")), ("b", Message("Chat", b"b0"))])
        lite.put("Chat", "a", Message("Chat", b"a4", properties={"trace": "on"}))
        uniq = {"UNIQ_KEY": "0A0000010000000000000000000000AB", PROP_LITE_TOPIC: "z"}
        lite.put("Chat", "a", Message("Chat", b"a5", properties=uniq))
        got = lite.get("Chat", "a", 0, 10).messages
        assert [m.body for m in got] == [b"a%d" % i for i in range(6)]
        assert {m.properties[PROP_LITE_TOPIC] for m in got} == {"a"}
        assert [m.tags for m in got] == ["T", "T", "T", None, None, None]
        assert got[4].properties["trace"] == "on"
        assert got[5].msg_id == uniq["UNIQ_KEY"]
        assert len({m.msg_id for m in got}) == 6
        assert [m.body for m in lite.get("Chat", "b", 0).messages] == [b"b0"]
    finally:
        lite.close()
        store.close()
