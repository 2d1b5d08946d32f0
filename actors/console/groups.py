"""The console's consumer-group pages (members, lag, the offset reset), the long
operations' progress pages and the metrics charts."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from actors.console import pages
from actors.console.core import CSRF, View
from actors.console.forms import Refused, group_name, topic_name, utc_ms
from actors.console.jobs import Job, Progress
from actors.coordinator.host import coordinated_groups
from actors.protocol.topic import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX, dlq_topic
from storage.errors import RayMQError

log = logging.getLogger("raymq.actors.console")


class Groups(View):
    # ------------------------------------------------------------ groups
    def _known_groups(self) -> list[dict[str, Any]]:
        seen: dict[str, set[str]] = {}
        for group in coordinated_groups(self.config.namespace):
            seen.setdefault(group, set()).add("coordinator")
        for topic in self._all_topics():
            for p, what in ((RETRY_GROUP_TOPIC_PREFIX, "retries"), (DLQ_GROUP_TOPIC_PREFIX, "DLQ")):
                if topic.startswith(p):
                    seen.setdefault(topic[len(p) :], set()).add(what)
        return [{"name": g, "seen_as": sorted(s)} for g, s in sorted(seen.items())]

    async def groups(self, request: web.Request) -> web.Response:
        if "group" in request.query:  # the find form
            group = group_name(request.query["group"].strip())
            return self.redirect(f"/groups/{pages.seg(group)}")
        rows = await self.call(self._known_groups)
        return self.render(request, "Consumer groups", pages.groups_page(rows), active="groups")

    def _group_detail(self, group: str) -> tuple[list[Any], list[str], Any, bool, Any]:
        lag = self.admin.consumer_lag(group)
        members = self.admin.consumer_list(group)
        status = None
        if self.admin._coordinator(group) is not None:
            try:
                status = self.admin.group_status(group)
            except RayMQError:
                status = None
        has_dlq = dlq_topic(group) in self._all_topics()
        return lag, members, status, has_dlq, self.admin.fleet_status(group)

    async def group(self, request: web.Request) -> web.Response:
        group = group_name(request.match_info["group"])
        lag, members, status, has_dlq, fleet = await self.call(self._group_detail, group)
        if not lag and not members and status is None and not has_dlq and fleet is None:
            raise Refused(
                f"group {group!r} is unknown: no broker holds offsets of it, no consumer of "
                "it is online, and it has no coordinator and no dead letters",
                404,
            )
        lag_series = {
            name: pts for name, pts in self.sampler.series()["lag"].items() if name == group
        }
        body = pages.group_page(
            group,
            lag,
            members,
            status,
            self.config.refresh_ms,
            request[CSRF],
            consume_tps=self.sampler.group_rates().get(group),
            fleet=fleet,
            lag_series=lag_series,
        )
        return self.render(request, f"Group {group}", body, active="groups")

    async def reset(self, request: web.Request) -> web.Response:
        group = group_name(request.match_info["group"])
        form = await request.post()
        topic = topic_name(str(form.get("topic", "")))
        where = str(form.get("to", "")).strip()
        time_text = str(form.get("time", ""))
        to: int | str
        if where in ("earliest", "latest"):
            to = where
        elif where == "time":
            to = utc_ms(time_text, "time")
        else:
            raise Refused(f"reset to {where!r}: earliest, latest or a time")
        lag = await self.call(self.admin.consumer_lag, group, topic)
        if not lag:
            raise Refused(f"group {group!r} has no offsets on {topic!r}: nothing was reset", 404)
        label = where if where != "time" else time_text

        def work(progress: Progress) -> str:
            done = self.admin.reset_offset(group, topic, to, progress)
            return f"reset {group} on {topic} to {label} ({len(done)} queues)"

        job = self.jobs.start(
            self.jobs_pool,
            "offset reset",
            f"{group} on {topic} to {label}",
            f"/groups/{pages.seg(group)}",
            work,
        )
        return self.redirect(f"/jobs/{job.id}")

    # ------------------------------------------------------------ long operations
    def _job(self, request: web.Request) -> Job:
        job = self.jobs.get(request.match_info["job"])
        if job is None:
            raise Refused("no such job (the console keeps its last 100)", 404)
        return job

    async def job(self, request: web.Request) -> web.Response:
        job = self._job(request)
        return self.render(request, f"Job {job.id}", pages.job_page(job.view()), active="")

    async def job_progress(self, request: web.Request) -> web.Response:
        return web.json_response(self._job(request).view())

    # ------------------------------------------------------------ metrics
    async def metrics_charts(self, request: web.Request) -> web.Response:
        s = self.sampler
        body = pages.metrics_page(
            s.series(),
            len(s.samples),
            s.interval_s,
            max(self.config.refresh_ms, 1000),
            s.last_error,
        )
        return self.render(request, "Metrics", body, active="metrics")
