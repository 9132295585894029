"""The options of the ``warren`` data source, parsed once on the driver.

Spark hands a data source its options as a case-insensitive map of strings.
Everything is validated here, before a task starts, so that a typo fails the
query with a message naming the option instead of a stack trace from an
executor. Nothing here imports pyspark: the parsed objects are plain frozen
dataclasses that pickle to the executors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from warren.perf.client import TLS, URI

__all__ = [
    "replica_url",
    "ENDPOINT_OPTIONS",
    "EARLIEST",
    "Endpoint",
    "LATEST",
    "DEFAULT_DEDUP_HEADER",
    "OptionError",
    "Position",
    "SinkOptions",
    "SourceOptions",
    "redact",
]

#: Where a query starts, before it is resolved against a stream's bounds.
EARLIEST = "earliest"
LATEST = "latest"
#: The header Warren's deduplication reads unless a queue names another one
#: (``x-deduplication-header``, as core/dedup.py's DEFAULT_HEADER).
DEFAULT_DEDUP_HEADER = "x-deduplication-header"


class OptionError(ValueError):
    """An option is missing, malformed, or names something the broker does not have."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"warren data source: option '{option}': {problem}")
        self.option = option


@dataclass(frozen=True)
class Position:
    """A starting or ending position: ``earliest``, ``latest``, an offset or a time.

    Exactly one of the fields is meaningful: ``kind`` is ``"earliest"``,
    ``"latest"``, ``"offset"`` (``value`` is the offset) or ``"timestamp"``
    (``value`` is milliseconds since the epoch).
    """

    kind: str
    value: int = 0

    @classmethod
    def parse(cls, option: str, raw: Any, allowed: tuple[str, ...]) -> Position:
        """One position as the user wrote it (a string, or an int from a JSON map)."""
        expected = _expected(allowed)
        if isinstance(raw, bool):
            raise OptionError(option, f"expected {expected}, got {raw!r}")
        if isinstance(raw, int):
            text = str(raw)
        elif isinstance(raw, str):
            text = raw.strip()
        else:
            raise OptionError(option, f"expected {expected}, got {raw!r}")
        lower = text.lower()
        if lower in (EARLIEST, LATEST) and lower in allowed:
            return cls(lower)
        if lower.startswith("timestamp:") and "timestamp" in allowed:
            ms = _non_negative_int(text[len("timestamp:") :])
            if ms is None:
                raise OptionError(option, f"expected timestamp:<epoch milliseconds>, got {text!r}")
            return cls("timestamp", ms)
        offset = _non_negative_int(text)
        if offset is not None:
            return cls("offset", offset)
        raise OptionError(option, f"expected {expected}, got {text!r}")


def _expected(allowed: tuple[str, ...]) -> str:
    words = [w for w in (EARLIEST, LATEST) if w in allowed] + ["an offset (an integer >= 0)"]
    if "timestamp" in allowed:
        words.append("timestamp:<epoch milliseconds>")
    words.append("or a JSON object of these by queue name")
    return ", ".join(words)


def _non_negative_int(text: str) -> int | None:
    text = text.strip()
    if not text.isdigit():
        return None
    value = int(text)
    return value if value < 1 << 63 else None


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


def _get(options: Mapping[str, str], name: str) -> str | None:
    """Options are case-insensitive in Spark; accept any case here too (for direct use)."""
    if name in options:
        return options[name]
    lower = name.lower()
    for key, value in options.items():
        if key.lower() == lower:
            return value
    return None


