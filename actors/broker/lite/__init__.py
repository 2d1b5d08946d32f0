"""Lite topics on a broker: parents of type LITE, sends that create lite
topics, exclusive consumption within a group (:mod:`actors.broker.lite.processor`)."""
