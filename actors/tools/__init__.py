"""Operators' tools: the ``raymq`` command line (``cli``) and ``raymq bench`` (``bench``).
The top of the house: nothing in ``actors`` imports it."""
