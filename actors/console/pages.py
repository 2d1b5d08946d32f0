"""The console's pages as HTML: pure functions from what the admin client answered to
text. Every value from the cluster is escaped; no inline script or style (the
console's Content-Security-Policy allows only its own files)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from actors.console.sampler import Series
from actors.protocol.topic import perm_to_string

NAV = (
    ("cluster", "/", "Cluster"),
    ("topics", "/topics", "Topics"),
    ("groups", "/groups", "Consumer groups"),
    ("messages", "/messages", "Messages"),
    ("dlq", "/dlq", "Dead letters"),
    ("transactions", "/transactions", "Transactions"),
    ("metrics", "/metrics-charts", "Metrics"),
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
def rate(value: float | None) -> str:
    """A rate as the pages show it ("" when not sampled yet)."""
    if value is None:
        return ""
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def cluster_page(status: dict[str, Any], rates: Mapping[str, Mapping[str, float]]) -> str:
    ns_rows = [
        (
            e(n["name"]),
            '<span class="good">alive</span>' if n["alive"] else '<span class="bad">down</span>',
            e(", ".join(n.get("brokers", [])) or n.get("error", "")),
            e(n.get("uptime_s", "")),
        )
        for n in status["nameservers"]
    ]
    broker_rows: list[tuple[str, ...]] = []
    for b in status["brokers"]:
        if "error" in b:
            broker_rows.append(
                (e(b["broker_name"]), e(b["broker_id"]), '<span class="bad">?</span>')
                + ("",) * 10
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
                e(rate(r["put_tps"])) if (r := _rates_of(b, rates)) else "",
                e(rate(r["get_tps"])) if r else "",
                e(f"{r['put_ms']:.2f}") if r else "",
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
                "put TPS",
                "get TPS",
                "put ms",
                "store dir",
            ],
            numeric=(1, 7, 8, 9, 10, 11, 12),
            id="brokers",
        )
        + raft_tables(status["brokers"])
    )


def _rates_of(b: dict[str, Any], rates: Mapping[str, Mapping[str, float]]) -> Any:
    """A master's sampled rates (a slave serves no puts: none)."""
    if b.get("role") != "MASTER":
        return None
    return rates.get(b["broker_name"])


