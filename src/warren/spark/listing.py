"""Which stream queues match ``subscribePattern``: the vhost's queues, listed over HTTP.

AMQP 0-9-1 has no way to list queues (a passive declare needs the name), so
the driver asks the management API (``GET /api/queues/{vhost}``), which
Warren and RabbitMQ both serve. Only the driver lists, at every planning
(the initial offsets and each trigger): executors read the ranges they are
given over AMQP and never need the HTTP port.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
from urllib.parse import quote, urlsplit, urlunsplit

from warren.client.uri import URI
from warren.spark.endpoint import redact
from warren.spark.option_values import OptionError

__all__ = ["management_url", "matching_streams"]

#: The management listener's port when option 'managementUrl' does not say.
DEFAULT_PORT = 15672


def management_url(host: str, given: str | None) -> str:
    """``given``, or ``http://<the broker's host>:15672/``."""
    if given:
        return given
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{DEFAULT_PORT}/"


def matching_streams(uri: URI, given: str | None, pattern: str, timeout_s: float) -> list[str]:
    """The names of the vhost's stream queues that ``pattern`` matches whole, sorted.

    The vhost and, unless ``given`` carries its own, the credentials are those the
    source logs in to the broker with (``uri``: the first URL with the options'
    overrides)."""
    base = management_url(uri.host, given)
    parts = urlsplit(base)
    user, password = uri.user, uri.password
    if parts.username is not None:
        user, password = parts.username, parts.password or ""
        parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])
    path = parts.path.rstrip("/") + f"/api/queues/{quote(uri.vhost, safe='')}"
    url = urlunsplit(parts._replace(path=path, query="columns=name,type"))
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    where = f"the management API at {redact(base)}"
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:  # noqa: S310 - http(s) only
            queues = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        raise OptionError(
            "managementUrl",
            f"{where} answered {exc.code} {exc.reason} listing vhost {uri.vhost!r} "
            "(subscribePattern lists streams through it)",
        ) from None
    except (OSError, ValueError) as exc:
        raise OptionError(
            "managementUrl",
            f"cannot list the streams of vhost {uri.vhost!r} for subscribePattern at "
            f"{where}: {exc}; set option 'managementUrl' to where the driver reaches it",
        ) from None
    compiled = re.compile(pattern)
    return sorted(
        q["name"]
        for q in queues
        if isinstance(q, dict)
        and q.get("type") == "stream"
        and isinstance(q.get("name"), str)
        and compiled.fullmatch(q["name"])
    )
