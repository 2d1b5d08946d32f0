"""Errors a broker raises that its callers catch by type (beside ``storage.errors``)."""

from __future__ import annotations

from storage.errors import RayMQError


class PromotionRefusedError(RayMQError):
    """A slave cannot be promoted: the master is alive, or it lacks acknowledged messages
    (or the group elects its master: DLedger)."""