def raft_tables(brokers: Sequence[dict[str, Any]]) -> str:
    """Each Raft (DLedger) group: every member's role, term and indexes, and the
    match index the leader holds for it."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for b in brokers:
        if "raft_role" in b:
            groups.setdefault(b["broker_name"], []).append(b)
    out = ""
    for name, members in sorted(groups.items()):
        leaders = [m for m in members if m["raft_role"] == "leader"]
        match = leaders[0].get("match_index", {}) if leaders else {}
        term = max(m["term"] for m in members)
        leader = leaders[0]["actor_name"] if leaders else "(electing)"
        rows = [
            (
                e(m["actor_name"]),
                e(m["raft_role"]),
                e(m["term"]),
                e(m.get("leader") or ""),
                e(m["commit_index"]),
                e(m["last_index"]),
                e(m["last_index"] if m in leaders else match.get(m["actor_name"], "")),
            )
            for m in sorted(members, key=lambda m: m["actor_name"])
        ]
        out += (
            f'<h2>Raft group {e(name)}: term <span class="raft-term">{e(term)}</span>, '
            f'leader <span class="raft-leader">{e(leader)}</span></h2>'
            + table(
                rows,
                ["member", "role", "term", "leader", "commit index", "last index", "match index"],
                numeric=(2, 4, 5, 6),
                id=f"raft-{name}",
            )
        )
    return out


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
            e(f"{t['messages']:,}") if t.get("messages") is not None else "",
            e(rate(t.get("tps"))),
            e(t.get("type", "")),
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
        + '<label>type <select name="type">'
        + "".join(
            f'<option value="{v}"{" selected" if form.get("type", "NORMAL") == v else ""}>{e(label)}</option>'
            for v, label in (("NORMAL", "normal"), ("LITE", "LITE: a parent of lite topics"))
        )
        + "</select></label>"
        + f'<label>LITE quota <input name="quota" value="{e(form.get("quota", ""))}" size="8" placeholder="default"></label>'
        + f'<label>LITE TTL (ms) <input name="ttl_ms" value="{e(form.get("ttl_ms", ""))}" size="10" placeholder="default"></label>'
        + '<button type="submit">Create topic</button></form>'
        + f"<p>{toggle}</p>"
        + table(
            rows,
            ["topic", "read queues", "write queues", "perm", "brokers", "messages", "TPS", "type"],
            numeric=(1, 2, 5, 6),
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
    consume_tps: float | None = None,
    fleet: dict[str, Any] | None = None,
    lag_series: Series | None = None,
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
        f'<p>total lag <span class="total" id="total-lag">{total}</span> · consume TPS '
        f'<span class="total" id="consume-tps">{e(rate(consume_tps) or "0")}</span></p>'
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
    if fleet is not None:
        live += fleet_part(fleet, lag_series or {})
    live += "</div>"
    return (
        live
        + f'<p class="muted" id="live-refreshed">refreshes every {refresh_ms / 1000:g} s</p>'
        + f'<p><a href="{url("/dlq", group=group)}">dead letters of {e(group)}</a></p>'
        + reset_form(group, sorted({r["topic"] for r in lag}), csrf)
    )


def fleet_part(fleet: dict[str, Any], lag_series: Series) -> str:
    """A consumer fleet's size, members, scaling events and lag chart."""
    summary = [
        ("size", e(fleet["size"])),
        ("running", e(fleet["running"])),
        ("pending", e(fleet["pending"])),
        ("target size", e(fleet["target_size"])),
        ("min / max", e(f"{fleet['min_consumers']} / {fleet['max_consumers']}")),
        ("autoscale", e("on" if fleet["autoscale"] else "off (pinned)")),
        ("lag", e("" if fleet["lag"] is None else fleet["lag"])),
        ("consume rate (msg/s)", e(fleet["consume_rate"])),
        ("consumed", e(fleet["consumed"])),
    ]
    members = [
        (
            e(m.get("name", "")),
            e(m.get("state", "")),
            e(m.get("consume_rate", "")),
            e(", ".join(str(q) for q in m.get("queues", []))),
        )
        for m in fleet["members"]
    ]
    events = [
        (e(when(ev["time"] * 1000)), e(ev["kind"]), e(ev["detail"])) for ev in fleet["events"][-20:]
    ]
    return (
        f"<h2>Fleet <code>{e(fleet['group'])}</code> on {e(fleet['topic'])}</h2>"
        + table(summary, ["", ""], id="fleet")
        + table(
            members, ["member", "state", "msg/s", "queues"], id="fleet-members", empty="no member"
        )
        + "<h3>Scaling events (last 20)</h3>"
        + table(events, ["time", "event", "detail"], id="fleet-events", empty="none yet")
        + chart("lag", lag_series, "messages", id="fleet-lag-chart")
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


def as_json(body: bytes) -> str | None:
    """The body pretty-printed, when it is a JSON object or array; else None."""
    if not body.lstrip().startswith((b"{", b"[")):
        return None
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(value, (dict, list)):
        return None
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def consumed_part(m: Any, consumed: Sequence[dict[str, Any]] | None, csrf: str) -> str:
    """Which groups consumed ``m`` (each group with offsets on its topic: is its
    committed offset past the message's queue offset?), and the resend-to-a-group form."""
    if consumed is None:
        return ""
    rows = [
        (
            f'<a href="/groups/{seg(c["group"])}">{e(c["group"])}</a>',
            e("" if c["committed"] is None else c["committed"]),
            '<span class="good">consumed</span>'
            if c["consumed"]
            else '<span class="bad">not yet</span>',
        )
        for c in consumed
    ]
    options = "".join(f'<option value="{e(c["group"])}">' for c in consumed)
    return (
        f"<h2>Consumed by <span class=muted>(queue {e(m.queue_id)} offset "
        f"{e(m.queue_offset)})</span></h2>"
        + table(
            rows,
            ["group", "committed offset", ""],
            numeric=(1,),
            id="consumed-by",
            empty="no group has offsets on this topic",
        )
        + "<h2>Resend to a group</h2>"
        + '<form class="panel" method="post" action="/message/resend" id="resend-to-group">'
        + csrf_field(csrf)
        + f'<input type="hidden" name="id" value="{e(m.offset_msg_id)}">'
        + f'<input type="hidden" name="topic" value="{e(m.topic)}">'
        + '<label>group <input name="group" list="known-groups" required maxlength="120"></label>'
        + f'<datalist id="known-groups">{options}</datalist>'
        + '<button type="submit">Resend</button></form>'
        + '<p class="muted">The copy goes to the group\'s retry topic (<code>%RETRY%group'
        "</code>): that group alone consumes it again, with the same message id.</p>"
    )


def message_page(m: Any, consumed: Sequence[dict[str, Any]] | None = None, csrf: str = "") -> str:
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
    parsed = as_json(m.body)
    json_tab = (
        '<button type="button" class="secondary" data-tab="body-json" aria-pressed="true">'
        "JSON</button>"
        if parsed is not None
        else ""
    )
    return (
        table(fields, ["field", "value"], id="fields")
        + "<h2>Properties</h2>"
        + table(props, ["name", "value"], id="properties")
        + "<h2>Body</h2>"
        + '<div class="tabs">'
        + json_tab
        + '<button type="button" class="secondary" data-tab="body-text" '
        f'aria-pressed="{"false" if parsed is not None else "true"}">text</button>'
        '<button type="button" class="secondary" data-tab="body-hex" aria-pressed="false">hex</button>'
        "</div>"
        + (f'<pre id="body-json">{e(parsed)}</pre>' if parsed is not None else "")
        + f'<pre id="body-text"{" class=hidden" if parsed is not None else ""}>'
        f"{e(m.body.decode('utf-8', 'replace'))}</pre>"
        + f'<pre id="body-hex" class="hidden">{e(hexdump(shown))}</pre>'
        + cut
        + consumed_part(m, consumed, csrf)
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
def transactions_page(
    pending: Sequence[dict[str, Any]], group: str, coordinator: dict[str, Any] | None = None
) -> str:
    """Half messages waiting for their producer's commit or rollback (oldest first),
    then the transaction coordinator of multi-message transactions."""
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
    return (
        out
        + (
            '<p class="muted">A half message stays invisible to consumers until its producer '
            "commits or rolls it back; once older than the broker's <code>transaction_timeout_s"
            "</code> (or its own <code>CHECK_IMMUNITY_TIME_IN_SECONDS</code>) the broker asks a "
            "live producer of its group, and after <code>transaction_check_max</code> checks "
            "discards it to <code>TRANS_CHECK_MAX_TIME_TOPIC</code>.</p>"
        )
        + coordinator_part(coordinator)
    )


def coordinator_part(status: dict[str, Any] | None) -> str:
    """The transaction coordinator: its counters, the transactional ids it knows with
    their producer id and epoch, and the decisions a broker has yet to apply."""
    out = "<h2>Transaction coordinator (multi-message transactions)</h2>"
    if status is None:
        return out + (
            '<p class="muted" id="coordinator-none">No transaction coordinator runs: the '
            "first <code>TransactionalProducer</code> starts it.</p>"
        )
    if "unanswered" in status:
        return out + (
            f'<p class="muted" id="coordinator-none">The transaction coordinator did not '
            f"answer ({e(status['unanswered'])}): it may be restarting.</p>"
        )
    summary = [
        ("log", f'<span class="mono">{e(status["log"])}</span>'),
        ("decisions not applied everywhere yet", e(len(status["pending"]))),
        ("found to apply at its last start", e(status["recovered"])),
        *((e(k), e(v)) for k, v in sorted(status["stats"].items())),
    ]
    producers = [
        (f'<span class="mono">{e(tid)}</span>', f'<span class="mono">{e(pid)}</span>', e(epoch))
        for tid, (pid, epoch) in sorted(status["producers"].items())
    ]
    undone = [(f'<span class="mono">{e(t)}</span>',) for t in status["pending"]]
    alone = [(e(b), e(n)) for b, n in sorted(status.get("one_phase", {}).items())]
    return (
        out
        + table(summary, ["", ""], id="coordinator")
        + table(
            producers,
            ["transactional id", "producer id", "epoch"],
            numeric=(2,),
            id="txn-producers",
            empty="no transactional producer yet",
        )
        + table(undone, ["decided, not applied yet"], id="txn-undone", empty="none")
        + "<h3>Committed by one broker alone (one-phase: no coordinator)</h3>"
        + table(
            alone,
            ["broker", "transactions since its start"],
            numeric=(1,),
            id="txn-one-phase",
            empty="no broker",
        )
    )


# ------------------------------------------------------------ access
def login_page(csrf: str, next_path: str = "/") -> str:
    return (
        f'<form class="panel" method="post" action="{e(url("/login", next=next_path))}" id="login">'
        + csrf_field(csrf)
        + '<label>token <input name="token" type="password" required autofocus></label>'
        '<button type="submit">Sign in</button></form>'
    )


# ------------------------------------------------------------ charts and metrics
CHART_W, CHART_H, CHART_PAD = 560, 150, 4
COLORS = ("#2457c5", "#c2410c", "#15803d", "#7c3aed", "#b91c1c", "#0e7490", "#a16207", "#be185d")


def chart(title: str, series: Series, unit: str, *, id: str) -> str:
    """Lines as an inline SVG (no script, no style attribute: the CSP holds), with the
    newest value of each line in its legend. ``data-points`` counts the points drawn."""
    lines = {name: pts for name, pts in sorted(series.items()) if pts}
    points = sum(len(p) for p in lines.values())
    if not lines:
        return (
            f'<figure class="chart" id="{e(id)}" data-points="0"><figcaption>{e(title)}'
            '</figcaption><p class="muted">no samples yet</p></figure>'
        )
    t0 = min(t for pts in lines.values() for t, _ in pts)
    t1 = max(t for pts in lines.values() for t, _ in pts)
    top = max(max(v for _, v in pts) for pts in lines.values())
    top = top * 1.1 if top > 0 else 1.0
    span = max(t1 - t0, 1e-3)
    w, h, pad = CHART_W, CHART_H, CHART_PAD

    def xy(t: float, v: float) -> str:
        x = pad + (t - t0) / span * (w - 2 * pad)
        y = h - pad - v / top * (h - 2 * pad)
        return f"{x:.1f},{y:.1f}"

    drawn = ""
    legend = ""
    for i, (name, pts) in enumerate(lines.items()):
        color = COLORS[i % len(COLORS)]
        coords = " ".join(xy(t, v) for t, v in pts)
        if len(pts) == 1:  # one point: a dot
            x, y = xy(*pts[0]).split(",")
            drawn += f'<circle cx="{x}" cy="{y}" r="2.5" fill="{color}"/>'
        else:
            drawn += (
                f'<polyline points="{coords}" fill="none" stroke="{color}" '
                'stroke-width="1.6" stroke-linejoin="round"/>'
            )
        last = pts[-1][1]
        legend += (
            f'<li><svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" '
            f'fill="{color}"/></svg> {e(name)} <b>{e(rate(last))}</b></li>'
        )
    grid = "".join(
        f'<line x1="{pad}" x2="{w - pad}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e7ef"/>'
        for y in (pad, pad + (h - 2 * pad) / 2, h - pad)
    )
    return (
        f'<figure class="chart" id="{e(id)}" data-points="{points}">'
        f"<figcaption>{e(title)} <span class=muted>({e(unit)}; top {e(rate(top))}, "
        f"last {e(f'{span:.0f}')} s)</span></figcaption>"
        f'<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        f'aria-label="{e(title)}">{grid}{drawn}</svg>'
        f'<ul class="legend">{legend}</ul></figure>'
    )


def metrics_page(
    series: dict[str, Series],
    samples: int,
    interval_s: float,
    refresh_ms: int,
    failing: str | None = None,
) -> str:
    return (
        f'<div id="charts" data-refresh-ms="{refresh_ms}">'
        f'<p class="muted">{e(samples)} sample(s) of the brokers\' own counters, one every '
        f"{e(f'{interval_s:g}')} s (the console keeps a bounded ring of them)</p>"
        + (
            f'<p class="bad" id="sampling-error">sampling fails: {e(failing)}</p>'
            if failing
            else ""
        )
        + '<div class="charts">'
        + chart("put TPS per broker", series["put_tps"], "messages/s", id="chart-put-tps")
        + chart("get TPS per broker", series["get_tps"], "messages/s", id="chart-get-tps")
        + chart("put latency per broker (mean)", series["put_ms"], "ms", id="chart-put-ms")
        + chart("lag per group", series["lag"], "messages", id="chart-lag")
        + chart("consume TPS per group", series["consume_tps"], "messages/s", id="chart-consume")
        + "</div></div>"
        + '<p class="muted" id="charts-refreshed"></p>'
    )


# ------------------------------------------------------------ long operations
def job_page(job: dict[str, Any]) -> str:
    """A job's progress bar; the script polls ``/jobs/<id>/progress`` until it ends."""
    state_class = {"done": "good", "failed": "bad"}.get(job["state"], "")
    return (
        f'<div class="job" id="job" data-job="/jobs/{e(seg(job["id"]))}/progress">'
        f"<p>{e(job['kind'])}: {e(job['what'])}</p>"
        f'<progress id="job-progress" max="{e(max(job["total"], 1))}" '
        f'value="{e(job["done"] if job["state"] != "done" else max(job["total"], 1))}"></progress> '
        f'<span id="job-percent">{e(job["percent"])}%</span> '
        f'<span class="muted" id="job-count">{e(job["done"])} of {e(job["total"])}</span>'
        f'<p>state <span id="job-state" class="{state_class}">{e(job["state"])}</span></p>'
        f'<p id="job-message">{e(job["message"])}</p>'
        f'<p><a id="job-back" href="{e(job["back"])}">back</a></p></div>'
    )
