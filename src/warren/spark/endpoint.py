"""Where the ``warren`` data source's tasks connect: the broker URLs to try in
turn, the login and TLS settings given as options, and the retries (Endpoint).
Parsed on the driver with the other options (options.py) and pickled to the
executors; warren.spark.connection opens the connections."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from urllib.parse import urlsplit, urlunsplit

from warren.client.uri import TLS, URI
from warren.spark.option_values import OptionError, boolean, count, get

__all__ = ["ENDPOINT_OPTIONS", "Endpoint", "redact", "replica_url"]


def replica_url(url: str, replica: str) -> str:
    """``url`` with its host and port replaced by ``replica`` (host:port): the same
    user, password, vhost and query."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{replica}" if userinfo else replica
    return urlunsplit(parts._replace(netloc=netloc))


def redact(url: str) -> str:
    """The URL without its password, for error messages and logs."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.hostname or ""
        if parts.username is not None:
            netloc = f"{parts.username}:***@{netloc}"
        if parts.port is not None:
            netloc = f"{netloc}:{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "<unparsable url>"


def _urls(options: Mapping[str, str]) -> tuple[str, ...]:
    raw = get(options, "url")
    if raw is None or not raw.strip():
        raise OptionError(
            "url", "required: the broker's AMQP URL, e.g. amqp://guest:guest@host:5672/"
        )
    urls = tuple(u.strip() for u in raw.split(","))
    for url in urls:
        if not url:
            raise OptionError("url", f"an empty URL in the list {redact(raw)!r}")
        try:
            URI.parse(url)
        except ValueError as exc:
            raise OptionError("url", f"{exc} in {redact(url)!r}") from None
    return urls


#: The options every read and write takes for reaching the broker (Endpoint).
ENDPOINT_OPTIONS = (
    "url",
    "username",
    "password",
    "token",
    "tokenFile",
    "authMechanism",
    "tls.caFile",
    "tls.certFile",
    "tls.keyFile",
    "tls.keyPassword",
    "tls.verify",
    "tls.serverName",
    "maxRetries",
    "retryBackoffMs",
    "retryMaxBackoffMs",
    # Kafka's names for the planner's retries, taken as aliases.
    "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs",
)


@dataclass(frozen=True)
class Endpoint:
    """How to reach the broker: the URLs to try in turn (any node of a cluster),
    the login and TLS settings that override what the URLs say, and how long to
    keep trying. Credentials can come from options rather than the URL, so that
    Spark's redaction (``spark.redaction.regex`` matches ``password`` and
    ``token``) hides them; a token file is read again at every connection (a
    rotated token is picked up)."""

    urls: tuple[str, ...]
    username: str | None = None
    password: str | None = None
    token: str | None = None
    token_file: str | None = None
    mechanism: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = None
    verify: bool | None = None
    server_name: str | None = None
    max_retries: int = 10
    retry_backoff_ms: int = 500
    retry_max_backoff_ms: int = 10_000

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Endpoint:
        urls = _urls(options)
        token = get(options, "token")
        token_file = get(options, "tokenFile")
        if token is not None and token_file is not None:
            raise OptionError("tokenFile", "give token or tokenFile, not both")
        if (token is not None or token_file is not None) and get(options, "password") is not None:
            raise OptionError("token", "give a token or a password, not both")
        mechanism = get(options, "authMechanism")
        if mechanism is not None:
            mechanism = mechanism.strip().upper()
            if mechanism not in ("PLAIN", "EXTERNAL"):
                raise OptionError("authMechanism", f"expected PLAIN or EXTERNAL, got {mechanism!r}")
        retries = get(options, "maxRetries") or get(options, "fetchOffset.numRetries")
        backoff = get(options, "retryBackoffMs") or get(options, "fetchOffset.retryIntervalMs")
        verify = get(options, "tls.verify")
        endpoint = cls(
            urls=urls,
            username=get(options, "username"),
            password=get(options, "password"),
            token=token,
            token_file=token_file,
            mechanism=mechanism,
            ca_file=get(options, "tls.caFile"),
            cert_file=get(options, "tls.certFile"),
            key_file=get(options, "tls.keyFile"),
            key_password=get(options, "tls.keyPassword"),
            verify=None if verify is None else boolean(options, "tls.verify", True),
            server_name=get(options, "tls.serverName"),
            max_retries=count("maxRetries", retries, 10),
            retry_backoff_ms=count("retryBackoffMs", backoff, 500),
            retry_max_backoff_ms=count(
                "retryMaxBackoffMs", get(options, "retryMaxBackoffMs"), 10_000
            ),
        )
        for i in range(len(urls)):
            try:
                uri = endpoint.uri(i, check_files=True)
            except ValueError as exc:
                raise OptionError("url", f"{exc} ({redact(urls[i])})") from None
            if uri.mechanism == "EXTERNAL" and (uri.tls is None or not uri.tls.cert_file):
                raise OptionError(
                    "authMechanism",
                    "EXTERNAL needs amqps:// and a client certificate (option tls.certFile)",
                )
        return endpoint

    def uri(self, index: int = 0, *, check_files: bool = False) -> URI:
        """URL ``index`` with the options' overrides applied."""
        uri = URI.parse(self.urls[index])
        tls_given = any(
            v is not None
            for v in (
                self.ca_file,
                self.cert_file,
                self.key_file,
                self.key_password,
                self.verify,
                self.server_name,
            )
        )
        if tls_given and uri.tls is None:
            raise ValueError("TLS options (tls.*) need an amqps:// URL")
        tls = uri.tls
        if tls is not None:
            tls = TLS(
                ca_file=self.ca_file or tls.ca_file,
                cert_file=self.cert_file or tls.cert_file,
                key_file=self.key_file or tls.key_file,
                key_password=self.key_password or tls.key_password,
                verify=tls.verify if self.verify is None else self.verify,
                server_name=tls.server_name if self.server_name is None else self.server_name,
            )
            if check_files:
                for path in (tls.ca_file, tls.cert_file, tls.key_file):
                    if path and not os.path.isfile(path):
                        raise ValueError(f"no such file: {path}")
        user, password = uri.user, uri.password
        if self.username is not None:
            user = self.username
        if self.password is not None:
            password = self.password
        if self.token is not None or self.token_file is not None:
            # OAuth 2.0 as RabbitMQ takes it: the access token as the password
            # (the user name is not checked).
            password = self.token if self.token is not None else _read_token(self.token_file)
            if self.username is None and "@" not in self.urls[index]:
                user = ""
        mechanism = self.mechanism or uri.mechanism
        return URI(
            host=uri.host,
            port=uri.port,
            user=user,
            password=password,
            vhost=uri.vhost,
            tls=tls,
            mechanism=mechanism,
            heartbeat=uri.heartbeat,
            connect_timeout_s=uri.connect_timeout_s,
        )

    def describe(self) -> str:
        """The URLs without passwords, for messages."""
        return ", ".join(redact(u) for u in self.urls)

    def at(self, replica: str) -> Endpoint:
        """The same endpoint with the first URL's host and port replaced by
        ``replica`` (host:port) and no other URL: a follower to read from."""
        return replace(self, urls=(replica_url(self.urls[0], replica),), max_retries=0)


def _read_token(path: str | None) -> str:
    assert path is not None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as exc:
        raise OptionError("tokenFile", f"cannot read {path}: {exc.strerror or exc}") from None
