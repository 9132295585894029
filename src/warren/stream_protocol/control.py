"""The commands of an open stream protocol connection that carry no message.

Create and Delete (a stream is a stream queue: declared and deleted in the
vhost as over AMQP, its definition durable before the answer), Metadata and
MetadataUpdate, StoreOffset/QueryOffset (the stream's server-side tracking,
store/stream_tracking.py, shared with AMQP's tracked consumers),
DeclarePublisher/QueryPublisherSequence/DeletePublisher, Subscribe/Credit/
Unsubscribe (validation and bookkeeping; the records themselves are
publishing.py's and delivering.py's), StreamStats, ResolveOffsetSpec,
ExchangeCommandVersions, and the super streams' CreateSuperStream,
DeleteSuperStream, Route and Partitions (core/super_stream.py). Response
codes and their order of checks follow RabbitMQ's rabbit_stream_reader.

Offsets: RabbitMQ stores the offset of the last message a consumer
processed; Warren's tracking keeps the next one to read (what AMQP's tracked
consumers resume from). StoreOffset ``n`` is kept as ``n + 1`` and QueryOffset
answers the kept value minus one, so both protocols agree on a position.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from warren.core import super_stream
from warren.core.equivalence import check_queue_equivalent
from warren.core.errors import AccessRefused, BrokerError, NotFound, PreconditionFailed
from warren.core.stream import StartSpec
from warren.core.stream_queue import StreamQueue
from warren.core.super_stream import stream_arguments
from warren.stream_protocol import commands as c
from warren.stream_protocol.constants import (
    SERVER_COMMAND_VERSIONS,
    Key,
    OffsetType,
    ResponseCode,
)
from warren.stream_protocol.delivering import Delivering
from warren.stream_protocol.publish import Publish
from warren.stream_protocol.publishing import SEQUENCE_PREFIX, Publishing, last_sequence
from warren.stream_protocol.wire import (
    Broker,
    CommandVersion,
    OffsetSpec,
    StreamMetadata,
    StreamProtocolError,
)

if TYPE_CHECKING:
    from warren.stream_protocol.connection import StreamConnection

__all__ = ["ControlPlane", "Publisher", "Subscription", "stream_arguments"]

log = logging.getLogger("warren.stream")

OK: Final = int(ResponseCode.OK)
#: A stream's leader reference in Metadata when the stream has none.
NO_LEADER: Final = 0xFFFF
#: The most credit a subscription holds (Credit adds up to 65535 at a time).
MAX_CREDIT: Final = 1 << 31
#: Publishers and subscriptions per connection (their ids are one byte).
MAX_PUBLISHERS: Final = 256
MAX_SUBSCRIPTIONS: Final = 256

CONFIGURE: Final = "configure"
WRITE: Final = "write"
READ: Final = "read"
QUEUE: Final = "queue"
EXCHANGE: Final = "exchange"


@dataclass(slots=True)
class Publisher:
    publisher_id: int
    stream: str
    reference: str
    queue: StreamQueue
    #: Records received, confirmed and refused (the management API's
    #: published/confirmed/errored, counted per frame and batch).
    published: int = 0
    confirmed: int = 0
    errored: int = 0


@dataclass(slots=True)
class Subscription:
    subscription_id: int
    stream: str
    offset: OffsetSpec
    #: Where it starts, resolved at Subscribe.
    start: int
    credit: int
    properties: dict[str, str]
    queue: StreamQueue
    #: Records delivered, and the offset of the last (counted per chunk).
    consumed: int = 0
    last_offset: int = 0


def _name(stream: str) -> str | None:
    """RabbitMQ's rule for a new stream's name: CR and LF dropped, then not
    empty and not under ``amq.``; None when refused."""
    name = stream.replace("\n", "").replace("\r", "")
    if not name or name.startswith("amq.") or len(name.encode("utf-8")) > 255:
        return None
    return name


class ControlPlane:
    """One connection's publishers and subscriptions, and the handlers of its
    commands (``handle``)."""

    def __init__(self, conn: StreamConnection) -> None:
        self.conn = conn
        self.publishers: dict[int, Publisher] = {}
        self.subscriptions: dict[int, Subscription] = {}
        #: A resource alarm: new publishers are refused (PRECONDITION_FAILED).
        self.blocked = False
        self.publishing = Publishing(conn)
        self.delivering = Delivering(conn)
        self._handlers: dict[type[c.Command], Callable[[Any], None]] = {
            c.Create: self._create,
            c.Delete: self._delete,
            c.Metadata: self._metadata,
            c.StoreOffset: self._store_offset,
            c.QueryOffset: self._query_offset,
            c.DeclarePublisher: self._declare_publisher,
            c.QueryPublisherSequence: self._query_publisher_sequence,
            c.DeletePublisher: self._delete_publisher,
            Publish: self._publish,
            c.Subscribe: self._subscribe,
            c.Credit: self._credit,
            c.Unsubscribe: self._unsubscribe,
            c.StreamStats: self._stream_stats,
            c.ResolveOffsetSpec: self._resolve_offset_spec,
            c.ExchangeCommandVersions: self._exchange_command_versions,
            c.Route: self._route,
            c.Partitions: self._partitions,
            c.CreateSuperStream: self._create_super_stream,
            c.DeleteSuperStream: self._delete_super_stream,
            c.ConsumerUpdateResponse: self._consumer_update_response,
        }

    def handle(self, command: c.Command) -> None:
        """Act on one command of an open connection; StreamProtocolError when
        the client may not send it (the connection closes with its code)."""
        handler = self._handlers.get(type(command))
        if handler is None:
            raise StreamProtocolError(f"unexpected {type(command).__name__}")
        if type(command) is not Publish:
            self.publishing.flush()  # the Publish frames before it are stored first
        handler(command)

    def closed(self) -> None:
        """The connection is closing: its publishers and subscriptions go."""
        self.publishers.clear()
        self.subscriptions.clear()
        self.delivering.close()

    def before_output(self) -> None:
        """The end of a turn: confirms, and the chunks gathered for subscriptions."""
        self.publishing.before_output()
        self.delivering.before_output()

    # -- helpers ------------------------------------------------------------------------
    @property
    def _vhost(self) -> Any:
        vhost = self.conn.vhost
        assert vhost is not None
        return vhost

    def _stream(self, name: str) -> StreamQueue | None:
        q = self._vhost.queues.get(name)
        return q if isinstance(q, StreamQueue) and not q.deleted else None

    def _allowed(self, kind: str, name: str) -> bool:
        return self.conn.client_session.allowed(kind, QUEUE, name)

    # -- streams ------------------------------------------------------------------------
    def _create(self, command: c.Create) -> None:
        corr = command.correlation_id
        name = _name(command.stream)
        if name is None:
            self.conn.reply(c.CreateResponse(corr, ResponseCode.PRECONDITION_FAILED))
            return
        if not self._allowed(CONFIGURE, name):
            self.conn.reply(c.CreateResponse(corr, ResponseCode.ACCESS_REFUSED))
            return
        vhost = self._vhost
        existing = vhost.queues.get(name)
        if existing is not None:
            # RabbitMQ: STREAM_ALREADY_EXISTS for an equivalent declaration only
            code = ResponseCode.STREAM_ALREADY_EXISTS
            try:
                arguments = stream_arguments(command.arguments)
                check_queue_equivalent(vhost.name, existing, True, False, False, arguments)
            except PreconditionFailed:
                code = ResponseCode.PRECONDITION_FAILED
            self.conn.reply(c.CreateResponse(corr, code))
            return
        mark = self.conn.client_session.change_mark()
        try:
            vhost.declare_queue(name, durable=True, arguments=stream_arguments(command.arguments))
        except PreconditionFailed as exc:
            log.warning("%s: stream '%s' not created: %s", self.conn.name, name, exc.text)
            self.conn.reply(c.CreateResponse(corr, ResponseCode.PRECONDITION_FAILED))
            return
        except AccessRefused:
            self.conn.reply(c.CreateResponse(corr, ResponseCode.ACCESS_REFUSED))
            return
        except BrokerError as exc:
            log.warning("%s: stream '%s' not created: %s", self.conn.name, name, exc.text)
            self.conn.reply(c.CreateResponse(corr, ResponseCode.INTERNAL_ERROR))
            return
        self.conn.reply_after(mark, c.CreateResponse(corr))

    def _delete(self, command: c.Delete) -> None:
        corr, name = command.correlation_id, command.stream
        if not self._allowed(CONFIGURE, name):
            self.conn.reply(c.DeleteResponse(corr, ResponseCode.ACCESS_REFUSED))
            return
        if self._stream(name) is None:
            self.conn.reply(c.DeleteResponse(corr, ResponseCode.STREAM_DOES_NOT_EXIST))
            return
        vhost = self._vhost
        mark = self.conn.client_session.change_mark()
        try:
            vhost.delete_queue(name)
        except BrokerError as exc:
            log.warning("%s: stream '%s' not deleted: %s", self.conn.name, name, exc.text)
            self.conn.reply(c.DeleteResponse(corr, ResponseCode.INTERNAL_ERROR))
            return
        self.conn.reply_after(mark, c.DeleteResponse(corr))
        self._streams_deleted(vhost, [name])

    def _streams_deleted(self, vhost: Any, streams: list[str]) -> None:
        """Every stream connection with a publisher or subscription on one of
        ``streams`` hears (RabbitMQ: its stream monitors), this one after its
        answer."""
        for other in list(getattr(self.conn.node, "connections", ())):
            gone = getattr(other, "stream_gone", None)
            if gone is not None and getattr(other, "vhost", None) is vhost:
                for stream in streams:
                    gone(stream)
        for stream in streams:
            self.stream_gone(stream)

    def stream_gone(self, stream: str) -> None:
        """``stream`` was deleted: its publishers and subscriptions here go,
        and the client is told (MetadataUpdate, STREAM_NOT_AVAILABLE)."""
        pubs = [p for p, v in self.publishers.items() if v.stream == stream]
        subs = [s for s, v in self.subscriptions.items() if v.stream == stream]
        if not pubs and not subs:
            return
        for pid in pubs:
            del self.publishers[pid]
        for sid in subs:
            del self.subscriptions[sid]
            self.delivering.unsubscribe(sid)
        self.conn.reply(c.MetadataUpdate(ResponseCode.STREAM_NOT_AVAILABLE, stream))

    def check_gone(self) -> None:
        """Streams deleted by another protocol (AMQP, the HTTP API) under a
        publisher or subscription: looked for at each heartbeat check, until
        deliveries give subscriptions a consumer whose cancel says so."""
        held = [p.queue for p in self.publishers.values()]
        held += [s.queue for s in self.subscriptions.values()]
        for name in {q.name for q in held if q.deleted}:
            self.stream_gone(name)

    def _metadata(self, command: c.Metadata) -> None:
        """This node leads every stream it has; in a cluster, the in-sync
        followers' stream protocol read services are each stream's replicas."""
        host, port = self.conn.advertised
        brokers = [Broker(0, host, port)] + [
            Broker(ref, *addr) for ref, addr in enumerate(self._replicas(), 1)
        ]
        refs = tuple(b.reference for b in brokers[1:])
        seen: dict[str, StreamMetadata] = {}
        for name in command.streams:
            if name in seen:
                continue
            if self._stream(name) is None:
                seen[name] = StreamMetadata(name, ResponseCode.STREAM_DOES_NOT_EXIST, NO_LEADER)
            else:
                seen[name] = StreamMetadata(name, OK, 0, refs)
        if not any(m.code == OK for m in seen.values()):
            brokers = []
        self.conn.reply(c.MetadataResponse(command.correlation_id, brokers, list(seen.values())))

    def _replicas(self) -> list[tuple[str, int]]:
        """(host, port) of the followers' stream protocol read services. They
        serve TLS when the nodes have a certificate (``[main] tls_cert``, as
        this one's): named to a client whose connection is the same kind."""
        replicas = getattr(self.conn.node, "stream_protocol_replicas", None)
        tls = self.conn.transport_name == "stream/TLS"
        if replicas is None or tls != bool(self.conn.config.tls_cert):
            return []
        out = []
        for address in replicas() if replicas is not None else ():
            host, _, port = address.rpartition(":")
            if host and port.isdigit():
                out.append((host, int(port)))
        return out

    def _stream_stats(self, command: c.StreamStats) -> None:
        """first_chunk_id and committed_chunk_id: Warren's chunks are single
        messages today, so the first offset and the last (-1: none)."""
        corr = command.correlation_id
        if not self._allowed(READ, command.stream):
            self.conn.reply(c.StreamStatsResponse(corr, ResponseCode.ACCESS_REFUSED, {}))
            return
        q = self._stream(command.stream)
        if q is None:
            self.conn.reply(c.StreamStatsResponse(corr, ResponseCode.STREAM_DOES_NOT_EXIST, {}))
            return
        log_ = q.stream
        empty = log_.next_offset <= log_.first_offset
        stats = {
            "first_chunk_id": -1 if empty else log_.first_offset,
            "committed_chunk_id": -1 if empty else log_.next_offset - 1,
        }
        self.conn.reply(c.StreamStatsResponse(corr, OK, stats))

    # -- offsets ------------------------------------------------------------------------
    def _store_offset(self, command: c.StoreOffset) -> None:
        """No answer, as in RabbitMQ: a refusal is only logged."""
        name, reference = command.stream, command.reference
        if not any(s.stream == name for s in self.subscriptions.values()) and not self._allowed(
            READ, name
        ):
            log.warning("%s: StoreOffset on '%s' refused", self.conn.name, name)
            return
        q = self._stream(name)
        if (
            q is None
            or not reference
            or reference.startswith(SEQUENCE_PREFIX)  # publishers' sequences
            or len(reference.encode("utf-8")) > 255
        ):
            log.warning("%s: StoreOffset '%s' on '%s' ignored", self.conn.name, reference, name)
            return
        q.stream.track(reference, command.offset + 1)

    def _query_offset(self, command: c.QueryOffset) -> None:
        corr = command.correlation_id
        if not self._allowed(READ, command.stream):
            self.conn.reply(c.QueryOffsetResponse(corr, ResponseCode.ACCESS_REFUSED, 0))
            return
        q = self._stream(command.stream)
        if q is None:
            self.conn.reply(c.QueryOffsetResponse(corr, ResponseCode.STREAM_DOES_NOT_EXIST, 0))
            return
        ref = command.reference
        tracked = q.stream.tracked(ref) if ref and not ref.startswith(SEQUENCE_PREFIX) else None
        if not tracked:  # None, or 0: nothing processed yet
            self.conn.reply(c.QueryOffsetResponse(corr, ResponseCode.NO_OFFSET, 0))
            return
        self.conn.reply(c.QueryOffsetResponse(corr, OK, tracked - 1))

    def _resolve_offset_spec(self, command: c.ResolveOffsetSpec) -> None:
        corr = command.correlation_id
        if not self._allowed(READ, command.stream):
            self.conn.reply(c.ResolveOffsetSpecResponse(corr, ResponseCode.ACCESS_REFUSED))
            return
        q = self._stream(command.stream)
        if q is None:
            self.conn.reply(c.ResolveOffsetSpecResponse(corr, ResponseCode.STREAM_DOES_NOT_EXIST))
            return
        spec = start_spec(command.offset)
        if spec is None:
            self.conn.reply(c.ResolveOffsetSpecResponse(corr, ResponseCode.NO_OFFSET))
            return
        self.conn.reply(c.ResolveOffsetSpecResponse(corr, OK, offset=spec.resolve(q.stream)))

    # -- publishers ---------------------------------------------------------------------
    def _declare_publisher(self, command: c.DeclarePublisher) -> None:
        corr, name, ref = command.correlation_id, command.stream, command.reference
        if self.blocked or len(self.publishers) >= MAX_PUBLISHERS:
            self.conn.reply(c.DeclarePublisherResponse(corr, ResponseCode.PRECONDITION_FAILED))
            return
        if not self._allowed(WRITE, name):
            self.conn.reply(c.DeclarePublisherResponse(corr, ResponseCode.ACCESS_REFUSED))
            return
        if len(ref.encode("utf-8")) > 255:
            self.conn.reply(c.DeclarePublisherResponse(corr, ResponseCode.PRECONDITION_FAILED))
            return
        taken = command.publisher_id in self.publishers or (
            ref != ""
            and any(p.stream == name and p.reference == ref for p in self.publishers.values())
        )
        if taken:
            self.conn.reply(c.DeclarePublisherResponse(corr, ResponseCode.PRECONDITION_FAILED))
            return
        q = self._stream(name)
        if q is None:
            self.conn.reply(c.DeclarePublisherResponse(corr, ResponseCode.STREAM_DOES_NOT_EXIST))
            return
        self.publishers[command.publisher_id] = Publisher(command.publisher_id, name, ref, q)
        self.conn.reply(c.DeclarePublisherResponse(corr))

    def _query_publisher_sequence(self, command: c.QueryPublisherSequence) -> None:
        """The last publishing id stored for the reference (0 for one not seen,
        as RabbitMQ)."""
        corr = command.correlation_id
        if not self._allowed(READ, command.stream):
            self.conn.reply(c.QueryPublisherSequenceResponse(corr, ResponseCode.ACCESS_REFUSED, 0))
            return
        q = self._stream(command.stream)
        if q is None:
            self.conn.reply(
                c.QueryPublisherSequenceResponse(corr, ResponseCode.STREAM_DOES_NOT_EXIST, 0)
            )
            return
        sequence = last_sequence(q, command.reference) if command.reference else 0
        self.conn.reply(c.QueryPublisherSequenceResponse(corr, OK, sequence))

    def _delete_publisher(self, command: c.DeletePublisher) -> None:
        corr = command.correlation_id
        if self.publishers.pop(command.publisher_id, None) is None:
            self.conn.reply(c.DeletePublisherResponse(corr, ResponseCode.PUBLISHER_DOES_NOT_EXIST))
            return
        self.conn.reply(c.DeletePublisherResponse(corr))

    def _publish(self, command: Publish) -> None:
        """Stored by publishing.py; PUBLISHER_DOES_NOT_EXIST for an unknown
        publisher (or one whose stream is gone), as RabbitMQ."""
        pub = self.publishers.get(command.publisher_id)
        if pub is not None and pub.queue.deleted:
            self.stream_gone(pub.stream)
            pub = None
        self.publishing.publish(command, pub)

    # -- subscriptions ------------------------------------------------------------------
    def _subscribe(self, command: c.Subscribe) -> None:
        """Checked and kept; delivering chunks is the next step."""
        corr, sid, name = command.correlation_id, command.subscription_id, command.stream
        if sid in self.subscriptions:
            self.conn.reply(c.SubscribeResponse(corr, ResponseCode.SUBSCRIPTION_ID_ALREADY_EXISTS))
            return
        if len(self.subscriptions) >= MAX_SUBSCRIPTIONS or not (
            self.conn.node.rate_limits.allow_subscription(len(self.subscriptions))
        ):
            self.conn.reply(c.SubscribeResponse(corr, ResponseCode.PRECONDITION_FAILED))
            return
        if not self._allowed(READ, name):
            self.conn.reply(c.SubscribeResponse(corr, ResponseCode.ACCESS_REFUSED))
            return
        q = self._stream(name)
        if q is None:
            self.conn.reply(c.SubscribeResponse(corr, ResponseCode.STREAM_DOES_NOT_EXIST))
            return
        spec = start_spec(command.offset)
        props = command.properties
        sac = props.get("single-active-consumer", "false").lower() == "true"
        if spec is None or (sac and not props.get("name")):
            self.conn.reply(c.SubscribeResponse(corr, ResponseCode.PRECONDITION_FAILED))
            return
        sub = Subscription(
            sid, name, command.offset, spec.resolve(q.stream), command.credit, dict(props), q
        )
        if self.delivering.group_conflict(sub):
            log.warning("%s: subscription %d: its group has another partition", self.conn.name, sid)
            self.conn.reply(c.SubscribeResponse(corr, ResponseCode.PRECONDITION_FAILED))
            return
        self.subscriptions[sid] = sub
        self.conn.reply(c.SubscribeResponse(corr))
        try:
            self.delivering.subscribe(sub)
        except BrokerError as exc:  # pragma: no cover - Subscribe's checks come first
            log.warning("%s: subscription %d not attached: %s", self.conn.name, sid, exc.text)

    def _credit(self, command: c.Credit) -> None:
        """Answered only when refused."""
        sub = self.subscriptions.get(command.subscription_id)
        if sub is None:
            self.conn.reply(
                c.CreditResponse(
                    ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST, command.subscription_id
                )
            )
            return
        sub.credit = min(sub.credit + command.credit, MAX_CREDIT)
        self.delivering.credit(sub.subscription_id)

    def _unsubscribe(self, command: c.Unsubscribe) -> None:
        corr = command.correlation_id
        if self.subscriptions.pop(command.subscription_id, None) is None:
            self.conn.reply(
                c.UnsubscribeResponse(corr, ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST)
            )
            return
        self.delivering.unsubscribe(command.subscription_id)
        self.conn.reply(c.UnsubscribeResponse(corr))

    # -- the rest -----------------------------------------------------------------------
    def _exchange_command_versions(self, command: c.ExchangeCommandVersions) -> None:
        """Deliver v2 (with the committed chunk id) for a client that takes it."""
        self.delivering.v2 = any(
            v.key == Key.DELIVER and v.max_version >= 2 for v in command.versions
        )
        versions = [CommandVersion(int(k), lo, hi) for k, lo, hi in SERVER_COMMAND_VERSIONS]
        self.conn.reply(c.ExchangeCommandVersionsResponse(command.correlation_id, OK, versions))

    # -- super streams (core/super_stream.py) ----------------------------------------------
    def _route(self, command: c.Route) -> None:
        """Write on the exchange, then on every stream routed to (RabbitMQ's
        order); no route is OK with no streams."""
        corr, name = command.correlation_id, command.super_stream
        if not self.conn.client_session.allowed(WRITE, EXCHANGE, name):
            self.conn.reply(c.RouteResponse(corr, ResponseCode.ACCESS_REFUSED, []))
            return
        try:
            streams = super_stream.route(self._vhost, name, command.routing_key)
        except NotFound:
            self.conn.reply(c.RouteResponse(corr, ResponseCode.STREAM_DOES_NOT_EXIST, []))
            return
        if not all(self._allowed(WRITE, s) for s in streams):
            self.conn.reply(c.RouteResponse(corr, ResponseCode.ACCESS_REFUSED, []))
            return
        self.conn.reply(c.RouteResponse(corr, OK, streams))

    def _partitions(self, command: c.Partitions) -> None:
        """Read or write on the exchange and on every partition."""
        corr, name = command.correlation_id, command.super_stream
        if not self._read_or_write(EXCHANGE, name):
            self.conn.reply(c.PartitionsResponse(corr, ResponseCode.ACCESS_REFUSED, []))
            return
        try:
            streams = super_stream.partitions(self._vhost, name)
        except NotFound:
            self.conn.reply(c.PartitionsResponse(corr, ResponseCode.STREAM_DOES_NOT_EXIST, []))
            return
        if not all(self._read_or_write(QUEUE, s) for s in streams):
            self.conn.reply(c.PartitionsResponse(corr, ResponseCode.ACCESS_REFUSED, []))
            return
        self.conn.reply(c.PartitionsResponse(corr, OK, streams))

    def _read_or_write(self, resource_type: str, name: str) -> bool:
        session = self.conn.client_session
        return session.allowed(READ, resource_type, name) or session.allowed(
            WRITE, resource_type, name
        )

    def _create_super_stream(self, command: c.CreateSuperStream) -> None:
        """Answered once the exchange, streams and bindings are durable."""
        corr, name = command.correlation_id, command.name
        mark = self.conn.client_session.change_mark()
        try:
            super_stream.create(
                self._vhost,
                name,
                command.partitions,
                command.binding_keys,
                command.arguments,
                self.conn.client_session.check,
            )
        except BrokerError as exc:
            code = _super_stream_code(exc)
            if code != ResponseCode.ACCESS_REFUSED:
                log.warning("%s: super stream '%s' not created: %s", self.conn.name, name, exc.text)
            self.conn.reply(c.CreateSuperStreamResponse(corr, code))
            return
        self.conn.reply_after(mark, c.CreateSuperStreamResponse(corr))

    def _delete_super_stream(self, command: c.DeleteSuperStream) -> None:
        """Answered once the deletions are durable; then the publishers and
        subscriptions of its partitions hear, as for Delete."""
        corr, name = command.correlation_id, command.name
        vhost = self._vhost
        mark = self.conn.client_session.change_mark()
        try:
            deleted = super_stream.delete(vhost, name, self.conn.client_session.check)
        except BrokerError as exc:
            code = _super_stream_code(exc)
            self.conn.reply(c.DeleteSuperStreamResponse(corr, code))
            return
        self.conn.reply_after(mark, c.DeleteSuperStreamResponse(corr))
        self._streams_deleted(vhost, deleted)

    def _consumer_update_response(self, command: c.ConsumerUpdateResponse) -> None:
        """Where a newly active single active consumer starts: the answer's
        offset spec, or for NONE its Subscribe's, resolved now (RabbitMQ opens
        the reader at the activation)."""
        sid = self.delivering.updates.get(command.correlation_id)
        sub = self.subscriptions.get(sid) if sid is not None else None
        start = None
        if sub is not None:
            spec = start_spec(command.offset) or start_spec(sub.offset)
            if spec is not None:
                start = spec.resolve(sub.queue.stream)
        self.delivering.update_answered(command, start)


def _super_stream_code(exc: BrokerError) -> int:
    """A super stream refusal's response code (rabbit_stream_reader's)."""
    if isinstance(exc, AccessRefused):
        return int(ResponseCode.ACCESS_REFUSED)
    if isinstance(exc, NotFound):
        return int(ResponseCode.STREAM_DOES_NOT_EXIST)
    if isinstance(exc, super_stream.AlreadyExists):
        return int(ResponseCode.STREAM_ALREADY_EXISTS)
    if isinstance(exc, PreconditionFailed):
        return int(ResponseCode.PRECONDITION_FAILED)
    return int(ResponseCode.INTERNAL_ERROR)


def start_spec(offset: OffsetSpec) -> StartSpec | None:
    """An offset spec as the core's StartSpec; None for NONE (not a start)."""
    kind = offset.type
    if kind == OffsetType.FIRST:
        return StartSpec("first")
    if kind == OffsetType.LAST:
        return StartSpec("last")
    if kind == OffsetType.NEXT:
        return StartSpec("next")
    if kind == OffsetType.OFFSET:
        return StartSpec("offset", offset.value)
    if kind == OffsetType.TIMESTAMP:
        return StartSpec("timestamp", offset.value)
    return None
