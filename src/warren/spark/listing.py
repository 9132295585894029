"""Which streams to read, listed over HTTP: the vhost's queues that match
``subscribePattern``, or the partitions of a ``superStream``.

AMQP 0-9-1 has no way to list queues (a passive declare needs the name), so
the driver asks the management API (``GET /api/queues/{vhost}``, or a super
stream's exchange's bindings), which Warren and RabbitMQ both serve. Only the
driver lists, at every planning (the initial offsets and each trigger):
executors read the ranges they are given over AMQP and never need the HTTP
port.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from warren.client.uri import URI
from warren.spark.endpoint import redact
from warren.spark.option_values import OptionError

__all__ = ["management_url", "matching_streams", "partition_order", "super_stream_partitions"]

#: The binding argument that orders a super stream's partitions: core/super_stream.py's
#: PARTITION_ORDER, not imported so that the source does not load the broker's core.
PARTITION_ORDER = "x-stream-partition-order"

#: The management listener's port when option 'managementUrl' does not say.
DEFAULT_PORT = 15672


def management_url(host: str, given: str | None) -> str:
    """``given``, or ``http://<the broker's host>:15672/``."""
    if given:
        return given
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{DEFAULT_PORT}/"


def _get_json(
    uri: URI, given: str | None, path: str, timeout_s: float, what: str, missing: OptionError
) -> Any:
    """GET ``path`` (under the API's base, with its query) as JSON; ``missing`` is raised
    for a 404, any other failure is an OptionError naming managementUrl.

    The vhost and, unless ``given`` carries its own, the credentials are those the
    source logs in to the broker with (``uri``: the first URL with the options'
    overrides). ``what`` ends the errors: "the streams of vhost '/' for ...".
    """
    base = management_url(uri.host, given)
    parts = urlsplit(base)
    user, password = uri.user, uri.password
    if parts.username is not None:
        user, password = parts.username, parts.password or ""
        parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])
    path, _, query = path.partition("?")
    url = urlunsplit(parts._replace(path=parts.path.rstrip("/") + path, query=query))
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    where = f"the management API at {redact(base)}"
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:  # noqa: S310 - http(s) only
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise missing from None
        raise OptionError(
            "managementUrl", f"{where} answered {exc.code} {exc.reason} listing {what}"
        ) from None
    except (OSError, ValueError) as exc:
        raise OptionError(
            "managementUrl",
            f"cannot list {what} at {where}: {exc}; "
            "set option 'managementUrl' to where the driver reaches it",
        ) from None


def matching_streams(uri: URI, given: str | None, pattern: str, timeout_s: float) -> list[str]:
    """The names of the vhost's stream queues that ``pattern`` matches whole, sorted."""
    vhost = quote(uri.vhost, safe="")
    what = f"the streams of vhost {uri.vhost!r} for subscribePattern"
    base = redact(management_url(uri.host, given))
    missing = OptionError(
        "managementUrl", f"the management API at {base} answered 404 Not Found listing {what}"
    )
    path = f"/api/queues/{vhost}?columns=name,type"
    queues = _get_json(uri, given, path, timeout_s, what, missing)
    compiled = re.compile(pattern)
    return sorted(
        q["name"]
        for q in queues
        if isinstance(q, dict)
        and q.get("type") == "stream"
        and isinstance(q.get("name"), str)
        and compiled.fullmatch(q["name"])
    )


def super_stream_partitions(uri: URI, given: str | None, name: str, timeout_s: float) -> list[str]:
    """The partitions of super stream ``name``, in order.

    A super stream is its exchange's bindings (docs/streams.md): the queues
    bound to it, by their ``x-stream-partition-order`` argument, those without
    one after them in the listing's order, each once (as RabbitMQ's stream
    manager orders them). The management API, Warren's and RabbitMQ's, has no
    other view of a super stream. RabbitMQ lists no bindings, rather than 404,
    for an exchange that does not exist: with none, the exchange is asked for.
    """
    vhost = quote(uri.vhost, safe="")
    path = f"/api/exchanges/{vhost}/{quote(name, safe='')}"
    what = f"the partitions of super stream {name!r} in vhost {uri.vhost!r}"
    base = redact(management_url(uri.host, given))
    missing = OptionError(
        "superStream",
        f"no super stream {name!r} in vhost {uri.vhost!r} (the management API at {base} "
        "has no exchange of that name)",
    )
    bindings = _get_json(uri, given, path + "/bindings/source", timeout_s, what, missing)
    if not bindings:
        _get_json(uri, given, path, timeout_s, what, missing)
    return partition_order(bindings if isinstance(bindings, list) else [])


def partition_order(bindings: list[Any]) -> list[str]:
    """The queues the bindings (the management API's JSON) lead to, by partition order."""
    ranked = []
    for i, b in enumerate(bindings):
        if not isinstance(b, dict) or b.get("destination_type") != "queue":
            continue
        if not isinstance(b.get("destination"), str):
            continue
        arguments = b.get("arguments")
        order = _order(arguments.get(PARTITION_ORDER) if isinstance(arguments, dict) else None)
        ranked.append((order is None, order or 0, i, b["destination"]))
    ranked.sort()
    return list(dict.fromkeys(r[3] for r in ranked))


def _order(value: Any) -> int | None:
    """A partition order as RabbitMQ coerces it: a number, or a number's text."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None
