"""The web console's settings (``actors/console``)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from actors.protocol.names import DEFAULT_NAMESPACE
from storage.errors import InvalidConfigError

DEFAULT_CONSOLE_PORT = 8280
MIN_AUTH_LEN = 8


def is_loopback(host: str) -> bool:
    """Whether ``host`` only takes connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ConsoleConfig:
    """Where the console listens and who may use it.

    It binds 127.0.0.1 unless told otherwise; any other address needs ``auth``, a
    token of at least 8 characters that a browser gives once on the login page (or
    a script as ``Authorization: Bearer <token>``)."""

    namespace: str = DEFAULT_NAMESPACE
    host: str = "127.0.0.1"
    port: int = DEFAULT_CONSOLE_PORT
    auth: str | None = None
    refresh_ms: int = 2000
    """How often the pages that watch something (a group's lag) refresh it."""
    max_body_bytes: int = 4 << 20
    """The largest test message body the console sends (RocketMQ's maxMessageSize)."""
    sample_interval_ms: int = 5000
    """How often the console samples the brokers' counters for its rates and charts."""
    samples_kept: int = 120
    """How many samples it keeps (a bounded ring: 10 minutes at the default interval)."""
    rate_window_ms: int = 15000
    """A rate (TPS) is the change of a counter over about this long, the newest samples'."""
    job_chunk: int = 256
    """A long operation (a bulk resend) works in steps of this many, telling its progress."""

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or isinstance(self.port, bool):
            raise InvalidConfigError(f"ConsoleConfig.port={self.port!r}: must be an int")
        if not 0 <= self.port <= 65535:
            raise InvalidConfigError(f"ConsoleConfig.port={self.port}: must be in 0..65535")
        if self.auth is not None and len(self.auth) < MIN_AUTH_LEN:
            raise InvalidConfigError(
                f"ConsoleConfig.auth: a token of at least {MIN_AUTH_LEN} characters"
            )
        if not is_loopback(self.host) and self.auth is None:
            raise InvalidConfigError(
                f"ConsoleConfig.host={self.host!r} takes connections from other machines: "
                "give a token (--auth) or bind 127.0.0.1"
            )
        if self.refresh_ms < 100:
            raise InvalidConfigError(f"ConsoleConfig.refresh_ms={self.refresh_ms}: at least 100")
        if self.max_body_bytes < 1:
            raise InvalidConfigError("ConsoleConfig.max_body_bytes: must be > 0")
        if self.sample_interval_ms < 100:
            raise InvalidConfigError(
                f"ConsoleConfig.sample_interval_ms={self.sample_interval_ms}: at least 100"
            )
        if not 2 <= self.samples_kept <= 100_000:
            raise InvalidConfigError(
                f"ConsoleConfig.samples_kept={self.samples_kept}: must be in 2..100000"
            )
        if self.rate_window_ms < self.sample_interval_ms:
            raise InvalidConfigError(
                f"ConsoleConfig.rate_window_ms={self.rate_window_ms}: at least "
                f"sample_interval_ms ({self.sample_interval_ms})"
            )
        if self.job_chunk < 1:
            raise InvalidConfigError("ConsoleConfig.job_chunk: must be > 0")

    def __repr__(self) -> str:  # never print the token
        auth = "set" if self.auth else None
        return (
            f"ConsoleConfig(namespace={self.namespace!r}, host={self.host!r}, "
            f"port={self.port}, auth={auth})"
        )
