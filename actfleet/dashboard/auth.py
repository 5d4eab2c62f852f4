"""Who may use the dashboard, and proof that a state change comes from its own pages.

Bound to a loopback address it needs no login (the OS user is the approver, as for the
CLI); bound anywhere else it needs a token or basic auth on every request, and refuses to
start without one. State changes (POST) carry a CSRF token that matches the SameSite
cookie the pages set (double submit), and an Origin, when sent, must be this host."""

from __future__ import annotations

import base64
import binascii
import getpass
import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from starlette.requests import Request

SESSION_COOKIE = "actfleet_login"
CSRF_COOKIE = "actfleet_csrf"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
TOKEN_USER = "token"
"""The approver recorded for decisions made with the token."""


class AuthConfigError(ValueError):
    """The dashboard's auth settings cannot work; the message says what to do."""


@dataclass(frozen=True)
class Auth:
    """The dashboard's credentials: none (loopback only), a token, or basic-auth users."""

    token: str = ""
    users: dict[str, str] = field(default_factory=dict)
    """Basic auth: user name -> password."""
    local_user: str = field(default_factory=getpass.getuser)
    """The approver recorded when no login is required."""

    @property
    def required(self) -> bool:
        return bool(self.token or self.users)

    @classmethod
    def load(
        cls,
        token: str = "",
        token_file: Path | None = None,
        basic: str = "",
        basic_file: Path | None = None,
    ) -> Auth:
        """From a token (or a file holding one) and basic-auth `user:password` pairs (comma
        separated, or one a line in a file). AuthConfigError for an empty or malformed one."""
        if token_file is not None:
            token = _read(token_file).strip()
            if not token:
                raise AuthConfigError(f"--token-file {token_file} is empty; put a token in it")
        if token and len(token) < 16:
            raise AuthConfigError(
                "the dashboard token is shorter than 16 characters; make a longer one "
                "(openssl rand -hex 24)"
            )
        pairs = [p for p in basic.split(",") if p.strip()]
        if basic_file is not None:
            pairs += [line for line in _read(basic_file).splitlines() if line.strip()]
        users: dict[str, str] = {}
        for pair in pairs:
            name, sep, password = pair.strip().partition(":")
            if not sep or not name or not password:
                raise AuthConfigError(
                    "basic auth entries are user:password (neither part empty); got one without"
                )
            users[name] = password
        return cls(token=token, users=users)

    def check_bind(self, host: str) -> None:
        """AuthConfigError when `host` is not a loopback address and no auth is set."""
        if self.required or _is_loopback(host):
            return
        raise AuthConfigError(
            f"refusing to listen on {host} without authentication: anyone who reaches it could "
            "approve code. Set ACTFLEET_DASHBOARD_TOKEN (or --token-file FILE), or basic auth "
            "(ACTFLEET_DASHBOARD_BASIC_AUTH=user:password, or --basic-auth-file FILE), or bind "
            "to 127.0.0.1"
        )

    def user(self, request: Request) -> str | None:
        """The name the request is made as, or None when it is not authenticated."""
        if not self.required:
            return self.local_user
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and self.token and _same(value.strip(), self.token):
            return TOKEN_USER
        if scheme.lower() == "basic":
            return self._basic_user(value.strip())
        cookie = request.cookies.get(SESSION_COOKIE, "")
        if self.token and _same(cookie, self.session_value()):
            return TOKEN_USER
        return None

    def login(self, token: str) -> str | None:
        """The session cookie's value for a correct token typed into the login form."""
        if self.token and _same(token.strip(), self.token):
            return self.session_value()
        return None

    def session_value(self) -> str:
        """The login cookie's value: derived from the token, never the token itself."""
        return hmac.new(
            self.token.encode(), b"actfleet-dashboard-login", hashlib.sha256
        ).hexdigest()

    def _basic_user(self, value: str) -> str | None:
        try:
            decoded = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        name, _, password = decoded.partition(":")
        expected = self.users.get(name)
        return name if expected is not None and _same(password, expected) else None


def new_csrf_token() -> str:
    return secrets.token_urlsafe(24)


def csrf_ok(request: Request, submitted: str) -> bool:
    """Whether a state change carries the CSRF cookie's value and comes from this host."""
    cookie = request.cookies.get(CSRF_COOKIE, "")
    origin = request.headers.get("origin")
    if origin and urlsplit(origin).netloc != request.headers.get("host", ""):
        return False
    return bool(cookie) and _same(submitted, cookie)


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise AuthConfigError(f"cannot read {path}: {exc.strerror}") from None
