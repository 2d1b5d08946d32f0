"""The console's pages as HTML: pure functions from what the admin client answered to
text. Every value from the cluster is escaped; no inline script or style (the
console's Content-Security-Policy allows only its own files)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from actors.protocol.topic import perm_to_string

NAV = (
    ("cluster", "/", "Cluster"),
    ("topics", "/topics", "Topics"),
    ("groups", "/groups", "Consumer groups"),
    ("messages", "/messages", "Messages"),
    ("dlq", "/dlq", "Dead letters"),
    ("transactions", "/transactions", "Transactions"),
)
HEX_LIMIT = 64 << 10
"""The hex view shows at most this much of a body."""


def e(value: object) -> str:
    return escape(str(value), quote=True)


def url(path: str, **query: object) -> str:
    params = {k: v for k, v in query.items() if v not in (None, "")}
    return path + ("?" + urlencode(params) if params else "")


def seg(value: str) -> str:
    """A name as one path segment."""
    return quote(value, safe="")


def when(ms: int | float | None) -> str:
    if not ms:
        return ""
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{int(ms) % 1000:03d}Z"


def size(n: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def layout(
    title: str,
    body: str,
    *,
    active: str,
    namespace: str,
    notice: str | None = None,
    error: str | None = None,
) -> str:
    nav = "".join(
        f'<a href="{href}"{" class=active" if key == active else ""}>{e(label)}</a>'
        for key, href, label in NAV
    )
    flashes = ""
    if notice:
        flashes += f'<div class="flash ok" id="notice" role="status">{e(notice)}</div>'
    if error:
        flashes += f'<div class="flash error" id="error" role="alert">{e(error)}</div>'
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} · RayMQ console</title>"
        '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">'
        '<link rel="stylesheet" href="/static/console.css">'
        '<script src="/static/console.js" defer></script>'
        "</head><body>"
        f'<header><span class="brand">RayMQ</span><nav>{nav}</nav>'
        f'<span class="ns">namespace <code>{e(namespace)}</code></span></header>'
        f"<main><h1>{e(title)}</h1>{flashes}{body}</main></body></html>"
    )


def table(
    rows: Iterable[Sequence[str]],
    headers: Sequence[str],
    *,
    numeric: Sequence[int] = (),
    id: str | None = None,
    empty: str = "none",
) -> str:
    """``rows`` hold HTML already escaped; columns in ``numeric`` are right-aligned."""
    rows = list(rows)
    if not rows:
        return f'<p class="muted"{f" id={e(id)}" if id else ""}>({e(empty)})</p>'
    head = "".join(
        f"<th{' class=num' if i in numeric else ''}>{e(h)}</th>" for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=num' if i in numeric else ''}>{c}</td>" for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table{f' id={e(id)}' if id else ''}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def csrf_field(token: str) -> str:
    return f'<input type="hidden" name="csrf" value="{e(token)}">'


# ------------------------------------------------------------ cluster
def cluster_page(status: dict[str, Any]) -> str:
    ns_rows = [
        (
            e(n["name"]),
            '<span class="good">alive</span>' if n["alive"] else '<span class="bad">down</span>',
            e(", ".join(n.get("brokers", [])) or n.get("error", "")),
            e(n.get("uptime_s", "")),
        )
        for n in status["nameservers"]
    ]
    broker_rows = []
    for b in status["brokers"]:
        if "error" in b:
            broker_rows.append(
                (e(b["broker_name"]), e(b["broker_id"]), '<span class="bad">?</span>')
                + ("",) * 7
                + (e(b["error"]),)
            )
            continue
        disk = f"{100 * b['disk_used_ratio']:.0f}% of {size(b['disk_total'])}"
        if b.get("disk_full"):
            disk += ' <span class="bad">full</span>'
        broker_rows.append(
            (
                e(b["broker_name"]),
                e(b["broker_id"]),
                e(f"{b['role']} ({b.get('broker_role', '')})"),
                f"<code>{e(b.get('data_addr') or 'Ray only')}</code>",
                f"<code>{e(b['addr'])}</code>",
                f'<span class="mono" title="{e(b["node_id"])}">{e(b["node_id"][:12])}</span>'
                f" {e(b.get('node_ip', ''))}",
                disk,
                e(f"{b['commitlog_max_offset']:,}"),
                e(b["topics"]),
                e(f"{b.get('put_msgs', 0):,}"),
                f"<code>{e(b['store_dir'])}</code>",
            )
        )
    return (
        "<h2>NameServers</h2>"
        + table(ns_rows, ["name", "state", "brokers", "uptime (s)"], id="nameservers")
        + "<h2>Brokers</h2>"
        + table(
            broker_rows,
            [
                "broker",
                "id",
                "role",
                "data path",
                "store host",
                "node",
                "disk",
                "commitlog offset",
                "topics",
                "messages put",
                "store dir",
            ],
            numeric=(1, 7, 8, 9),
            id="brokers",
        )
    )


# ------------------------------------------------------------ topics
def topics_page(
    topics: Sequence[dict[str, Any]], csrf: str, show_system: bool, form: dict[str, str]
) -> str:
    rows = [
        (
            f'<a href="/topics/{seg(t["name"])}">{e(t["name"])}</a>',
            e(t["read"]),
            e(t["write"]),
            e(t["perm"]),
            e(", ".join(t["brokers"])),
        )
        for t in topics
    ]
    toggle = (
        '<a href="/topics">hide system topics</a>'
        if show_system
        else '<a href="/topics?system=1">show system topics</a>'
    )
    return (
        '<form class="panel" method="post" action="/topics" id="create-topic">'
        + csrf_field(csrf)
        + f'<label>topic <input name="name" required maxlength="127" value="{e(form.get("name", ""))}"></label>'
        + f'<label>read queues <input name="read_queues" value="{e(form.get("read_queues", "8"))}" size="4"></label>'
        + f'<label>write queues <input name="write_queues" value="{e(form.get("write_queues", "8"))}" size="4"></label>'
        + '<label>perm <select name="perm">'
        + "".join(
            f'<option value="{v}"{" selected" if form.get("perm", "6") == str(v) else ""}>{e(label)}</option>'
            for v, label in ((6, "read + write (6)"), (4, "read only (4)"), (2, "write only (2)"))
        )
        + "</select></label>"
        + '<button type="submit">Create topic</button></form>'
        + f"<p>{toggle}</p>"
        + table(
            rows,
            ["topic", "read queues", "write queues", "perm", "brokers"],
            numeric=(1, 2),
            id="topics",
            empty="no topics",
        )
    )


def topic_page(
    topic: str,
    route: Sequence[dict[str, Any]],
    queues: Sequence[dict[str, Any]],
    csrf: str,
    max_body: int,
    form: dict[str, str],
) -> str:
    route_rows = [
        (
            e(r["broker"]),
            e(r["read"]),
            e(r["write"]),
            e(perm_to_string(r["perm"])),
        )
        for r in route
    ]
    total = sum(q["max_offset"] - q["min_offset"] for q in queues)
    queue_rows = [
        (
            e(q["broker"]),
            e(q["queue_id"]),
            e(q["min_offset"]),
            e(q["max_offset"]),
            e(when(q.get("last_update_ms"))),
        )
        for q in queues
    ]
    return (
        "<h2>Brokers</h2>"
        + table(route_rows, ["broker", "read queues", "write queues", "perm"], id="route")
        + f'<h2>Queues <span class="muted">({e(total)} messages held)</span></h2>'
        + table(
            queue_rows,
            ["broker", "queue", "min offset", "max offset", "last stored"],
            numeric=(1, 2, 3),
            id="queues",
        )
        + "<h2>Send a test message</h2>"
        + f'<form class="panel" method="post" action="/topics/{seg(topic)}/send" id="send-message">'
        + csrf_field(csrf)
        + f'<label>body (at most {e(size(max_body))}) <textarea name="body">{e(form.get("body", ""))}</textarea></label>'
        + f'<label>tags <input name="tags" value="{e(form.get("tags", ""))}"></label>'
        + f'<label>keys (comma-separated) <input name="keys" value="{e(form.get("keys", ""))}"></label>'
        + '<button type="submit">Send</button></form>'
        + change_topic_forms(topic, route, csrf)
    )


def change_topic_forms(topic: str, route: Sequence[dict[str, Any]], csrf: str) -> str:
    """Update a topic's queue counts and perm on every broker holding it, or delete it."""
    first = route[0] if route else {"read": 8, "write": 8, "perm": 6}
    perms = "".join(
        f'<option value="{v}"{" selected" if first["perm"] == v else ""}>{e(label)}</option>'
        for v, label in ((6, "read + write (6)"), (4, "read only (4)"), (2, "write only (2)"))
    )
    return (
        "<h2>Change</h2>"
        f'<form class="panel" method="post" action="/topics/{seg(topic)}/update" id="update-topic">'
        + csrf_field(csrf)
        + f'<label>read queues <input name="read_queues" value="{e(first["read"])}" size="4"></label>'
        + f'<label>write queues <input name="write_queues" value="{e(first["write"])}" size="4"></label>'
        + f'<label>perm <select name="perm">{perms}</select></label>'
        '<button type="submit">Update on every broker</button></form>'
        f'<form class="panel" method="post" action="/topics/{seg(topic)}/delete" id="delete-topic" '
        f'data-confirm="Delete topic {e(topic)}? Its config and offsets go; stored messages '
        'expire as usual.">'
        + csrf_field(csrf)
        + '<button type="submit">Delete topic</button></form>'
    )


