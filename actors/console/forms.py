"""The console's input checks: a form or a path segment the console will not act on is
refused with a :class:`Refused` that says why, before any call, so nothing changes."""

from __future__ import annotations

from datetime import datetime, timezone

from actors.client.admin import epoch_ms
from actors.protocol.checks import validate_group
from actors.protocol.topic import PERM_READ, PERM_WRITE
from storage.codec import validate_topic

MAX_QUEUES = 1024
MAX_ID_LEN = 128


class Refused(Exception):
    """Input the console will not act on; the page says why and nothing changes."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def topic_name(text: str) -> str:
    try:
        return validate_topic(text)
    except ValueError as exc:
        raise Refused(f"{exc}; nothing was done") from None


def group_name(text: str) -> str:
    try:
        return validate_group(text)
    except ValueError as exc:
        raise Refused(f"{exc}; nothing was done") from None


def message_id(text: str) -> str:
    text = text.strip()
    if not text or len(text) > MAX_ID_LEN or not all(c.isalnum() or c in "-_" for c in text):
        raise Refused(
            f"message id {text[:MAX_ID_LEN]!r}: letters, digits, - and _ only, 1..{MAX_ID_LEN}"
        )
    return text


def perm_field(form: dict[str, str]) -> int:
    perm = int_field(form, "perm", 0, 7)
    if perm not in (PERM_READ | PERM_WRITE, PERM_READ, PERM_WRITE):
        raise Refused(f"perm={perm}: 6 (read + write), 4 (read only) or 2 (write only)")
    return perm


def utc_ms(text: str, what: str) -> int:
    """A form's time (``2024-05-01T12:00[:00]``, UTC) as epoch milliseconds."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise Refused(f"{what}={text!r}: a time as 2024-05-01T12:00:00 (UTC)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return epoch_ms(moment, what)


def int_field(form: dict[str, str], name: str, lo: int, hi: int) -> int:
    text = form.get(name, "").strip()
    try:
        value = int(text)
    except ValueError:
        raise Refused(f"{name.replace('_', ' ')}={text!r}: a whole number {lo}..{hi}") from None
    if not lo <= value <= hi:
        raise Refused(f"{name.replace('_', ' ')}={value}: must be in {lo}..{hi}")
    return value
