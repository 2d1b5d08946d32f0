"""The console's web application (aiohttp): its routes, the access rules every request
passes, and the handlers, which ask the admin client (``actors.client.admin``, the
calls ``raymq`` makes) and render ``pages``.

Access: with ``ConsoleConfig.auth`` every page but the login page needs the session
cookie the login gives (or ``Authorization: Bearer <token>``). Every state-changing
action is a POST carrying the page's CSRF token, which must equal the token in the
browser's ``raymq_csrf`` cookie (SameSite=Strict) and come from this console's own
origin. Input is checked before any call: a refused form changes nothing and says why
on the page.

The handlers are grouped by what they serve, each group over the one shared
:class:`~actors.console.core.Console`: ``access`` (the rules above, sign-in, static
files), ``topics``, ``groups`` (with jobs and metrics) and ``messages`` (with dead
letters and transactions).
"""

from __future__ import annotations

from aiohttp import web

from actors.client.admin import Admin
from actors.config.console import ConsoleConfig
from actors.console.access import Access
from actors.console.core import MAX_REQUEST_BYTES, Console
from actors.console.groups import Groups
from actors.console.lite import LiteTopics
from actors.console.messages import Messages
from actors.console.topics import Topics

CONSOLE_KEY = web.AppKey("console", Console)


def build_app(config: ConsoleConfig, admin: Admin) -> web.Application:
    """The console as an aiohttp application over ``admin`` (served by the ``console``
    actor, ``actors.console.server``, or in-process by a test)."""
    console = Console(config, admin)
    access, topics, lite, groups, messages = (
        Access(console),
        Topics(console),
        LiteTopics(console),
        Groups(console),
        Messages(console),
    )
    app = web.Application(middlewares=[access.guard], client_max_size=MAX_REQUEST_BYTES)
    app[CONSOLE_KEY] = console
    r = app.router
    r.add_get("/", topics.cluster)
    r.add_get("/topics", topics.topics)
    r.add_post("/topics", topics.create_topic)
    r.add_get("/topics/{topic}", topics.topic)
    r.add_post("/topics/{topic}/send", topics.send)
    r.add_post("/topics/{topic}/update", topics.update_topic)
    r.add_post("/topics/{topic}/delete", topics.delete_topic)
    r.add_post("/topics/{topic}/lite-settings", lite.settings)
    r.add_get("/topics/{topic}/lite/{lite}", lite.lite_topic)
    r.add_post("/topics/{topic}/lite/{lite}/delete", lite.delete)
    r.add_get("/groups", groups.groups)
    r.add_get("/groups/{group}", groups.group)
    r.add_post("/groups/{group}/reset", groups.reset)
    r.add_get("/messages", messages.messages)
    r.add_get("/message", messages.message)
    r.add_get("/dlq", messages.dlq)
    r.add_post("/dlq/resend", messages.resend)
    r.add_get("/transactions", messages.transactions)
    r.add_post("/message/resend", messages.resend_to_group)
    r.add_get("/jobs/{job}", groups.job)
    r.add_get("/jobs/{job}/progress", groups.job_progress)
    r.add_get("/metrics-charts", groups.metrics_charts)
    r.add_get("/login", access.login_form)
    r.add_post("/login", access.login)
    r.add_get("/healthz", access.healthz)
    r.add_get("/static/{name}", access.static)

    async def on_startup(app: web.Application) -> None:
        await console.start_sampling()

    async def on_cleanup(app: web.Application) -> None:
        await console.sampler.stop()
        console.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