# ------------------------------------------------------------ groups
def groups_page(groups: Sequence[dict[str, Any]]) -> str:
    rows = [
        (
            f'<a href="/groups/{seg(g["name"])}">{e(g["name"])}</a>',
            e(", ".join(g["seen_as"])),
        )
        for g in groups
    ]
    return (
        '<form class="panel" method="get" action="/groups" id="find-group">'
        '<label>group <input name="group" required maxlength="120"></label>'
        '<button type="submit">Show</button></form>'
        + table(rows, ["group", "known from"], id="groups", empty="no group known yet")
        + '<p class="muted">A group shows here once it has a coordinator, retries or dead '
        "letters; any other group (a pull consumer's) opens by name.</p>"
    )


def group_page(
    group: str,
    lag: Sequence[dict[str, Any]],
    members: Sequence[str],
    status: dict[str, Any] | None,
    refresh_ms: int,
    csrf: str,
) -> str:
    total = sum(r["lag"] for r in lag)
    lag_rows = [
        (
            f'<a href="/topics/{seg(r["topic"])}">{e(r["topic"])}</a>',
            e(r["broker"]),
            e(r["queue_id"]),
            e(r["broker_offset"]),
            e(r["consumer_offset"]),
            f'<span class="{"bad" if r["lag"] else "good"}">{e(r["lag"])}</span>',
        )
        for r in lag
    ]
    live = (
        f'<div id="live" data-refresh-ms="{refresh_ms}">'
        f'<p>total lag <span class="total" id="total-lag">{total}</span></p>'
        + table(
            lag_rows,
            ["topic", "broker", "queue", "broker offset", "consumer offset", "lag"],
            numeric=(2, 3, 4, 5),
            id="lag",
            empty="no committed offsets",
        )
        + "<h2>Members</h2>"
        + table([(e(m),) for m in members], ["client id"], id="members", empty="no consumer online")
    )
    if status is not None:
        owner_rows = [
            (
                e(f"{q.topic}:{q.broker_name}:{q.queue_id}"),
                e(owner),
                e(f"{token[0]}/{token[1]}"),
            )
            for q, (owner, token) in sorted(status["assignment"].items())
        ]
        log_rows = [
            (
                e(round(ev.time, 3)),
                e(ev.generation),
                e(ev.event),
                e(f"{ev.queue.topic}:{ev.queue.broker_name}:{ev.queue.queue_id}")
                if ev.queue is not None
                else "",
                e(ev.from_id or ""),
                e(ev.to_id or ""),
            )
            for ev in status["log"][-20:]
        ]
        live += (
            f"<h2>Coordinator: generation {e(status['generation'])}, "
            f"strategy {e(status['strategy'])}</h2>"
            + table(owner_rows, ["queue", "owner", "fencing token"], id="owners")
            + "<h2>Generation log (last 20)</h2>"
            + table(log_rows, ["t", "generation", "event", "queue", "from", "to"], id="genlog")
        )
    live += "</div>"
    return (
        live
        + f'<p class="muted" id="live-refreshed">refreshes every {refresh_ms / 1000:g} s</p>'
        + f'<p><a href="{url("/dlq", group=group)}">dead letters of {e(group)}</a></p>'
        + reset_form(group, sorted({r["topic"] for r in lag}), csrf)
    )


