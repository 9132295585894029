"""A small blocking client of the RabbitMQ-compatible management HTTP API.

Standard library only (urllib, json, base64): ``warren ctl`` must start fast and
must not import the broker or an HTTP framework. Every failure becomes a
:class:`CtlError` carrying the documented exit status, so the command layer only
has to print it.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = [
    "EXIT_AUTH",
    "EXIT_CONNECT",
    "EXIT_FORBIDDEN",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_SERVER",
    "EXIT_USAGE",
    "Client",
    "CtlError",
    "exit_status_for",
    "path",
]

# The exit statuses scripts can rely on (docs/ctl.md).
EXIT_OK = 0
EXIT_USAGE = 1  # bad command line, unreadable file, invalid JSON given
EXIT_CONNECT = 2  # no HTTP server answered (refused, DNS, timeout, not HTTP)
EXIT_AUTH = 3  # 401: the user name or password was not accepted
EXIT_FORBIDDEN = 4  # 403: logged in, but the user may not do that
EXIT_NOT_FOUND = 5  # 404
EXIT_REFUSED = 6  # other 4xx: 400 bad request, 405, 409 conflict, 412 ...
EXIT_SERVER = 7  # 5xx, or an answer that is not the API's

# RabbitMQ answers 401 both for a failed login ("Login failed") and for a user
# whose tags or permissions do not allow the request; these reasons are the
# second kind, which is an authorisation failure (exit 4) like a 403.
_AUTHORISATION_REASONS = re.compile(
    r"^(Not \w+ user|Access refused|User not authori[sz]ed to access virtual host)",
    re.IGNORECASE,
)


class CtlError(Exception):
    """A failure to report on stderr with its exit status."""

    def __init__(self, message: str, status: int, http_status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.http_status = http_status


def exit_status_for(http_status: int, reason: str = "") -> int:
    """The documented exit status of an HTTP error status (and its reason, for 401)."""
    if http_status == 401:
        return EXIT_FORBIDDEN if _AUTHORISATION_REASONS.match(reason) else EXIT_AUTH
    if http_status == 403:
        return EXIT_FORBIDDEN
    if http_status == 404 or (http_status == 400 and reason.startswith("404 NOT_FOUND")):
        # RabbitMQ reports a publish to a missing exchange as 400 with the AMQP
        # channel error "404 NOT_FOUND - no exchange ..." as the reason.
        return EXIT_NOT_FOUND
    if 400 <= http_status < 500:
        return EXIT_REFUSED
    return EXIT_SERVER


def path(*segments: str) -> str:
    """``/api/...`` with every segment percent-encoded (the vhost ``/`` is ``%2F``)."""
    return "/api/" + "/".join(urllib.parse.quote(s, safe="") for s in segments)


class Client:
    """One base URL and one set of credentials; :meth:`request` returns decoded JSON."""

    def __init__(
        self,
        url: str,
        user: str,
        password: str,
        timeout: float = 30.0,
        cacert: str | None = None,
        insecure: bool = False,
    ) -> None:
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CtlError(f"invalid --url {url!r}: expected http://HOST:PORT", EXIT_USAGE)
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError as exc:
            raise CtlError(f"invalid --url {url!r}: {exc}", EXIT_USAGE) from None
        # Credentials in the URL (http://user:pass@host:15672) are used unless
        # --user/--password say otherwise (the caller decides; see main).
        self.url_user = urllib.parse.unquote(parts.username) if parts.username else None
        self.url_password = urllib.parse.unquote(parts.password) if parts.password else None
        netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        if parts.port is not None:
            netloc += f":{parts.port}"
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/api"):  # --url http://host:15672/api works too
            prefix = prefix[: -len("/api")]
        self.base = f"{parts.scheme}://{netloc}{prefix}"
        self.user = user
        self.password = password
        self.timeout = timeout
        self.ssl_context: ssl.SSLContext | None = None
        if parts.scheme == "https" and (cacert or insecure):
            try:
                context = ssl.create_default_context(cafile=cacert)
            except (OSError, ssl.SSLError) as exc:
                raise CtlError(
                    f"cannot load --cacert {cacert}: {_describe(exc)}", EXIT_USAGE
                ) from None
            if insecure:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self.ssl_context = context

    def request(
        self,
        method: str,
        api_path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """Send one request; the decoded JSON answer, or None for an empty one.

        Raises CtlError with the exit status for connection failures, HTTP errors
        (with the API's ``reason``) and answers that are not JSON.
        """
        url = self.base + api_path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode("ascii")
        req.add_header("Authorization", f"Basic {token}")
        # JSON preferred, anything accepted: RabbitMQ's purge (DELETE .../contents)
        # answers 406 to a plain "application/json".
        req.add_header("Accept", "application/json, */*;q=0.5")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        where = f"{method} {api_path}"
        try:
            with urllib.request.urlopen(
                req, timeout=self.timeout, context=self.ssl_context
            ) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc, where) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLError):
                raise CtlError(
                    f"TLS error talking to {self.base}: {reason}", EXIT_CONNECT
                ) from None
            raise CtlError(
                f"cannot connect to {self.base}: {_describe(reason)}", EXIT_CONNECT
            ) from None
        except TimeoutError:
            raise CtlError(
                f"no answer from {self.base} within {self.timeout:g}s ({where})", EXIT_CONNECT
            ) from None
        except (http.client.HTTPException, ConnectionError) as exc:
            # Something answered but not in HTTP (e.g. --url pointing at the AMQP port).
            raise CtlError(
                f"cannot talk to {self.base}: not an HTTP answer ({_describe(exc)})", EXIT_CONNECT
            ) from None
        except OSError as exc:
            raise CtlError(
                f"cannot connect to {self.base}: {_describe(exc)}", EXIT_CONNECT
            ) from None
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise CtlError(
                f"{where}: the answer from {self.base} is not JSON (is --url a management API?)",
                EXIT_SERVER,
            ) from None

    def get(self, api_path: str, query: dict[str, str] | None = None) -> Any:
        return self.request("GET", api_path, query=query)

    def put(self, api_path: str, body: Any) -> Any:
        return self.request("PUT", api_path, body)

    def post(self, api_path: str, body: Any) -> Any:
        return self.request("POST", api_path, body)

    def delete(
        self,
        api_path: str,
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        return self.request("DELETE", api_path, query=query, headers=headers)

    def _http_error(self, exc: urllib.error.HTTPError, where: str) -> CtlError:
        status = exc.code
        try:
            raw = exc.read()
        except OSError:
            raw = b""
        reason = ""
        try:
            doc = json.loads(raw) if raw.strip() else None
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            reason = str(doc.get("reason") or doc.get("error") or "")
        elif raw.strip():
            reason = raw.decode("utf-8", "replace").strip().splitlines()[0][:200]
        phrase = (
            exc.reason if isinstance(exc.reason, str) else http.client.responses.get(status, "")
        )
        text = reason or phrase or "error"
        shown = f"{status} {phrase}" if phrase and phrase != text else str(status)
        return CtlError(
            f"{text} (HTTP {shown} on {where})",
            exit_status_for(status, reason),
            http_status=status,
        )


def _describe(reason: object) -> str:
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    text = str(reason)
    return text or type(reason).__name__
