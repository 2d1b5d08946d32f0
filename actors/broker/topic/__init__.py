"""A broker's topics (RocketMQ's ``broker.topic``)."""