def reset_form(group: str, topics: Sequence[str], csrf: str) -> str:
    """Move the group on a topic to the earliest, the latest or a time (backtrack)."""
    if not topics:
        return ""
    options = "".join(f'<option value="{e(t)}">{e(t)}</option>' for t in topics)
    return (
        "<h2>Reset offsets</h2>"
        f'<form class="panel" method="post" action="/groups/{seg(group)}/reset" id="reset" '
        f'data-confirm="Move group {e(group)} to the chosen position? Its consumers follow.">'
        + csrf_field(csrf)
        + f'<label>topic <select name="topic">{options}</select></label>'
        '<label>to <select name="to"><option value="earliest">earliest</option>'
        '<option value="latest">latest</option><option value="time">a time</option></select></label>'
        '<label>time (UTC, with "a time") <input name="time" type="datetime-local" step="1"></label>'
        '<button type="submit">Reset</button></form>'
    )


# ------------------------------------------------------------ messages
def message_rows(messages: Sequence[Any]) -> list[tuple[str, ...]]:
    return [
        (
            f'<a class="mono" href="{url("/message", id=m.offset_msg_id, topic=m.topic)}">'
            f"{e(m.msg_id)}</a>",
            e(m.topic),
            e(f"{m.queue_id}@{m.queue_offset}"),
            e(m.tags or ""),
            e(" ".join(m.keys)),
            e(when(m.store_timestamp)),
            e(preview(m.body)),
        )
        for m in messages
    ]


