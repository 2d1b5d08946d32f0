"""The clients a broker knows (RocketMQ's ``broker.client``): consumer group members
and the ids it hands to idempotent producers."""
