"""Held requests woken by new messages (RocketMQ's ``broker.longpolling``)."""
