"""What a broker keeps about consumers' progress (RocketMQ's ``broker.offset``):
committed offsets, offset fences and stream checkpoints."""
