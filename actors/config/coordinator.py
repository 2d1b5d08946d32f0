"""A consumer group coordinator's settings."""

from __future__ import annotations

from dataclasses import dataclass

from actors.config.options import check_positive


@dataclass(frozen=True)
class CoordinatorConfig:
    """Settings of a consumer group's :class:`actors.GroupCoordinator`; whoever creates
    the coordinator (the group's first consumer, or the first call through a handle
    :func:`actors.coordinator_for` returns) sets them, later joiners find it as it is.

    ``revoke_timeout_s``: an owner told to give a queue up has this long to confirm
    before the queue is fenced and handed on. ``route_refresh_s``: routes are
    re-read this often besides on every NameServer route change.
    ``fence_timeout_s``: the limit of one fencing call on a broker. ``log_size``:
    how many events the generation log keeps. ``forget_gone_s``: how long the client id
    of a member whose actor died stays refused (a join it sent before dying, arriving
    late, must not bring it back; a new consumer has a new id): the coordinator then
    forgets it, so a group whose members come and go for months holds no trace of each.
    """

    revoke_timeout_s: float = 10.0
    route_refresh_s: float = 30.0
    fence_timeout_s: float = 5.0
    log_size: int = 10_000
    forget_gone_s: float = 600.0

    def __post_init__(self) -> None:
        check_positive(
            "CoordinatorConfig",
            revoke_timeout_s=self.revoke_timeout_s,
            route_refresh_s=self.route_refresh_s,
            fence_timeout_s=self.fence_timeout_s,
            log_size=self.log_size,
            forget_gone_s=self.forget_gone_s,
        )