def preview(body: bytes, limit: int = 80) -> str:
    text = body[:limit].decode("utf-8", "replace")
    return text + ("…" if len(body) > limit else "")


def messages_page(form: dict[str, str], found: Sequence[Any] | None) -> str:
    out = (
        '<form class="panel" method="get" action="/messages" id="by-key">'
        f'<label>topic <input name="topic" value="{e(form.get("topic", ""))}" required></label>'
        f'<label>key <input name="key" value="{e(form.get("key", ""))}" required></label>'
        f'<label>stored from (UTC) <input name="begin" type="datetime-local" step="1" value="{e(form.get("begin", ""))}"></label>'
        f'<label>to (UTC) <input name="end" type="datetime-local" step="1" value="{e(form.get("end", ""))}"></label>'
        '<button type="submit">Find by key</button></form>'
        '<form class="panel" method="get" action="/messages" id="by-id">'
        f'<label>message id <input name="id" size="40" value="{e(form.get("id", ""))}" required></label>'
        f'<label>topic (for a unique key) <input name="topic" value="{e(form.get("id_topic", ""))}"></label>'
        '<button type="submit">Find by id</button></form>'
    )
    if found is not None:
        out += f"<h2>{len(found)} message(s)</h2>" + table(
            message_rows(found),
            ["message id", "topic", "queue@offset", "tags", "keys", "stored", "body"],
            id="found",
            empty="nothing found",
        )
    return out


