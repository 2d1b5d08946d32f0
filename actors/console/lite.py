"""The console's LITE parents: a parent's lite topics by page on its topic page, one
lite topic's offsets and its groups' offsets, lag and owner, its deletion, and a
parent's quota and TTL changed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from actors.console.core import CSRF, View
from actors.console.forms import Refused, topic_name
from actors.console.pages import csrf_field, e, seg, table, url, when
from storage.errors import TopicNotFoundError
from storage.lite import validate_lite_name

log = logging.getLogger("raymq.actors.console")

PAGE = 50
"""Lite topics a page lists."""
MAX_QUOTA = 1 << 40
MAX_TTL_MS = 1 << 50


def lite_name(text: str) -> str:
    try:
        return validate_lite_name(text)
    except ValueError as exc:
        raise Refused(f"{exc}; nothing was done") from None


def quota_ttl(form: dict[str, str]) -> tuple[int | None, int | None]:
    """A form's quota and TTL (blank: the brokers' defaults)."""
    out: list[int | None] = []
    for name, hi in (("quota", MAX_QUOTA), ("ttl_ms", MAX_TTL_MS)):
        text = form.get(name, "").strip()
        if not text:
            out.append(None)
            continue
        try:
            value = int(text)
        except ValueError:
            raise Refused(f"{name}={text!r}: a whole number 1..{hi}; nothing was done") from None
        if not 1 <= value <= hi:
            raise Refused(f"{name}={value}: must be in 1..{hi}; nothing was done")
        out.append(value)
    return out[0], out[1]


# ------------------------------------------------------------ HTML
def parent_section(parent: str, d: dict[str, Any], page: dict[str, Any], csrf: str) -> str:
    """A LITE parent's figures, one page of its lite topics and its settings form."""
    brokers = [
        (e(b), e(f"{v['lite_topics']:,}"), e(f"{v['quota']:,}"), e(v["ttl_ms"]))
        for b, v in d["brokers"].items()
    ]
    names = [
        (f'<a href="/topics/{seg(parent)}/lite/{seg(n)}">{e(n)}</a>',) for n in page["lite_topics"]
    ]
    more = (
        f'<a id="lite-next" href="{e(url(f"/topics/{seg(parent)}", after=page["next"]))}">'
        "next page</a>"
        if page["next"] is not None
        else ""
    )
    first = next(iter(d["brokers"].values()), {"quota": "", "ttl_ms": ""})
    return (
        '<h2>Lite topics <span class="muted" id="lite-summary">'
        f"({d['lite_topics']:,} of quota {d['quota']:,}, {d['quota_used']:.1%} used; "
        f"TTL {d['ttl_ms']:,} ms)</span></h2>"
        + table(
            brokers,
            ["broker", "lite topics", "quota", "TTL (ms)"],
            numeric=(1, 2, 3),
            id="lite-brokers",
        )
        + table(names, ["lite topic"], id="lite-topics", empty="no lite topics")
        + f'<p class="muted" id="lite-page">{len(page["lite_topics"])} shown of '
        f"{page['total']:,} {more}</p>"
        + f'<form class="panel" method="post" action="/topics/{seg(parent)}/lite-settings" '
        'id="lite-settings">'
        + csrf_field(csrf)
        + f'<label>quota (lite topics per broker) <input name="quota" value="{e(first["quota"])}" size="10"></label>'
        + f'<label>TTL after the last write (ms) <input name="ttl_ms" value="{e(first["ttl_ms"])}" size="12"></label>'
        + '<button type="submit">Change on every broker</button></form>'
    )


def lite_topic_page(parent: str, st: dict[str, Any], csrf: str) -> str:
    groups = [
        (e(g), e(v["committed_offset"]), e(v["lag"]), e(v["owner"] or ""))
        for g, v in st["groups"].items()
    ]
    name = st["lite_topic"]
    return (
        f'<p><a href="/topics/{seg(parent)}">back to {e(parent)}</a></p>'
        + table(
            [
                (
                    e(st["broker"]),
                    e(st["min_offset"]),
                    e(st["max_offset"]),
                    e(when(st["last_write_ms"])),
                )
            ],
            ["broker", "min offset", "max offset", "last write"],
            numeric=(1, 2),
            id="lite-offsets",
        )
        + "<h2>Consumer groups</h2>"
        + table(
            groups,
            ["group", "committed offset", "lag", "owner"],
            numeric=(1, 2),
            id="lite-groups",
            empty="no group consumes it",
        )
        + f'<form class="panel" method="post" action="/topics/{seg(parent)}/lite/{seg(name)}/delete" '
        f'id="delete-lite-topic" data-confirm="Delete lite topic {e(name)}? Its messages '
        "and its groups' offsets go now; a later send creates it anew from offset 0.\">"
        + csrf_field(csrf)
        + '<button type="submit">Delete lite topic</button></form>'
    )


# ------------------------------------------------------------ handlers
class LiteTopics(View):
    def _parent(self, parent: str, after: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        if parent not in self.admin.lite_parents():
            return None
        return (
            self.admin.describe_lite_topic(parent),
            self.admin.list_lite_topics(parent, after, PAGE),
        )

    async def section(self, request: web.Request, parent: str) -> str:
        """The topic page's part for a LITE parent ("" for another topic)."""
        after = request.query.get("after", "")
        if after:
            lite_name(after)
        found = await self.call(self._parent, parent, after)
        if found is None:
            return ""
        described, page = found
        return parent_section(parent, described, page, request[CSRF])

    async def _on_lite_topic(
        self, request: web.Request, fn: Callable[..., Any], unknown: str = ""
    ) -> tuple[str, str, Any]:
        """The parent and lite topic the URL names, and ``fn(parent, name)``'s answer
        from the cluster; one it does not know is refused 404 (``unknown`` after why)."""
        parent = topic_name(request.match_info["topic"])
        name = lite_name(request.match_info["lite"])
        try:
            return parent, name, await self.call(fn, parent, name)
        except TopicNotFoundError as exc:
            raise Refused(f"{exc}{unknown}", 404) from None

    async def lite_topic(self, request: web.Request) -> web.Response:
        parent, name, st = await self._on_lite_topic(request, self.admin.lite_topic_status)
        return self.render(
            request,
            f"Lite topic {name} of {parent}",
            lite_topic_page(parent, st, request[CSRF]),
            active="topics",
        )

    async def delete(self, request: web.Request) -> web.Response:
        parent, name, on = await self._on_lite_topic(
            request, self.admin.delete_lite_topic, ": nothing was deleted"
        )
        log.info("console: deleted lite topic %s of %s on %s", name, parent, on)
        return self.redirect(
            f"/topics/{seg(parent)}", f"deleted lite topic {name} of {parent} on {', '.join(on)}"
        )

    async def settings(self, request: web.Request) -> web.Response:
        parent = topic_name(request.match_info["topic"])
        form = {k: str(v) for k, v in (await request.post()).items() if k != "csrf"}
        quota, ttl_ms = quota_ttl(form)  # a refusal, as the cluster's, changes nothing
        if parent not in await self.call(self.admin.lite_parents):
            raise Refused(f"topic {parent!r} is not of type LITE: nothing was changed")
        await self.call(lambda: self.admin.create_lite_topic(parent, quota=quota, ttl_ms=ttl_ms))
        log.info("console: LITE topic %s: quota %s, TTL %s ms", parent, quota, ttl_ms)
        return self.redirect(
            f"/topics/{seg(parent)}", f"changed LITE topic {parent}: quota {quota}, TTL {ttl_ms} ms"
        )
