"""The store's configuration: RocketMQ's names in snake_case, RocketMQ's defaults.

A RocketMQ ``broker.conf`` loads into it (``StoreConfig.from_broker_conf``) so
an existing deployment's file works unchanged; keys the store does not own
(``brokerName``, ``brokerRole`` ...) are left for the broker's own config.
:func:`parse_broker_conf` reads the file for both and logs a warning for each
old spelling it reads as the current one; the reader of the file names every key
it does not read (a typo, or a RocketMQ setting RayMQ has no use for): a setting
is never dropped in silence.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import InvalidConfigError

FLUSH_TYPES = ("ASYNC_FLUSH", "SYNC_FLUSH")

# broker.conf key -> (StoreConfig field, converter)
_CONF_KEYS: dict[str, tuple[str, Any]] = {
    "storePathRootDir": ("store_dir", str),
    "flushDiskType": ("flush_disk_type", str),
    "mappedFileSizeCommitLog": ("commitlog_file_size", int),
    "mappedFileSizeConsumeQueue": ("consume_queue_file_entries", lambda v: int(v) // 20),
    "maxHashSlotNum": ("index_hash_slots", int),
    "maxIndexNum": ("index_max_entries", int),
    "maxMessageSize": ("max_message_size", int),
    "flushIntervalCommitLog": ("flush_interval_commitlog_ms", int),
    "flushCommitLogLeastPages": ("flush_commitlog_least_pages", int),
    "flushCommitLogThoroughInterval": ("flush_commitlog_thorough_interval_ms", int),
    "flushIntervalConsumeQueue": ("flush_interval_consume_queue_ms", int),
    "flushConsumeQueueLeastPages": ("flush_consume_queue_least_pages", int),
    "flushConsumeQueueThoroughInterval": ("flush_consume_queue_thorough_interval_ms", int),
    "syncFlushTimeout": ("sync_flush_timeout_ms", int),
    "fileReservedTime": ("file_reserved_hours", float),
    "deleteWhen": ("delete_when", str),
    "diskMaxUsedSpaceRatio": ("disk_max_used_ratio", lambda v: int(v) / 100.0),
    # RocketMQ 4 reads it as a ratio (0.90), RocketMQ 5 as a percentage (90): either works
    "diskSpaceWarningLevelRatio": ("disk_space_warning_level_ratio", lambda v: _ratio(v)),
    "diskSpaceCleanForciblyRatio": ("disk_clean_forcibly_ratio", lambda v: _ratio(v)),
    "cleanResourceInterval": ("clean_resource_interval_ms", int),
    "messageIndexEnable": ("message_index_enable", lambda v: v.strip().lower() == "true"),
    "checkCRCOnRecover": ("check_crc_on_recover", lambda v: v.strip().lower() == "true"),
    "messageDelayLevel": ("message_delay_level", str),
    "timerWheelEnable": ("timer_wheel_enable", lambda v: v.strip().lower() == "true"),
    "timerPrecisionMs": ("timer_precision_ms", int),
    "timerRollWindowSlot": ("timer_roll_window_slots", int),
    "timerMaxDelaySec": ("timer_max_delay_ms", lambda v: int(v) * 1000),
    "timerFlushIntervalMs": ("timer_flush_interval_ms", int),
    "mappedFileSizeTimerLog": ("timer_log_file_size", int),
}

# old spellings RocketMQ still reads -> the key they stand for
_SYNONYMS = {
    "mapedFileSizeCommitLog": "mappedFileSizeCommitLog",
    "mapedFileSizeConsumeQueue": "mappedFileSizeConsumeQueue",
}
# RocketMQ keys RayMQ leaves alone on purpose, and why
_NOT_READ = {
    "namesrvAddr": "brokers find their NameServers through Ray",
    "storePathCommitLog": "the CommitLog is always <storePathRootDir>/commitlog",
    "storePathConsumeQueue": "ConsumeQueues are always <storePathRootDir>/consumequeue",
    "storePathIndex": "index files are always <storePathRootDir>/index",
    "brokerIP2": "a slave reaches its master through Ray",
}

log = logging.getLogger("raymq.storage.config")


def _ratio(text: str) -> float:
    value = float(text)
    return value / 100.0 if value > 1 else value


DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@lru_cache(maxsize=64)
def parse_delay_levels(text: str) -> tuple[int, ...]:
    """RocketMQ's ``messageDelayLevel`` ("1s 5s ... 2h") as milliseconds per level.

    Units s, m, h, d as in RocketMQ, plus ms (handy for tests).
    """
    levels = []
    for word in text.split():
        unit = "ms" if word.endswith("ms") else word[-1:]
        number = word[: -len(unit)]
        if unit not in _UNITS_MS or not number.isdigit() or int(number) <= 0:
            raise InvalidConfigError(
                f"message_delay_level={text!r}: {word!r} is not a positive number with a unit "
                "in ms, s, m, h, d"
            )
        levels.append(int(number) * _UNITS_MS[unit])
    if not levels:
        raise InvalidConfigError("message_delay_level must name at least one level")
    return tuple(levels)


def parse_broker_conf(
    path: str | os.PathLike[str], known: AbstractSet[str] | None = None
) -> dict[str, str]:
    """Read a Java-properties style ``broker.conf`` into a dict of strings.

    An old spelling (``mapedFileSizeCommitLog``) comes back as the key it stands for,
    with a warning. With ``known``, the keys its reader reads, every other key gets a
    warning naming it (and why it is left alone, or what it may have meant to be); a
    reader of the whole file (``BrokerConfig.from_broker_conf``) passes every key of
    the broker and the store, so each unread key is named once.
    """
    result: dict[str, str] = {}
    for lineno, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep < 0:
            raise InvalidConfigError(f"{path}:{lineno}: expected key=value, got {raw!r}")
        key = line[:sep].strip()
        if key in _SYNONYMS:
            log.warning(
                "%s:%d: %s is the old spelling of %s: read as %s",
                path,
                lineno,
                key,
                _SYNONYMS[key],
                _SYNONYMS[key],
            )
            key = _SYNONYMS[key]
        elif known is not None and key in _NOT_READ:
            log.warning("%s:%d: %s is not read by RayMQ (%s)", path, lineno, key, _NOT_READ[key])
        elif known is not None and key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            log.warning(
                "%s:%d: %s is not a store setting: ignored%s",
                path,
                lineno,
                key,
                f" (did you mean {close[0]}?)" if close else "",
            )
        result[key] = line[sep + 1 :].strip()
    return result


@dataclass(frozen=True)
class StoreConfig:
    """Everything a :class:`storage.MessageStore` needs; defaults are RocketMQ's."""

    store_dir: str
    flush_disk_type: str = "ASYNC_FLUSH"
    commitlog_file_size: int = 1 << 30
    consume_queue_file_entries: int = 300_000
    index_hash_slots: int = 5_000_000
    index_max_entries: int = 20_000_000
    max_message_size: int = 4 << 20
    # ASYNC_FLUSH: FlushRealTimeService
    flush_interval_commitlog_ms: int = 500
    flush_commitlog_least_pages: int = 4
    flush_commitlog_thorough_interval_ms: int = 10_000
    # consume queues, index and checkpoint: FlushConsumeQueueService
    flush_interval_consume_queue_ms: int = 1_000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval_ms: int = 60_000
    sync_flush_timeout_ms: int = 5_000
    # expiry: CleanCommitLogService
    file_reserved_hours: float = 72.0
    delete_when: str = "04"
    # past disk_max_used_ratio, files older than file_reserved_hours go at any hour; past
    # disk_clean_forcibly_ratio (RocketMQ's diskSpaceCleanForciblyRatio), the oldest go
    # whatever their age. Ratios are of the space a writer can have, as df and RocketMQ
    # count it: used / (used + available)
    disk_max_used_ratio: float = 0.75
    disk_clean_forcibly_ratio: float = 0.85
    # writes: refused (DiskFullError) while the disk is used over this ratio
    disk_space_warning_level_ratio: float = 0.90
    clean_resource_interval_ms: int = 10_000
    delete_files_batch_max: int = 10
    # identity and recovery
    store_host: str = "127.0.0.1:10911"
    message_index_enable: bool = True
    check_crc_on_recover: bool = True
    preallocate: bool = True
    # delayed delivery: ScheduleMessageService
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    # timer messages at any time (storage.timer, RocketMQ 5's timer wheel): a slot per
    # precision on a ring of timer_wheel_slots (8 days at 1 s); times further than the
    # roll window (RocketMQ's 2 days, inside file_reserved_hours) are put again when the
    # window's end comes; later than timer_max_delay_ms from the put is refused
    timer_wheel_enable: bool = True
    timer_precision_ms: int = 1_000
    timer_wheel_slots: int = 8 * 86_400
    timer_roll_window_slots: int = 2 * 86_400
    timer_max_delay_ms: int = 30 * 86_400_000
    timer_interval_ms: int = 100
    timer_flush_interval_ms: int = 1_000
    timer_log_file_size: int = 16 << 20
    # idempotent producers (storage.producer_state): runs remembered per producer and
    # queue, how long a silent producer is remembered (Kafka: 7 days), and how often at
    # most the table is snapshotted with a checkpoint (recovery replays what follows)
    producer_state_keep_runs: int = 5
    producer_state_expire_ms: int = 7 * 86_400_000
    producer_snapshot_interval_ms: int = 10_000

    def __post_init__(self) -> None:
        if not self.store_dir:
            raise InvalidConfigError("store_dir must be a non-empty path")
        if self.flush_disk_type not in FLUSH_TYPES:
            raise InvalidConfigError(
                f"flush_disk_type={self.flush_disk_type!r}: must be one of {FLUSH_TYPES}"
            )
        if self.commitlog_file_size < 4096:
            raise InvalidConfigError(
                f"commitlog_file_size={self.commitlog_file_size}: must be >= 4096"
            )
        if not 0 < self.max_message_size <= self.commitlog_file_size - 4096:
            raise InvalidConfigError(
                f"max_message_size={self.max_message_size}: must be in "
                f"(0, commitlog_file_size - 4096 = {self.commitlog_file_size - 4096}]"
            )
        for name in (
            "consume_queue_file_entries",
            "index_hash_slots",
            "index_max_entries",
            "producer_state_keep_runs",
            "producer_state_expire_ms",
            "timer_precision_ms",
            "timer_interval_ms",
            "timer_max_delay_ms",
        ):
            if getattr(self, name) < 1:
                raise InvalidConfigError(f"{name}={getattr(self, name)}: must be >= 1")
        for name in (
            "disk_max_used_ratio",
            "disk_clean_forcibly_ratio",
            "disk_space_warning_level_ratio",
        ):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise InvalidConfigError(f"{name}={getattr(self, name)}: must be in (0, 1]")
        host, _, port = self.store_host.rpartition(":")
        parts = host.split(".")
        if (
            len(parts) != 4
            or not all(p.isdigit() and int(p) < 256 for p in parts)
            or not port.isdigit()
            or int(port) >= 65536
        ):
            raise InvalidConfigError(f"store_host={self.store_host!r}: must be 'a.b.c.d:port'")
        parse_delay_levels(self.message_delay_level)
        if not 2 <= self.timer_roll_window_slots < self.timer_wheel_slots:
            raise InvalidConfigError(
                f"timer_roll_window_slots={self.timer_roll_window_slots}: must be in "
                f"[2, timer_wheel_slots={self.timer_wheel_slots})"
            )
        if self.timer_log_file_size < 4096:
            raise InvalidConfigError(
                f"timer_log_file_size={self.timer_log_file_size}: must be >= 4096"
            )
        for hour in self.delete_when.split(";"):
            if not (hour.strip().isdigit() and 0 <= int(hour) < 24):
                raise InvalidConfigError(
                    f"delete_when={self.delete_when!r}: must be hours 00-23 separated by ';'"
                )

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.message_delay_level)

    @property
    def sync_flush(self) -> bool:
        return self.flush_disk_type == "SYNC_FLUSH"

    def replace(self, **changes: Any) -> StoreConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_broker_conf(cls, path: str | os.PathLike[str], **overrides: Any) -> StoreConfig:
        """Load the store's keys from a RocketMQ ``broker.conf``; ``overrides`` win."""
        values: dict[str, Any] = {}
        for key, text in parse_broker_conf(path, _CONF_KEYS.keys()).items():
            if key in _CONF_KEYS:
                field, convert = _CONF_KEYS[key]
                try:
                    values[field] = convert(text)
                except ValueError as exc:
                    raise InvalidConfigError(f"{path}: {key}={text!r}: {exc}") from exc
        values.update(overrides)
        if "store_dir" not in values:
            values["store_dir"] = str(Path.home() / "store")
        return cls(**values)
