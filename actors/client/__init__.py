"""The clients: the Producer and its send machinery, the PullConsumer, the PushConsumer
(``push/``), the SimpleConsumer, the transactional producers and the admin client. All
of a process's clients of one cluster share one client instance (``instance``: routes,
broker handles, connections, heartbeats). They talk to brokers only through
``actors.protocol``."""

from __future__ import annotations

from actors.client.admin import Admin
from actors.client.backpressure import ProducerBusyError
from actors.client.producer import Producer
from actors.client.pull_consumer import PullConsumer, PullResult, PullStatus
from actors.client.push import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageModel,
    PushConsumer,
    PushConsumerConfig,
)
from actors.client.send_result import BatchSendResult, SendResult, SendStatus
from actors.client.simple_consumer import SimpleConsumer
from actors.client.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)
from actors.client.transactional import (
    Transaction,
    TransactionalProducer,
    TransactionState,
)

__all__ = [
    "Admin",
    "BatchSendResult",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "LocalTransactionState",
    "MessageModel",
    "Producer",
    "ProducerBusyError",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "PushConsumerConfig",
    "SendResult",
    "Transaction",
    "TransactionState",
    "TransactionalProducer",
    "SendStatus",
    "SimpleConsumer",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
]