def hexdump(data: bytes) -> str:
    lines = []
    for off in range(0, len(data), 16):
        chunk = data[off : off + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{off:08x}  {hexes:<47}  {text}")
    return "\n".join(lines)


def message_page(m: Any) -> str:
    fields = [
        ("topic", f'<a href="/topics/{seg(m.topic)}">{e(m.topic)}</a>'),
        ("message id", f"<code>{e(m.msg_id)}</code>"),
        ("offset message id", f"<code>{e(m.offset_msg_id)}</code>"),
        ("queue", e(f"{m.queue_id} offset {m.queue_offset}")),
        ("commitlog offset", e(m.commitlog_offset)),
        ("tags", e(m.tags or "")),
        ("keys", e(" ".join(m.keys))),
        ("born", e(when(m.born_timestamp))),
        ("stored", e(when(m.store_timestamp))),
        ("reconsume times", e(m.reconsume_times)),
        ("body size", e(f"{len(m.body)} bytes")),
    ]
    props = [(e(k), f"<code>{e(v)}</code>") for k, v in sorted(m.properties.items())]
    shown = m.body[:HEX_LIMIT]
    cut = (
        f'<p class="muted">first {size(HEX_LIMIT)} of {size(len(m.body))}</p>'
        if len(m.body) > HEX_LIMIT
        else ""
    )
    return (
        table(fields, ["field", "value"], id="fields")
        + "<h2>Properties</h2>"
        + table(props, ["name", "value"], id="properties")
        + "<h2>Body</h2>"
        + '<div class="tabs">'
        '<button type="button" class="secondary" data-tab="body-text" aria-pressed="true">text</button>'
        '<button type="button" class="secondary" data-tab="body-hex" aria-pressed="false">hex</button>'
        "</div>"
        + f'<pre id="body-text">{e(m.body.decode("utf-8", "replace"))}</pre>'
        + f'<pre id="body-hex" class="hidden">{e(hexdump(shown))}</pre>'
        + cut
    )


# ------------------------------------------------------------ dead letters
def dlq_page(group: str, letters: Sequence[Any] | None, csrf: str) -> str:
    out = (
        '<form class="panel" method="get" action="/dlq" id="find-dlq">'
        f'<label>group <input name="group" value="{e(group)}" required maxlength="120"></label>'
        '<button type="submit">List dead letters</button></form>'
    )
    if letters is None:
        return out
    rows = [
        (
            f'<a class="mono" href="{url("/message", id=m.offset_msg_id, topic=m.topic)}">'
            f"{e(m.msg_id)}</a>",
            e(m.properties.get("RETRY_TOPIC", "")),
            e(m.reconsume_times),
            e(m.tags or ""),
            e(" ".join(m.keys)),
            e(when(m.store_timestamp)),
            e(preview(m.body)),
            f'<form class="inline" method="post" action="/dlq/resend">{csrf_field(csrf)}'
            f'<input type="hidden" name="group" value="{e(group)}">'
            f'<input type="hidden" name="msg_id" value="{e(m.msg_id)}">'
            '<button type="submit" class="secondary">Resend</button></form>',
        )
        for m in letters
    ]
    out += f'<h2><span id="dlq-count">{len(letters)}</span> dead letter(s) of {e(group)}</h2>'
    out += table(
        rows,
        ["message id", "origin topic", "reconsume times", "tags", "keys", "stored", "body", ""],
        id="letters",
        empty="no dead letters",
    )
    if letters:
        out += (
            '<form method="post" action="/dlq/resend" id="resend-all" '
            f'data-confirm="Resend all {len(letters)} dead letters of {e(group)}?">'
            + csrf_field(csrf)
            + f'<input type="hidden" name="group" value="{e(group)}">'
            '<button type="submit">Resend all</button></form>'
            '<p class="muted">A resend stores each letter again in its origin topic (same id '
            "and keys, reconsume count 0); the dead letter itself stays in the DLQ, as in "
            "RocketMQ.</p>"
        )
    return out


# ------------------------------------------------------------ transactions
def transactions_page(pending: Sequence[dict[str, Any]], group: str) -> str:
    """Half messages waiting for their producer's commit or rollback (oldest first)."""
    out = (
        '<form class="panel" method="get" action="/transactions" id="find-txn">'
        f'<label>producer group <input name="group" value="{e(group)}" maxlength="120" '
        'placeholder="all"></label><button type="submit">Filter</button></form>'
    )
    rows = [
        (
            e(p["broker"]),
            f'<span class="mono">{e(p["msg_id"])}</span>',
            e(p["group"]),
            f'<a href="{url("/topics/" + seg(p["topic"]))}">{e(p["topic"])}</a>',
            e(f"{p['age_s']:.1f} s"),
            e(p["check_times"]),
        )
        for p in pending
    ]
    out += f'<h2><span id="txn-count">{len(pending)}</span> pending transaction(s)</h2>'
    out += table(
        rows,
        ["broker", "message id", "producer group", "topic", "age", "checks"],
        numeric=(4, 5),
        id="pending",
        empty="no transaction waits for an end",
    )
    return out + (
        '<p class="muted">A half message stays invisible to consumers until its producer '
        "commits or rolls it back; once older than the broker's <code>transaction_timeout_s"
        "</code> (or its own <code>CHECK_IMMUNITY_TIME_IN_SECONDS</code>) the broker asks a "
        "live producer of its group, and after <code>transaction_check_max</code> checks "
        "discards it to <code>TRANS_CHECK_MAX_TIME_TOPIC</code>.</p>"
    )


# ------------------------------------------------------------ access
def login_page(csrf: str, next_path: str = "/") -> str:
    return (
        f'<form class="panel" method="post" action="{e(url("/login", next=next_path))}" id="login">'
        + csrf_field(csrf)
        + '<label>token <input name="token" type="password" required autofocus></label>'
        '<button type="submit">Sign in</button></form>'
    )
