"""Java's string semantics where RocketMQ's results depend on them.

RocketMQ sorts consumer ids and queue names with ``String.compareTo`` (UTF-16
code units), hashes ``String.getBytes()`` (UTF-8 on current JVMs) and splits
broker names with ``String.split`` (trailing empty parts dropped). Matching
them keeps our allocations equal to RocketMQ's for every input, not only ASCII.
"""


def java_string_key(text: str) -> bytes:
    """Sort key that orders strings as Java's ``String.compareTo`` does.

    UTF-16-BE bytes compare exactly as UTF-16 code units; Python's own order
    (code points) differs once characters above U+FFFF are involved.
    """
    return text.encode("utf-16-be", "surrogatepass")


def java_utf8(text: str) -> bytes:
    """``String.getBytes(UTF_8)``: an unpaired surrogate becomes ``?``."""
    return text.encode("utf-8", "replace")


def java_split(text: str, separator: str) -> list[str]:
    """``String.split`` on a literal separator.

    Trailing empty parts are dropped, except that a text without the separator
    is returned whole (so ``""`` gives ``[""]``, as in Java).
    """
    if separator not in text:
        return [text]
    parts = text.split(separator)
    while parts and not parts[-1]:
        parts.pop()
    return parts
