"""RocketMQ's V1 CommitLog record and the batch wire form built on it, under the names
callers have always imported from here.

This module holds no code of its own; each part lives in its own module:

* ``storage.record``: the record layout, byte for byte (its fields and offsets,
  validation of topics and queue ids, decoding records back);
* ``storage.batch``: the batch wire form (:class:`EncodedBatch`,
  :func:`encode_batch`, the structure check of a batch from the wire);
* ``storage.java_hash``: Java's ``String.hashCode`` and RocketMQ's index key hash;
* ``storage.seq_slots``: an idempotent producer's ``PRODUCER_SEQ`` values and slots;
* ``storage.message_id`` and ``storage.properties``: message ids and properties.

Code inside ``storage`` imports the part it uses; ``storage.codec.X`` stays for
everyone else.
"""

from __future__ import annotations

from ._crc import crc32 as crc32
from ._crc import crc32_address as crc32_address
from .batch import _FIELD_RULES as _FIELD_RULES
from .batch import _LE_I2 as _LE_I2
from .batch import _LE_I4 as _LE_I4
from .batch import _LE_I8 as _LE_I8
from .batch import _SINGLE_QUEUE_IDS as _SINGLE_QUEUE_IDS
from .batch import _WIRE_HEAD as _WIRE_HEAD
from .batch import _WIRE_TIMER as _WIRE_TIMER
from .batch import _WIRE_TRANSACTIONAL as _WIRE_TRANSACTIONAL
from .batch import EncodedBatch as EncodedBatch
from .batch import OneSend as OneSend
from .batch import PackedKeys as PackedKeys
from .batch import PlainEncoder as PlainEncoder
from .batch import _headers_match as _headers_match
from .batch import _keys_raw as _keys_raw
from .batch import _marked as _marked
from .batch import _min_max as _min_max
from .batch import _plain_encoder as _plain_encoder
from .batch import _properties_fault as _properties_fault
from .batch import _props_span as _props_span
from .batch import _queue_ids as _queue_ids
from .batch import _verify_records as _verify_records
from .batch import _verify_records_py as _verify_records_py
from .batch import body_length_range as body_length_range
from .batch import encode_batch as encode_batch
from .batch import encode_message as encode_message
from .batch import parse_send_one as parse_send_one
from .batch import use_plain_encoder as use_plain_encoder
from .batch import verify_records as verify_records
from .errors import InvalidMessageError as InvalidMessageError
from .errors import StoreCorruptedError as StoreCorruptedError
from .java_hash import _MASK32 as _MASK32
from .java_hash import _POW31 as _POW31
from .java_hash import _SCALAR_HASH_CHARS as _SCALAR_HASH_CHARS
from .java_hash import _pow31 as _pow31
from .java_hash import index_key_hash as index_key_hash
from .java_hash import java_hash as java_hash
from .java_hash import java_hash_cached as java_hash_cached
from .java_hash import java_hashes as java_hashes
from .java_hash import prefixed_java_hashes as prefixed_java_hashes
from .message import Message as Message
from .message import MessageExt as MessageExt

