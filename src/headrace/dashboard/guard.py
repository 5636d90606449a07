"""Who may ask the dashboard: on loopback, only requests naming a loopback host (a DNS-rebinding page
names its own); on any other address, only requests carrying the token printed with its URL."""

from __future__ import annotations

import hmac
import secrets
from http.cookies import SimpleCookie
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs

__all__ = ["Guard", "is_loopback"]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
COOKIE = "headrace_token"


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_NAMES or host.startswith("127.")


def _hostname(header: str) -> str:
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """WSGI middleware around the dashboard's app. ``token`` is None on loopback (the Host check
    suffices there), else the secret each request must carry (``?token=`` once, then a cookie)."""

    def __init__(self, app: Callable[..., Iterable[bytes]], host: str):
        self.app, self.host = app, host
        self.token = None if is_loopback(host) else secrets.token_urlsafe(24)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if self.token is None:
            name = _hostname(environ.get("HTTP_HOST", "")).lower()
            if not is_loopback(name):
                return self._refuse(start_response, "403 Forbidden",
                                    "The dashboard answers only requests for a loopback host (localhost, 127.0.0.1)")
            return self.app(environ, start_response)
        given = parse_qs(environ.get("QUERY_STRING", "")).get("token", [""])[-1]
        cookie = SimpleCookie(environ.get("HTTP_COOKIE", ""))
        from_cookie = cookie[COOKIE].value if COOKIE in cookie else ""
        if hmac.compare_digest(given, self.token):
            def with_cookie(status: str, headers: list[tuple[str, str]], *rest: Any) -> Any:
                headers = [*headers, ("Set-Cookie", f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/")]
                return start_response(status, headers, *rest)
            return self.app(environ, with_cookie)
        if from_cookie and hmac.compare_digest(from_cookie, self.token):
            return self.app(environ, start_response)
        return self._refuse(start_response, "401 Unauthorized",
                            "The dashboard needs its token on this address: open the URL it printed (…/?token=...)")

    @staticmethod
    def _refuse(start_response: Callable[..., Any], status: str, text: str) -> Iterable[bytes]:
        body = (text + "\n").encode()
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [body]
