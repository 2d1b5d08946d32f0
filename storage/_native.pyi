# Types of the C module storage/_native.c (built by setup.py where a compiler is).
from collections.abc import Sequence
from typing import Any

def bind(message_type: type) -> None: ...
def encode_plain(
    messages: Sequence[Any],
    topic: str,
    tags: str | None,
    max_size: int,
    header: bytes,
    head: bytes,
    prefix: bytes,
    start: int,
    key_hash_base: int,
    crc_address: int,
    keyed: bool = False,
    key_topic_base: int = 0,
    slot: bytes = b"",
    extras: Sequence[bytes] | None = None,
    /,
) -> tuple[bytes | bytearray, bytes, bytes, bytes, bytes] | None: ...
def crc32_builtin(data: Any, /) -> int: ...
def scan_records(data: Any, sizes: Any, /) -> tuple[int, int] | None: ...
def verify_records(
    data: Any,
    sizes: Any,
    topic_idx: Any,
    topics: tuple[bytes, ...],
    sysflags: int,
    crc_address: int,
    /,
) -> tuple[int, str | None, int, int, int, int, int]: ...
def patch_records(
    buffer: Any,
    at: int,
    sizes: Any,
    queue_ids: Any,
    queue_offsets: Any,
    phys: Any,
    stored: bytes,
    /,
) -> None: ...
def link_index(
    buffer: Any,
    table_at: int,
    slots: int,
    entries_at: int,
    count: int,
    hashes: Any,
    offsets: Any,
    diff: int,
    /,
) -> int: ...
def write_one(
    log: Any,
    log_at: int,
    record: Any,
    queue_id: int,
    queue_offset: int,
    phys: int,
    store_ts: int,
    host: bytes,
    cq: Any,
    cq_at: int,
    tag: int,
    index: Any,
    slots: int,
    count: int,
    hashes: list[int] | None,
    diff: int,
    begin_ts: int,
    begin_offset: int,
    end_offset: int,
    slot_count: int,
    /,
) -> int: ...
def body_slices(data: Any, starts: Any, /) -> list[bytes] | None: ...
def decode_records(
    data: Any, message_type: type, check_crc: bool, crc_address: int, /
) -> list[Any] | None: ...
