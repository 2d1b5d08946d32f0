"""Transactional messages on the broker (RocketMQ's ``broker.transaction``): half
messages, their end, their check-back, and one-phase commits."""
