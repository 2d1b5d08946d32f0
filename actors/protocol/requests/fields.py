"""The fields several requests share, each with its one wire key (RocketMQ's request
headers reuse ``consumerGroup``, ``topic``, ``queueId`` the same way)."""

from __future__ import annotations

from actors.protocol.requests.declare import INT, Field

GROUP = Field("group", "g")
"""A consumer group."""
PRODUCER_GROUP = Field("producer_group", "g")
TOPIC = Field("topic", "t")
QUEUE_ID = Field("queue_id", "q")
CLIENT_ID = Field("client_id", "i")
"""A consumer's id in its group."""
RECEIPT_HANDLE = Field("receipt_handle", "h")
"""A POP receive's handle of one message."""
TXN_ID = Field("txn_id", "x")
TRANSACTIONAL_ID = Field("transactional_id", "i")
EPOCH = Field("epoch", "e")
COMMIT = Field("commit", "m")
"""Commit (True) or roll back."""
INVISIBLE_MS = Field("invisible_ms", "i")
"""How long a received message stays invisible to its group."""
AUTO_CREATE_QUEUE_NUMS = Field("auto_create_queue_nums", "n", INT, default=0)
"""Queues of a topic a send creates when it does not exist (0: none)."""
