"""RocketMQ 5's gRPC protocol served by a broker (``grpc_enable``): see docs/rocketmq5.md.

Imports nothing: ``service`` (and the generated ``v2`` modules it loads) is imported
only by a broker starting its endpoint, so a process running the official Python
client, whose generated modules register the same ``.proto`` names in protobuf's
per-process descriptor pool, can still import ``actors``.
"""
