"""The broker's request processors (RocketMQ's ``broker.processor``): each serves one
kind of request, through the Broker actor's Ray methods and the broker's socket."""