# ids and properties live in their own modules (the message values need them too);
# they stay importable from here, where callers have always found them
from .message_id import UniqueKeyGenerator as UniqueKeyGenerator
from .message_id import bytes_to_host as bytes_to_host
from .message_id import default_generator as default_generator
from .message_id import host_to_bytes as host_to_bytes
from .message_id import make_offset_msg_id as make_offset_msg_id
from .message_id import new_unique_key as new_unique_key
from .message_id import parse_offset_msg_id as parse_offset_msg_id
from .properties import KEY_SEP as KEY_SEP
from .properties import MAX_PROPERTIES_LEN as MAX_PROPERTIES_LEN
from .properties import NAME_VALUE_SEP as NAME_VALUE_SEP
from .properties import PROP_DELAY as PROP_DELAY
from .properties import PROP_KEYS as PROP_KEYS
from .properties import PROP_MAX_RECONSUME_TIMES as PROP_MAX_RECONSUME_TIMES
from .properties import PROP_ORIGIN_MESSAGE_ID as PROP_ORIGIN_MESSAGE_ID
from .properties import PROP_PRODUCER_GROUP as PROP_PRODUCER_GROUP
from .properties import PROP_PRODUCER_SEQ as PROP_PRODUCER_SEQ
from .properties import PROP_REAL_QID as PROP_REAL_QID
from .properties import PROP_REAL_TOPIC as PROP_REAL_TOPIC
from .properties import PROP_RECONSUME_TIME as PROP_RECONSUME_TIME
from .properties import PROP_RETRY_TOPIC as PROP_RETRY_TOPIC
from .properties import PROP_TAGS as PROP_TAGS
from .properties import PROP_TIMER_DELAY_SEC as PROP_TIMER_DELAY_SEC
from .properties import PROP_TIMER_DELIVER_MS as PROP_TIMER_DELIVER_MS
from .properties import PROP_TRAN_MSG as PROP_TRAN_MSG
from .properties import PROP_UNIQ_KEY as PROP_UNIQ_KEY
from .properties import PROPERTY_SEP as PROPERTY_SEP
from .properties import SYSTEM_PROPS as SYSTEM_PROPS
from .properties import check_property_text as check_property_text
from .properties import decode_properties as decode_properties
from .properties import encode_properties as encode_properties
from .properties import normalize_keys as normalize_keys
from .record import _HDR as _HDR
from .record import _I32 as _I32
from .record import _SCALAR_DECODE_MAX as _SCALAR_DECODE_MAX
from .record import _SIZE_MAGIC as _SIZE_MAGIC
from .record import BLANK_MAGIC as BLANK_MAGIC
from .record import CLIENT_SYSFLAGS as CLIENT_SYSFLAGS
from .record import END_FILE_MIN_BLANK as END_FILE_MIN_BLANK
from .record import FIXED_LEN as FIXED_LEN
from .record import HEADER as HEADER
from .record import MAGIC as MAGIC
from .record import MAX_TOPIC_LEN as MAX_TOPIC_LEN
from .record import OFF_BODYLEN as OFF_BODYLEN
from .record import OFF_BORNTIMESTAMP as OFF_BORNTIMESTAMP
from .record import OFF_MAGIC as OFF_MAGIC
from .record import OFF_PHYSICALOFFSET as OFF_PHYSICALOFFSET
from .record import OFF_QUEUEID as OFF_QUEUEID
from .record import OFF_QUEUEOFFSET as OFF_QUEUEOFFSET
from .record import OFF_STOREHOST as OFF_STOREHOST
from .record import OFF_STORETIMESTAMP as OFF_STORETIMESTAMP
from .record import OFF_TOTALSIZE as OFF_TOTALSIZE
from .record import SMALL_BATCH as SMALL_BATCH
from .record import SYSFLAG_COMPRESSED as SYSFLAG_COMPRESSED
from .record import SYSFLAG_MULTI_TAGS as SYSFLAG_MULTI_TAGS
from .record import TOPIC_RE as TOPIC_RE
from .record import _host as _host
from .record import _host_cache as _host_cache
from .record import _hosts as _hosts
from .record import _native as _native
from .record import _topics as _topics
from .record import body_slices as body_slices
from .record import decode_record as decode_record
from .record import decode_records as decode_records
from .record import record_size_at as record_size_at
from .record import record_starts as record_starts
from .record import stored_record_fault as stored_record_fault
from .record import validate_queue_id as validate_queue_id
from .record import validate_topic as validate_topic
from .record import windows as windows
from .seq_slots import _SLOT_COUNT as _SLOT_COUNT
from .seq_slots import _SLOT_EPOCH as _SLOT_EPOCH
from .seq_slots import _SLOT_NAME as _SLOT_NAME
from .seq_slots import _SLOT_SEQ as _SLOT_SEQ
from .seq_slots import _VALID_PRODUCER_IDS as _VALID_PRODUCER_IDS
from .seq_slots import PRODUCER_ID_RE as PRODUCER_ID_RE
from .seq_slots import parse_seq_value as parse_seq_value
from .seq_slots import seq_pairs as seq_pairs
from .seq_slots import seq_slot as seq_slot
from .seq_slots import seq_value as seq_value
from .seq_slots import slot_at as slot_at
from .seq_slots import validate_producer_id as validate_producer_id
