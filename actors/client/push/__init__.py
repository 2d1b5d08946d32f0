"""The PushConsumer (RocketMQ's ``DefaultMQPushConsumer``) and its services: pulling,
consuming concurrently or in order, rebalancing (client-side or coordinated),
offset stores and send-back."""

from __future__ import annotations

from actors.client.push.config import (
    ConsumeFromWhere,
    ConsumeStatus,
    Listener,
    MessageModel,
    PushConsumerConfig,
)
from actors.client.push.consumer import PushConsumer

__all__ = [
    "ConsumeFromWhere",
    "ConsumeStatus",
    "Listener",
    "MessageModel",
    "PushConsumer",
    "PushConsumerConfig",
]
