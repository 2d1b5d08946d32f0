"""The console's access rules, which every request passes (security headers, the CSRF
cookie, the sign-in, the same-origin POST rule), the sign-in pages and the static files."""

from __future__ import annotations

import hmac
import logging
import secrets
from urllib.parse import quote, unquote, urlsplit

from aiohttp import web

from actors.console import assets, pages
from actors.console.core import (
    CSP,
    CSRF,
    CSRF_COOKIE,
    FLASH,
    FLASH_COOKIE,
    MAX_REQUEST_BYTES,
    SESSION_COOKIE,
    Handler,
    View,
)
from actors.console.forms import Refused
from storage.errors import RayMQError

log = logging.getLogger("raymq.actors.console")


class Access(View):
    # ------------------------------------------------------------ middlewares
    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Security headers, the CSRF cookie, the login, and the same-origin POST rule."""
        token = request.cookies.get(CSRF_COOKIE, "")
        fresh = len(token) < 32
        request[CSRF] = secrets.token_urlsafe(32) if fresh else token
        flash = request.cookies.get(FLASH_COOKIE)
        if flash:
            request[FLASH] = unquote(flash)
        response = await self._guarded(request, handler)
        if fresh:
            response.set_cookie(
                CSRF_COOKIE, request[CSRF], path="/", httponly=True, samesite="Strict"
            )
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "same-origin"
        if not request.path.startswith("/static/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    async def _guarded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        public = request.path.startswith("/static/") or request.path in ("/login", "/healthz")
        if self.config.auth and not public and not self._signed_in(request):
            if request.method == "GET":
                return self.redirect("/login?next=" + quote(request.path_qs, safe=""))
            return self.refusal(request, "sign in first", 401)
        if request.method == "POST":
            why = await self._post_refused(request)
            if why:
                log.warning("console: refused POST %s: %s", request.path, why)
                return self.refusal(request, why, 403)
        try:
            return await handler(request)
        except Refused as exc:
            return self.refusal(request, str(exc), exc.status)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return self.refusal(request, f"{exc.status} {exc.reason}: {request.path}", exc.status)
        except RayMQError as exc:  # the cluster refused it (or cannot answer): say so
            log.info("console: %s %s: %s", request.method, request.path, exc)
            return self.refusal(request, f"{type(exc).__name__}: {exc}", 422)
        except Exception as exc:  # noqa: BLE001 - a page says what failed; the log has the rest
            log.exception("console: %s %s failed", request.method, request.path)
            return self.refusal(request, f"{type(exc).__name__}: {exc}", 500)

    def _signed_in(self, request: web.Request) -> bool:
        assert self.config.auth is not None
        cookie = request.cookies.get(SESSION_COOKIE, "")
        if cookie and hmac.compare_digest(cookie, self.session):
            return True
        bearer = request.headers.get("Authorization", "")
        return bearer.startswith("Bearer ") and hmac.compare_digest(
            bearer[7:].encode(), self.config.auth.encode()
        )

    async def _post_refused(self, request: web.Request) -> str | None:
        origin = request.headers.get("Origin")
        if origin is not None and origin != "null":
            parts = urlsplit(origin)
            if parts.netloc != request.host:
                return f"the form came from another site ({origin}): nothing was changed"
        try:
            form = await request.post()
        except web.HTTPRequestEntityTooLarge:
            return (
                f"the request is over {pages.size(MAX_REQUEST_BYTES)}, more than the "
                "console reads: nothing was changed"
            )
        sent = form.get("csrf")
        cookie = request.cookies.get(CSRF_COOKIE, "")
        if not isinstance(sent, str) or not cookie or not hmac.compare_digest(sent, cookie):
            return (
                "the form's security token is missing or stale (reload the page and try "
                "again): nothing was changed"
            )
        return None

    # ------------------------------------------------------------ static
    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        files = {
            "console.css": (assets.CSS, "text/css"),
            "console.js": (assets.JS, "application/javascript"),
            "favicon.svg": (assets.FAVICON_SVG, "image/svg+xml"),
        }
        if name not in files:
            raise web.HTTPNotFound()
        text, kind = files[name]
        return web.Response(text=text, content_type=kind, headers={"Cache-Control": "max-age=3600"})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    # ------------------------------------------------------------ access
    async def login_form(self, request: web.Request) -> web.Response:
        nxt = request.query.get("next", "/")
        return self.render(request, "Sign in", pages.login_page(request[CSRF], nxt), active="")

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        token = form.get("token")
        if not self.config.auth:
            return self.redirect("/")
        if not isinstance(token, str) or not hmac.compare_digest(
            token.encode(), self.config.auth.encode()
        ):
            log.warning("console: a sign-in with a wrong token from %s", request.remote)
            return self.render(
                request,
                "Sign in",
                pages.login_page(request[CSRF], request.query.get("next", "/")),
                active="",
                error="wrong token",
                status=401,
            )
        nxt = request.query.get("next", "/")
        if not nxt.startswith("/") or nxt.startswith("//"):
            nxt = "/"
        response = self.redirect(nxt)
        response.set_cookie(
            SESSION_COOKIE, self.session, path="/", httponly=True, samesite="Strict"
        )
        return response