def _urls(options: Mapping[str, str]) -> tuple[str, ...]:
    raw = _get(options, "url")
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
        token = _get(options, "token")
        token_file = _get(options, "tokenFile")
        if token is not None and token_file is not None:
            raise OptionError("tokenFile", "give token or tokenFile, not both")
        if (token is not None or token_file is not None) and _get(options, "password") is not None:
            raise OptionError("token", "give a token or a password, not both")
        mechanism = _get(options, "authMechanism")
        if mechanism is not None:
            mechanism = mechanism.strip().upper()
            if mechanism not in ("PLAIN", "EXTERNAL"):
                raise OptionError("authMechanism", f"expected PLAIN or EXTERNAL, got {mechanism!r}")
        retries = _get(options, "maxRetries") or _get(options, "fetchOffset.numRetries")
        backoff = _get(options, "retryBackoffMs") or _get(options, "fetchOffset.retryIntervalMs")
        verify = _get(options, "tls.verify")
        endpoint = cls(
            urls=urls,
            username=_get(options, "username"),
            password=_get(options, "password"),
            token=token,
            token_file=token_file,
            mechanism=mechanism,
            ca_file=_get(options, "tls.caFile"),
            cert_file=_get(options, "tls.certFile"),
            key_file=_get(options, "tls.keyFile"),
            key_password=_get(options, "tls.keyPassword"),
            verify=None if verify is None else _bool(options, "tls.verify", True),
            server_name=_get(options, "tls.serverName"),
            max_retries=_count("maxRetries", retries, 10),
            retry_backoff_ms=_count("retryBackoffMs", backoff, 500),
            retry_max_backoff_ms=_count(
                "retryMaxBackoffMs", _get(options, "retryMaxBackoffMs"), 10_000
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


def _count(option: str, raw: str | None, default: int) -> int:
    if raw is None:
        return default
    value = _non_negative_int(raw)
    if value is None:
        raise OptionError(option, f"expected an integer >= 0, got {raw!r}")
    return value


def _read_token(path: str | None) -> str:
    assert path is not None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as exc:
        raise OptionError("tokenFile", f"cannot read {path}: {exc.strerror or exc}") from None


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    lower = raw.strip().lower()
    if lower in ("true", "false"):
        return lower == "true"
    raise OptionError(name, f"expected true or false, got {raw!r}")


def _positive(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return default
    value = _non_negative_int(raw)
    if value is None or value == 0:
        raise OptionError(name, f"expected a positive integer, got {raw!r}")
    return value


def _positions(
    options: Mapping[str, str],
    name: str,
    queues: tuple[str, ...],
    default: str,
    allowed: tuple[str, ...],
) -> dict[str, Position]:
    """A position per queue: one value for all, or a JSON object by queue name."""
    raw = _get(options, name)
    if raw is None:
        raw = default
    text = raw.strip()
    if text.startswith("{"):
        try:
            by_queue = json.loads(text)
        except ValueError as exc:
            raise OptionError(name, f"invalid JSON: {exc}") from None
        if not isinstance(by_queue, dict):
            raise OptionError(name, "expected a JSON object of positions by queue name")
        unknown = sorted(set(by_queue) - set(queues))
        if unknown:
            raise OptionError(name, f"names queues not in option 'queue': {', '.join(unknown)}")
        fallback = Position.parse(name, default, allowed)
        return {
            q: Position.parse(name, by_queue[q], allowed) if q in by_queue else fallback
            for q in queues
        }
    position = Position.parse(name, text, allowed)
    return dict.fromkeys(queues, position)


@dataclass(frozen=True)
class SourceOptions:
    """Everything the reader needs, batch or streaming."""

    url: str
    endpoint: Endpoint
    queues: tuple[str, ...]
    starting: dict[str, Position]
    ending: dict[str, Position]
    fail_on_data_loss: bool
    min_partitions: int
    max_records_per_partition: int | None
    max_records_per_trigger: int | None
    prefetch: int
    poll_timeout_ms: int
    #: "leader": tasks read from ``url``; "replicas": from the cluster's followers
    #: (``replicas``, or those the leader announces), the leader as the fallback.
    read_from: str = "leader"
    replicas: tuple[str, ...] = ()
    replica_timeout_ms: int = 5000

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> SourceOptions:
        endpoint = Endpoint.parse(options)
        url = endpoint.urls[0]
        raw_queues = _get(options, "queue")
        if raw_queues is None or not raw_queues.strip():
            raise OptionError(
                "queue", "required: the stream queue to read (or a comma-separated list)"
            )
        queues = tuple(q.strip() for q in raw_queues.split(","))
        if any(not q for q in queues):
            raise OptionError("queue", f"empty queue name in {raw_queues!r}")
        if len(set(queues)) != len(queues):
            raise OptionError("queue", f"a queue is listed twice in {raw_queues!r}")
        # Kafka's defaults: a streaming query starts at the end, a batch read at the start.
        starting = _positions(
            options,
            "startingOffsets",
            queues,
            LATEST if streaming else EARLIEST,
            (EARLIEST, LATEST, "timestamp"),
        )
        if streaming:
            if _get(options, "endingOffsets") is not None:
                raise OptionError("endingOffsets", "only for batch reads (a stream has no end)")
            ending: dict[str, Position] = {}
        else:
            ending = _positions(options, "endingOffsets", queues, LATEST, (LATEST,))
            for q in queues:
                s, e = starting[q], ending[q]
                if s.kind == "offset" and e.kind == "offset" and s.value > e.value:
                    raise OptionError(
                        "endingOffsets",
                        f"ending offset {e.value} of queue {q!r} is before startingOffsets {s.value}",
                    )
                if s.kind == LATEST and e.kind == "offset":
                    raise OptionError(
                        "startingOffsets", "latest cannot start a batch read with an ending offset"
                    )
        max_per_trigger = _positive(options, "maxRecordsPerTrigger", None)
        if max_per_trigger is not None and not streaming:
            raise OptionError("maxRecordsPerTrigger", "only for streaming reads")
        min_partitions = _positive(options, "minPartitions", os.cpu_count() or 1)
        assert min_partitions is not None
        prefetch = _positive(options, "prefetch", 2000)
        assert prefetch is not None
        poll_timeout = _positive(options, "pollTimeoutMs", 60_000)
        assert poll_timeout is not None
        read_from = (_get(options, "readFrom") or "leader").strip().lower()
        if read_from not in ("leader", "replicas"):
            raise OptionError("readFrom", f"expected leader or replicas, got {read_from!r}")
        raw_replicas = _get(options, "replicas") or ""
        replicas = tuple(r.strip() for r in raw_replicas.split(",") if r.strip())
        for replica in replicas:
            host, _, port = replica.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise OptionError("replicas", f"expected host:port, got {replica!r}")
        if replicas and read_from != "replicas":
            raise OptionError("replicas", "only with readFrom=replicas")
        replica_timeout = _positive(options, "replicaTimeoutMs", 5000)
        assert replica_timeout is not None
        return cls(
            url=url,
            endpoint=endpoint,
            queues=queues,
            starting=starting,
            ending=ending,
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            min_partitions=min_partitions,
            max_records_per_partition=_positive(options, "maxRecordsPerPartition", None),
            max_records_per_trigger=max_per_trigger,
            prefetch=min(prefetch, 65535),
            poll_timeout_ms=poll_timeout,
            read_from=read_from,
            replicas=replicas,
            replica_timeout_ms=replica_timeout,
        )


@dataclass(frozen=True)
class SinkOptions:
    """Where and how the sink publishes."""

    url: str
    endpoint: Endpoint
    exchange: str
    routing_key: str | None
    routing_key_column: str | None
    dedup_header: str
    persistent: bool
    max_unconfirmed: int
    #: Publish mandatory and fail the task on a basic.return (Kafka-style name:
    #: as ``failOnDataLoss``); false drops rows no queue takes.
    fail_on_unroutable: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        endpoint = Endpoint.parse(options)
        url = endpoint.urls[0]
        exchange = _get(options, "exchange")
        topic = _get(options, "topic")
        if exchange is not None and topic is not None:
            raise OptionError("topic", "give exchange or topic (Kafka's name for it), not both")
        exchange = (exchange if exchange is not None else topic) or ""
        routing_key = _get(options, "routingKey")
        column = _get(options, "routingKeyColumn")
        if routing_key is not None and column is not None:
            raise OptionError("routingKeyColumn", "give routingKey or routingKeyColumn, not both")
        if column is not None and not column.strip():
            raise OptionError("routingKeyColumn", "empty column name")
        for name, value in (("exchange", exchange), ("routingKey", routing_key or "")):
            if len(value.encode()) > 255:
                raise OptionError(name, "longer than 255 bytes")
        header = _get(options, "deduplicationHeader") or DEFAULT_DEDUP_HEADER
        if len(header.encode()) > 255:
            raise OptionError("deduplicationHeader", "longer than 255 bytes")
        max_unconfirmed = _positive(options, "maxUnconfirmed", 10_000)
        assert max_unconfirmed is not None
        return cls(
            url=url,
            endpoint=endpoint,
            exchange=exchange,
            routing_key=routing_key,
            routing_key_column=column.strip() if column is not None else None,
            dedup_header=header,
            persistent=_bool(options, "persistent", True),
            max_unconfirmed=max_unconfirmed,
            fail_on_unroutable=_bool(options, "failOnUnroutable", True),
        )
