"""Lite topics on a broker (issue 48): parents of type LITE, sends that create lite
topics, exclusive consumption within a group (:mod:`actors.broker.lite.processor`)."""
