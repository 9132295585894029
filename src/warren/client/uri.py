"""AMQP URIs (``amqp://user:pass@host:port/vhost``, ``amqps://``) as RabbitMQ reads them.

What a user types to name a broker: the perf tools' ``--uri`` and the Spark
data source's ``url`` option. Parsing refuses what it does not understand
(ValueError), naming the part.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from warren.amqp import spec

__all__ = ["DEFAULT_TLS_PORT", "TLS", "TLS_PARAMETERS", "URI", "URI_PARAMETERS"]

#: amqps:// without a port (IANA's, as every client).
DEFAULT_TLS_PORT = 5671


#: The query parameters only an amqps:// URI takes.
TLS_PARAMETERS = (
    "cacertfile",
    "certfile",
    "keyfile",
    "password",
    "verify",
    "server_name_indication",
)
#: The query parameters of an AMQP URI this client understands (RabbitMQ's URI
#: query parameters, as its Erlang client reads them).
URI_PARAMETERS = ("auth_mechanism", *TLS_PARAMETERS, "heartbeat", "connection_timeout")


@dataclass(frozen=True)
class TLS:
    """How to speak TLS to the server: RabbitMQ's URI parameters ``cacertfile``,
    ``certfile``, ``keyfile``, ``password`` (the key's), ``verify`` and
    ``server_name_indication``.

    Unlike the Erlang client's default, the server's certificate is verified
    (``verify_peer``) and its name checked against the host unless the URI says
    ``verify=verify_none`` or ``server_name_indication=disable``.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = None
    verify: bool = True
    #: The name sent (SNI) and checked in the certificate; None: the URI's host;
    #: "" : none sent or checked (the chain is still verified).
    server_name: str | None = None

    def context(self) -> ssl.SSLContext:
        """A client context; raises ssl.SSLError or OSError for unreadable files."""
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.server_name == "":
            ctx.check_hostname = False
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file, self.key_password)
        return ctx


@dataclass(frozen=True)
class URI:
    """The parts of an ``amqp://user:pass@host:port/vhost`` (or ``amqps://``) URI
    that the perf tools and the Spark data source use."""

    host: str = "127.0.0.1"
    port: int = spec.DEFAULT_PORT
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    #: None: plain TCP (amqp://); amqps:// sets it.
    tls: TLS | None = None
    #: "PLAIN" or "EXTERNAL" (the client certificate names the user).
    mechanism: str = "PLAIN"
    heartbeat: int | None = None
    connect_timeout_s: float | None = None

    @classmethod
    def parse(cls, uri: str) -> URI:
        """Parse an AMQP URI. An empty path or a bare ``/`` means the default vhost ``/``;
        other vhosts are percent-encoded (``%2F`` for a slash). Query parameters as
        RabbitMQ's (URI_PARAMETERS); others are refused (ValueError)."""
        parts = urlsplit(uri)
        if parts.scheme not in ("amqp", "amqps"):
            raise ValueError(f"unsupported URI scheme {parts.scheme!r} (amqp:// or amqps://)")
        secure = parts.scheme == "amqps"
        try:
            port = parts.port or (DEFAULT_TLS_PORT if secure else spec.DEFAULT_PORT)
        except ValueError as exc:
            raise ValueError(f"bad port in {uri!r}: {exc}") from None
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        query = _query(parts.query)
        if not secure and any(k in query for k in TLS_PARAMETERS):
            given = ", ".join(k for k in TLS_PARAMETERS if k in query)
            raise ValueError(f"TLS parameters ({given}) need an amqps:// URI")
        tls = None
        if secure:
            verify = query.get("verify", "verify_peer")
            if verify not in ("verify_peer", "verify_none"):
                raise ValueError(f"verify: expected verify_peer or verify_none, got {verify!r}")
            sni = query.get("server_name_indication")
            tls = TLS(
                ca_file=query.get("cacertfile"),
                cert_file=query.get("certfile"),
                key_file=query.get("keyfile"),
                key_password=query.get("password"),
                verify=verify == "verify_peer",
                server_name="" if sni == "disable" else sni,
            )
            if tls.key_file and not tls.cert_file:
                raise ValueError("keyfile needs certfile")
        mechanism = query.get("auth_mechanism", "plain").upper()
        if mechanism not in ("PLAIN", "EXTERNAL"):
            raise ValueError(
                f"auth_mechanism: expected plain or external, got {mechanism.lower()!r}"
            )
        if mechanism == "EXTERNAL" and (tls is None or not tls.cert_file):
            raise ValueError(
                "auth_mechanism=external needs amqps:// with a client certificate (certfile)"
            )
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=port,
            user=unquote(parts.username) if parts.username is not None else "guest",
            password=unquote(parts.password) if parts.password is not None else "guest",
            vhost=unquote(path) if path else "/",
            tls=tls,
            mechanism=mechanism,
            heartbeat=_int_parameter(query, "heartbeat"),
            connect_timeout_s=(
                ms / 1000 if (ms := _int_parameter(query, "connection_timeout")) else None
            ),
        )


def _query(text: str) -> dict[str, str]:
    """A URI's query parameters, each once; unknown ones refused."""
    try:
        pairs = parse_qs(text, keep_blank_values=True, strict_parsing=bool(text))
    except ValueError:
        raise ValueError(f"malformed query {text!r}") from None
    out: dict[str, str] = {}
    for key, values in pairs.items():
        if key not in URI_PARAMETERS:
            raise ValueError(f"unknown URI parameter {key!r} (known: {', '.join(URI_PARAMETERS)})")
        if len(values) > 1:
            raise ValueError(f"URI parameter {key!r} given {len(values)} times")
        out[key] = values[0]
    return out


def _int_parameter(query: dict[str, str], key: str) -> int | None:
    raw = query.get(key)
    if raw is None:
        return None
    if not raw.isdigit():
        raise ValueError(f"{key}: expected a non-negative integer, got {raw!r}")
    return int(raw)
