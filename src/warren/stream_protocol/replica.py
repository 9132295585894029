"""A cluster follower's stream protocol read service, sans-IO.

A follower holds the leader's stream segments byte for byte but runs no
broker. Like RabbitMQ's stream replicas, it serves consumers: Metadata names
the in-sync followers' read services as a stream's replicas, and clients
(rstream, the Java client) subscribe there. `ReplicaStreamConnection` speaks
the protocol over a `ReadOnlyView` of the follower's directory (its users,
vhosts, stream queues and read-only stores, store/replica_catalog.py): the
handshake (PLAIN with the replicated users), Metadata, Subscribe/Credit/
Unsubscribe (offset specs and filters as on the leader), QueryOffset,
QueryPublisherSequence, StreamStats and ResolveOffsetSpec from the
replicated files. Single active consumers (their groups) and StoreOffset
are the leader's: forwarded there (replica_forward.py) when the server gives
a way to reach it (``connect``); without one, refused with
PRECONDITION_FAILED, and StoreOffset (which has no answer) logged. The view
has no write path, and the rest of what would change anything is refused as
RabbitMQ refuses it where the leader is not available: DeclarePublisher with
STREAM_NOT_AVAILABLE, Publish with PUBLISHER_DOES_NOT_EXIST, Create/Delete
and the super stream commands with ACCESS_REFUSED.

Records are read through the same StreamCursor the leader's consumers use
and sent as the leader's Deliver frames (chunk.py's chunks, a new chunk
where offsets stop being consecutive, one credit per chunk). The transport
calls ``pump()`` after each batch the follower applied.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from warren import __version__
from warren.core.errors import AccessRefused
from warren.core.stream import filter_wants
from warren.core.users import READ, User, UserStore
from warren.stream_protocol import commands as c
from warren.stream_protocol.chunk import build_chunk, simple_entry
from warren.stream_protocol.connection import MISSED_HEARTBEATS, negotiate
from warren.stream_protocol.constants import (
    INITIAL_FRAME_MAX,
    SERVER_COMMAND_VERSIONS,
    Key,
    ResponseCode,
)
from warren.stream_protocol.control import MAX_CREDIT, MAX_SUBSCRIPTIONS, NO_LEADER, start_spec
from warren.stream_protocol.delivering import CHUNK_RECORDS, send_chunk
from warren.stream_protocol.frames import FrameReader, decode_frame
from warren.stream_protocol.messages import RawMessages, StreamMessageCodec
from warren.stream_protocol.publish import Publish
from warren.stream_protocol.publishing import SEQUENCE_PREFIX, sequence_name
from warren.stream_protocol.replica_forward import Connect, Forwarding
from warren.stream_protocol.wire import (
    Broker,
    CommandVersion,
    OffsetSpec,
    PublishingError,
    StreamMetadata,
    StreamProtocolError,
)

if TYPE_CHECKING:
    from warren.core.stream import StartSpec
    from warren.store.stream_replica import ReplicaStreamStore
    from warren.store.stream_store import StreamCursor

__all__ = ["ReadOnlyView", "ReplicaStreamConnection"]

log = logging.getLogger("warren.stream")

OK: Final = int(ResponseCode.OK)
#: Chunks per subscription and pump: other subscriptions' turns come between.
_CHUNKS_PER_PUMP: Final = 16
#: ms a client has to log in and open (server.py's HANDSHAKE_TIMEOUT_MS).
HANDSHAKE_TIMEOUT_MS: Final = 10_000

# Connection states, in order (connection.py's).
_STARTING: Final = 0
_AUTHENTICATED: Final = 1
_OPEN: Final = 2
_CLOSE_SENT: Final = 3
_CLOSED: Final = 4


class ReadOnlyView(Protocol):
    """What a follower's read service may see of its replicated directory
    (ReplicaCatalog): nothing here writes."""

    def users(self) -> UserStore: ...

    def vhosts(self) -> list[str]: ...

    def queue(self, vhost: str, name: str) -> dict[str, Any] | None: ...

    def stream(self, vhost: str, name: str) -> ReplicaStreamStore | None: ...


@dataclass(slots=True)
class ReplicaSubscription:
    subscription_id: int
    stream: str
    #: Its Subscribe's offset spec, and where that resolved.
    offset: OffsetSpec
    start: int
    credit: int
    properties: dict[str, str]
    filters: frozenset[str] | None
    match_unfiltered: bool
    #: A single active consumer (forwarded): whether it is active; None for others.
    sac_active: bool | None = None
    #: The last ConsumerUpdate sent for it (only its answer activates it).
    update: int = 0
    #: None until the stream's files exist on this node.
    cursor: StreamCursor | None = None
    consumed: int = 0
    last_offset: int = 0
    #: A record read past a chunk's end (a gap after it): the next chunk's first.
    held: tuple[int, int, bytes] | None = field(default=None)


class ReplicaStreamConnection:
    """One client of a follower's stream protocol read service."""

    def __init__(
        self,
        view: ReadOnlyView,
        name: str,
        advertised: tuple[str, int],
        metadata: Callable[[], tuple[tuple[str, int] | None, list[tuple[str, int]]]],
        now_ms: Callable[[], int],
        messages: StreamMessageCodec | None = None,
        frame_max: int = 1_048_576,
        heartbeat: int = 60,
        connect: Connect | None = None,
    ) -> None:
        self.view = view
        self.name = name
        #: (host, port) of this service, told in Open's answer.
        self.advertised = advertised
        #: The leader's stream address (None: unknown) and the replicas'.
        self._metadata = metadata
        self._now_ms = now_ms
        self.messages: StreamMessageCodec = messages or RawMessages()
        self.frame_max = frame_max
        self.heartbeat = heartbeat
        self.reader = FrameReader(INITIAL_FRAME_MAX)
        self.state = _STARTING
        self.output: list[bytes] = []
        self.closed = False  # nothing more is read; close the socket after the output
        self.user: User | None = None
        #: The PLAIN login, for the link to the leader (its permissions are checked there).
        self.credentials = ("", "")
        self.vhost = ""
        self.client_properties: dict[str, str] = {}
        self.subscriptions: dict[int, ReplicaSubscription] = {}
        #: Deliver v2 (with the committed chunk id): the client offered it.
        self.v2 = False
        self.connected_at = self.last_rx_ms = self.last_tx_ms = now_ms()
        #: Single active consumers and StoreOffset, to the leader (None: refused).
        self.forwarding = Forwarding(self, connect) if connect is not None else None

    # -- the sans-IO surface ----------------------------------------------------------
    def send(self, command: c.Command) -> None:
        self.output.append(command.encode())

    def take_output(self) -> list[bytes]:
        out, self.output = self.output, []
        if out:
            self.last_tx_ms = self._now_ms()
        return out

    def feed(self, data: bytes) -> None:
        if self.closed or not data:
            return
        self.last_rx_ms = self._now_ms()
        try:
            for frame in self.reader.feed(data):
                if self.closed:
                    return
                self._command(decode_frame(frame))
        except StreamProtocolError as exc:
            log.warning("%s: stream protocol error: %s", self.name, exc)
            if self.state < _OPEN:
                self.close_transport()
            elif exc.code == ResponseCode.FRAME_TOO_LARGE:
                self._close(exc.code, "frame too large")
            else:
                self._close(exc.code, "unknown frame")
            return
        self.pump()

    def close_transport(self) -> None:
        self.closed = True
        self.state = _CLOSED
        self._release()

    def close(self) -> None:
        """The transport is gone."""
        self.close_transport()

    def tick(self, now_ms: int) -> None:
        """The heartbeat: a Heartbeat frame after an interval of silence, the end
        of the connection after MISSED_HEARTBEATS of them from the client; a
        client not open after HANDSHAKE_TIMEOUT_MS is cut off."""
        if not self.closed and self.state < _OPEN:
            if now_ms - self.connected_at >= HANDSHAKE_TIMEOUT_MS:
                log.warning("%s: stream handshake timed out, closing", self.name)
                self.close_transport()
            return
        if self.closed or self.state != _OPEN or not self.heartbeat:
            return
        interval = self.heartbeat * 1000
        if now_ms - self.last_rx_ms >= interval * MISSED_HEARTBEATS:
            log.warning("%s: stream connection missed heartbeats, closing", self.name)
            self.close_transport()
        elif now_ms - self.last_tx_ms >= interval:
            self.send(c.Heartbeat())

    def streams(self) -> set[tuple[str, str]]:
        """(vhost, stream) of every subscription (the server pumps those that grew)."""
        return {(self.vhost, s.stream) for s in self.subscriptions.values()}

    # -- dispatch -----------------------------------------------------------------------
    def _command(self, command: c.Command) -> None:
        state = self.state
        if isinstance(command, c.Heartbeat):
            return
        if state == _CLOSE_SENT:
            if isinstance(command, c.Close):
                self.send(c.CloseResponse(command.correlation_id))
            if isinstance(command, (c.Close, c.CloseResponse)):
                self.close_transport()
            return
        if isinstance(command, c.Close):
            self.send(c.CloseResponse(command.correlation_id))
            self.close_transport()
        elif state == _OPEN:
            self._open_command(command)
        elif isinstance(command, c.PeerProperties) and state == _STARTING:
            self.client_properties = dict(command.properties)
            self.send(c.PeerPropertiesResponse(command.correlation_id, OK, _properties()))
        elif isinstance(command, c.SaslHandshake) and state == _STARTING:
            self.send(c.SaslHandshakeResponse(command.correlation_id, OK, ["PLAIN"]))
        elif isinstance(command, c.SaslAuthenticate) and state == _STARTING:
            self._authenticate(command)
        elif isinstance(command, (c.Tune, c.TuneResponse)) and state == _AUTHENTICATED:
            self.frame_max = negotiate(command.frame_max, self.frame_max)
            self.heartbeat = negotiate(command.heartbeat, self.heartbeat)
        elif isinstance(command, c.Open) and state == _AUTHENTICATED:
            self._open(command)
        else:
            log.warning("%s: stream protocol %s out of order", self.name, type(command).__name__)
            self.close_transport()

    def _authenticate(self, command: c.SaslAuthenticate) -> None:
        user = None
        if command.mechanism == "PLAIN":
            parts = command.data.split(b"\x00")
            if len(parts) == 3 and (not parts[0] or parts[0] == parts[1]):
                name = parts[1].decode("utf-8", "replace")
                password = parts[2].decode("utf-8", "replace")
                user = self.view.users().authenticate(name, password)
                if user is not None:
                    self.credentials = (name, password)
            code = ResponseCode.AUTHENTICATION_FAILURE
        else:
            code = ResponseCode.SASL_MECHANISM_NOT_SUPPORTED
        if user is None:
            log.warning("%s: replica stream login refused", self.name)
            self.send(c.SaslAuthenticateResponse(command.correlation_id, int(code)))
            self.close_transport()
            return
        self.user = user
        self.state = _AUTHENTICATED
        self.send(c.SaslAuthenticateResponse(command.correlation_id))
        self.send(c.Tune(self.frame_max, self.heartbeat))

    def _open(self, command: c.Open) -> None:
        user = self.user
        assert user is not None
        name = command.virtual_host
        if name not in self.view.vhosts() or name not in user.permissions:
            log.warning("%s: replica stream connection to vhost '%s' refused", self.name, name)
            code = int(ResponseCode.VIRTUAL_HOST_ACCESS_FAILURE)
            self.send(c.OpenResponse(command.correlation_id, code))
            self.close_transport()
            return
        self.vhost = name
        self.state = _OPEN
        host, port = self.advertised
        props = {"advertised_host": host, "advertised_port": str(port)}
        self.send(c.OpenResponse(command.correlation_id, OK, props))
        self.reader.frame_max = self.frame_max

    def _close(self, code: int, reason: str) -> None:
        if self.state >= _CLOSE_SENT:
            return
        self.state = _CLOSE_SENT
        self._release()
        self.send(c.Close(1, int(code), reason))

    def _release(self) -> None:
        for sub in self.subscriptions.values():
            if sub.cursor is not None:
                sub.cursor.close()
        self.subscriptions.clear()
        if self.forwarding is not None:
            self.forwarding.close()

    def _open_command(self, command: c.Command) -> None:
        if isinstance(command, c.Subscribe):
            self._subscribe(command)
        elif isinstance(command, c.Credit):
            self._credit(command)
        elif isinstance(command, c.Unsubscribe):
            self._unsubscribe(command)
        elif isinstance(command, c.Metadata):
            self._metadata_answer(command)
        elif isinstance(command, c.QueryOffset):
            self._query_offset(command)
        elif isinstance(command, c.QueryPublisherSequence):
            self._query_publisher_sequence(command)
        elif isinstance(command, c.StreamStats):
            self._stream_stats(command)
        elif isinstance(command, c.ResolveOffsetSpec):
            self._resolve_offset_spec(command)
        elif isinstance(command, c.ExchangeCommandVersions):
            self.v2 = any(v.key == Key.DELIVER and v.max_version >= 2 for v in command.versions)
            versions = [CommandVersion(int(k), lo, hi) for k, lo, hi in SERVER_COMMAND_VERSIONS]
            self.send(c.ExchangeCommandVersionsResponse(command.correlation_id, OK, versions))
        elif isinstance(command, c.ConsumerUpdateResponse):
            if self.forwarding is not None:
                self.forwarding.answered(command)
        elif isinstance(command, c.StoreOffset) and self.forwarding is not None:
            self.forwarding.store_offset(command)
        else:
            self._refuse(command)

    # -- what changes state: the leader's -------------------------------------------------
    def _refuse(self, command: c.Command) -> None:
        what = type(command).__name__
        leader = self._metadata()[0]
        where = f"{leader[0]}:{leader[1]}" if leader else "unknown"
        log.warning(
            "%s: %s refused: a cluster follower serves stream reads only; the leader is %s",
            self.name,
            what,
            where,
        )
        corr = getattr(command, "correlation_id", 0)
        if isinstance(command, c.DeclarePublisher):
            self.send(c.DeclarePublisherResponse(corr, int(ResponseCode.STREAM_NOT_AVAILABLE)))
        elif isinstance(command, Publish):
            errors = [
                PublishingError(pid, ResponseCode.PUBLISHER_DOES_NOT_EXIST)
                for pid in command.scan().publishing_ids
            ]
            if errors:
                self.send(c.PublishError(command.publisher_id, errors))
        elif isinstance(command, c.DeletePublisher):
            code = int(ResponseCode.PUBLISHER_DOES_NOT_EXIST)
            self.send(c.DeletePublisherResponse(corr, code))
        elif isinstance(command, c.Create):
            self.send(c.CreateResponse(corr, int(ResponseCode.ACCESS_REFUSED)))
        elif isinstance(command, c.Delete):
            self.send(c.DeleteResponse(corr, int(ResponseCode.ACCESS_REFUSED)))
        elif isinstance(command, c.CreateSuperStream):
            self.send(c.CreateSuperStreamResponse(corr, int(ResponseCode.ACCESS_REFUSED)))
        elif isinstance(command, c.DeleteSuperStream):
            self.send(c.DeleteSuperStreamResponse(corr, int(ResponseCode.ACCESS_REFUSED)))
        elif isinstance(command, c.Route):
            self.send(c.RouteResponse(corr, int(ResponseCode.STREAM_NOT_AVAILABLE), []))
        elif isinstance(command, c.Partitions):
            self.send(c.PartitionsResponse(corr, int(ResponseCode.STREAM_NOT_AVAILABLE), []))
        elif not isinstance(command, c.StoreOffset):  # StoreOffset has no answer
            raise StreamProtocolError(f"unexpected {what}")

    # -- reads ----------------------------------------------------------------------------
    def _allowed(self, name: str) -> bool:
        assert self.user is not None
        try:
            UserStore.check(self.user, self.vhost, READ, "queue", name)
        except AccessRefused:
            return False
        return True

    def _exists(self, name: str) -> bool:
        record = self.view.queue(self.vhost, name)
        return record is not None and record["arguments"].get("x-queue-type") == "stream"

    def _store(self, name: str) -> ReplicaStreamStore | None:
        store = self.view.stream(self.vhost, name)
        if store is not None:
            store.refresh()
        return store

    def _metadata_answer(self, command: c.Metadata) -> None:
        """The leader (reference 0) and this service with the other replicas."""
        leader, replicas = self._metadata()
        brokers = [Broker(0, *leader)] if leader else []
        refs = tuple(range(len(brokers), len(brokers) + len(replicas)))
        brokers += [Broker(ref, *addr) for ref, addr in zip(refs, replicas, strict=True)]
        seen: dict[str, StreamMetadata] = {}
        for name in command.streams:
            if name in seen:
                continue
            if not self._exists(name):
                seen[name] = StreamMetadata(name, ResponseCode.STREAM_DOES_NOT_EXIST, NO_LEADER)
            elif leader is None:
                seen[name] = StreamMetadata(name, OK, NO_LEADER, refs)
            else:
                seen[name] = StreamMetadata(name, OK, 0, refs)
        if not any(m.code == OK for m in seen.values()):
            brokers = []
        self.send(c.MetadataResponse(command.correlation_id, brokers, list(seen.values())))

    def _checked(self, name: str) -> int:
        """OK, or the code a read of ``name`` is refused with."""
        if not self._allowed(name):
            return int(ResponseCode.ACCESS_REFUSED)
        if not self._exists(name):
            return int(ResponseCode.STREAM_DOES_NOT_EXIST)
        return OK

    def _query_offset(self, command: c.QueryOffset) -> None:
        corr, ref = command.correlation_id, command.reference
        code = self._checked(command.stream)
        if code != OK:
            self.send(c.QueryOffsetResponse(corr, code, 0))
            return
        store = self._store(command.stream)
        tracked = None
        if store is not None and ref and not ref.startswith(SEQUENCE_PREFIX):
            tracked = store.tracked(ref)
        if not tracked:
            self.send(c.QueryOffsetResponse(corr, int(ResponseCode.NO_OFFSET), 0))
            return
        self.send(c.QueryOffsetResponse(corr, OK, tracked - 1))

    def _query_publisher_sequence(self, command: c.QueryPublisherSequence) -> None:
        corr = command.correlation_id
        code = self._checked(command.stream)
        if code != OK:
            self.send(c.QueryPublisherSequenceResponse(corr, code, 0))
            return
        store = self._store(command.stream)
        stored = store.tracked(sequence_name(command.reference)) if store is not None else None
        sequence = stored or 0
        self.send(c.QueryPublisherSequenceResponse(corr, OK, sequence))

    def _stream_stats(self, command: c.StreamStats) -> None:
        corr = command.correlation_id
        code = self._checked(command.stream)
        if code != OK:
            self.send(c.StreamStatsResponse(corr, code, {}))
            return
        store = self._store(command.stream)
        empty = store is None or store.next_offset <= store.first_offset
        stats = {
            "first_chunk_id": -1 if empty or store is None else store.first_offset,
            "committed_chunk_id": -1 if empty or store is None else store.next_offset - 1,
        }
        self.send(c.StreamStatsResponse(corr, OK, stats))

    def _resolve_offset_spec(self, command: c.ResolveOffsetSpec) -> None:
        corr = command.correlation_id
        code = self._checked(command.stream)
        if code != OK:
            self.send(c.ResolveOffsetSpecResponse(corr, code))
            return
        spec = start_spec(command.offset)
        store = self._store(command.stream)
        if spec is None:
            self.send(c.ResolveOffsetSpecResponse(corr, int(ResponseCode.NO_OFFSET)))
            return
        offset = spec.resolve(store) if store is not None else spec.value
        self.send(c.ResolveOffsetSpecResponse(corr, OK, offset=offset))

    # -- subscriptions --------------------------------------------------------------------
    def _subscribe(self, command: c.Subscribe) -> None:
        corr, sid, name = command.correlation_id, command.subscription_id, command.stream
        forwarding = self.forwarding
        if sid in self.subscriptions or (forwarding is not None and forwarding.pending(sid)):
            code = int(ResponseCode.SUBSCRIPTION_ID_ALREADY_EXISTS)
            self.send(c.SubscribeResponse(corr, code))
            return
        if len(self.subscriptions) >= MAX_SUBSCRIPTIONS:
            self.send(c.SubscribeResponse(corr, int(ResponseCode.PRECONDITION_FAILED)))
            return
        code = self._checked(name)
        if code != OK:
            self.send(c.SubscribeResponse(corr, code))
            return
        spec = start_spec(command.offset)
        props = dict(command.properties)
        sac = props.get("single-active-consumer", "false").lower() == "true"
        if sac and forwarding is None:
            log.warning(
                "%s: subscription %d: single active consumers subscribe on the leader",
                self.name,
                sid,
            )
            spec = None
        if spec is None:
            self.send(c.SubscribeResponse(corr, int(ResponseCode.PRECONDITION_FAILED)))
            return
        values = [v for k, v in sorted(props.items()) if k.startswith("filter.")]
        store = self._store(name)
        start = spec.resolve(store) if store is not None else spec.value
        sub = ReplicaSubscription(
            sid,
            name,
            command.offset,
            start,
            min(command.credit, MAX_CREDIT),
            props,
            frozenset(values) if values else None,
            props.get("match-unfiltered", "false").lower() == "true",
        )
        if sac and forwarding is not None:
            sub.sac_active = False  # reads once the leader's group activates it
            forwarding.subscribe(command, sub)
            return
        if store is not None:
            sub.cursor = store.cursor(max(start, store.first_offset))
        self.subscriptions[sid] = sub
        self.send(c.SubscribeResponse(corr))

    def start_at(self, sub: ReplicaSubscription, spec: StartSpec) -> None:
        """A single active consumer activated: it reads from ``spec`` on."""
        store = self._store(sub.stream)
        sub.start = spec.resolve(store) if store is not None else spec.value
        if sub.cursor is not None:
            sub.cursor.close()
        sub.cursor = None if store is None else store.cursor(max(sub.start, store.first_offset))
        sub.held = None
        sub.sac_active = True

    def stop(self, sub: ReplicaSubscription) -> None:
        """A single active consumer deactivated: it reads no further."""
        sub.sac_active = False
        if sub.cursor is not None:
            sub.cursor.close()
            sub.cursor = None
        sub.held = None

    def drop(self, subs: list[ReplicaSubscription]) -> None:
        """Forwarded subscriptions whose leader side ended go, the client told
        as for a stream gone (MetadataUpdate)."""
        for sub in subs:
            self.stop(sub)
            self.subscriptions.pop(sub.subscription_id, None)
        for stream in sorted({sub.stream for sub in subs}):
            self.send(c.MetadataUpdate(int(ResponseCode.STREAM_NOT_AVAILABLE), stream))

    def _credit(self, command: c.Credit) -> None:
        sub = self.subscriptions.get(command.subscription_id)
        if sub is None:
            code = int(ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST)
            self.send(c.CreditResponse(code, command.subscription_id))
            return
        sub.credit = min(sub.credit + command.credit, MAX_CREDIT)

    def _unsubscribe(self, command: c.Unsubscribe) -> None:
        sub = self.subscriptions.pop(command.subscription_id, None)
        if sub is None:
            if self.forwarding is not None and self.forwarding.unsubscribe_pending(command):
                return  # answered after its Subscribe (replica_forward.py)
            code = int(ResponseCode.SUBSCRIPTION_ID_DOES_NOT_EXIST)
            self.send(c.UnsubscribeResponse(command.correlation_id, code))
            return
        if sub.cursor is not None:
            sub.cursor.close()
        if sub.sac_active is not None and self.forwarding is not None:
            self.forwarding.unsubscribed(sub)
        self.send(c.UnsubscribeResponse(command.correlation_id))

    # -- delivering -----------------------------------------------------------------------
    def pump(self) -> bool:
        """Deliver what the subscriptions have credit for; True when one could
        take more and has more to read (call again on the next loop turn)."""
        if self.closed or self.state != _OPEN:
            return False
        more = False
        for sub in list(self.subscriptions.values()):
            if sub.sac_active is not False and self._deliver(sub):
                more = True
        return more

    def _deliver(self, sub: ReplicaSubscription) -> bool:
        cursor = sub.cursor
        store = self.view.stream(self.vhost, sub.stream)
        if store is None:
            return False
        if cursor is None:
            store.refresh()
            cursor = sub.cursor = store.cursor(max(sub.start, store.first_offset))
        committed = max(store.next_offset - 1, 0) if self.v2 else None
        for _ in range(_CHUNKS_PER_PUMP):
            if sub.credit <= 0:
                return False
            if sub.held is None:
                whole = cursor.chunk()  # a chunk record: sent as stored, as the leader does
                if whole is not None and sub.filters is not None and not sub.match_unfiltered:
                    continue  # it holds no filter value: passed over (the leader's rule)
                if whole is not None:
                    first, count, m, start, end = whole
                    send_chunk(self.output, sub, m[start:end], first, count, committed)
                    continue
            records = self._chunk_records(sub, cursor)
            if not records:
                return False
            first, timestamp, _ = records[0]
            chunk = build_chunk(
                [simple_entry(r[2]) for r in records], first_offset=first, timestamp=timestamp
            ).delivered()
            send_chunk(self.output, sub, chunk, first, len(records), committed)
        return True

    def _chunk_records(
        self, sub: ReplicaSubscription, cursor: StreamCursor
    ) -> list[tuple[int, int, bytes]]:
        """The next chunk's records: consecutive offsets the filter wants, at
        most CHUNK_RECORDS; a record after a gap waits for the next chunk."""
        records: list[tuple[int, int, bytes]] = []
        if sub.held is not None:
            records.append(sub.held)
            sub.held = None
        while len(records) < CHUNK_RECORDS:
            item = cursor.next()
            if item is None:
                break
            offset, msg = item
            if sub.filters is not None and not _wanted(sub, msg.headers):
                if records:
                    break  # a gap: the chunk ends here
                continue
            record = (offset, msg.timestamp or 0, self.messages.to_wire(msg))
            if records and offset != records[-1][0] + 1:
                sub.held = record
                break
            records.append(record)
        return records


def _wanted(sub: ReplicaSubscription, headers: dict[str, Any] | None) -> bool:
    """The leader's filter rule (core/stream.py's filter_wants)."""
    assert sub.filters is not None
    return filter_wants(sub.filters, sub.match_unfiltered, headers)


def _properties() -> dict[str, str]:
    return {
        "product": "Warren",
        "version": __version__,
        "platform": f"Python {platform.python_version()}",
        "information": "a cluster follower's read-only stream service",
    }
