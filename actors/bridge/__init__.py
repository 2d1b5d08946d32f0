"""Topics in and out of Ray Data and Spark: a topic as a Ray Data source and sink
(``datasource``), Spark on Ray through RayDP (``spark``) and micro-batch streams
(``streaming``). Imported lazily: ``import actors.bridge`` loads neither Ray Data
nor Spark until one of these names is used."""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "read_topic": "datasource",
    "plan_topic_read": "datasource",
    "TopicDatasource": "datasource",
    "write_to_topic": "spark",
    "init_spark": "spark",
    "stop_spark": "spark",
    "topic_to_spark": "spark",
    "dataset_to_spark": "spark",
    "spark_to_dataset": "spark",
    "stream_to_spark": "streaming",
    "StreamingQuery": "streaming",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'actors.bridge' has no attribute {name!r}")
    return getattr(importlib.import_module(f"actors.bridge.{module}"), name)
