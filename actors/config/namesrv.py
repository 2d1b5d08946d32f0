"""A NameServer's settings."""

from __future__ import annotations

from dataclasses import dataclass

from actors.config.options import check_positive


@dataclass(frozen=True)
class NameServerConfig:
    """A NameServer's settings (RocketMQ: scan every 5 s, expire after 120 s)."""

    broker_expired_s: float = 120.0
    scan_interval_s: float = 5.0

    def __post_init__(self) -> None:
        check_positive(
            "NameServerConfig",
            broker_expired_s=self.broker_expired_s,
            scan_interval_s=self.scan_interval_s,
        )
