"""The assembled broker: the core with the standard listeners.

The one module that knows every protocol package. ``warren.Broker`` is the
class below; broker.Broker (no listeners of its own) stays protocol-free.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from warren.amqp.replica_server import ReplicaReadServer
from warren.amqp.server import AMQPListener
from warren.amqp1.frames import AMQP_HEADER, SASL_HEADER
from warren.amqp1.management_node import management_handler
from warren.amqp1.mapping import from_core, to_core, unmapped_annotations
from warren.amqp1.message import decode_message, encode_message
from warren.amqp1.server import AMQP1Listener
from warren.broker import Broker as CoreBroker
from warren.coap.server import CoAPListener, CoAPSListener
from warren.config import Config
from warren.core.codec_errors import DecodeError
from warren.core.message import Message
from warren.federation.component import Federation
from warren.http.prometheus import PrometheusListener
from warren.http.server import HTTPListener
from warren.mqtt.retained import RetainedMessage
from warren.mqtt.server import MQTTListener
from warren.node import HeaderHandoffs, Listener, WebSocketEndpoint, node_name
from warren.shovel.component import ShovelComponent
from warren.store.stream_records import SHARED_DECODER
from warren.stream_protocol.replica_server import ReplicaStreamServer
from warren.stream_protocol.server import StreamListener
from warren.webhooks import Webhooks, load_targets
from warren.webhooks.saved import SAVED_FILE, SavedTargets

__all__ = [
    "AMQP_HANDOFFS",
    "AMQP1StreamMessages",
    "Broker",
    "ReplicaReadServer",
    "default_listeners",
    "replica_stream_server",
]


#: Other protocols on the AMQP port (and over WebSocket at ``/ws``), by protocol
#: header (warren.node.HeaderHandoffs), beside AMQP 1.0's ``AMQP\x00\x01\x00\x00``
#: and ``AMQP\x03\x01\x00\x00``, which default_listeners registers with its AMQP
#: 1.0 listener (RabbitMQ 4 requires SASL: its answer to the first is the SASL
#: header, then the close).
AMQP_HANDOFFS: HeaderHandoffs = {}


#: Core properties with nothing set (a stream record that is no AMQP 1.0 message).
_NO_PROPERTIES = b"\x00\x00"
#: Annotations from_core makes of the headers a stream stores with each record,
#: which a stream consumer does not get (its chunk says offset and time).
_STREAM_HEADERS = ("x-stream-offset", "x-stream-timestamp")


class AMQP1StreamMessages:
    """The stream protocol's StreamMessageCodec (stream_protocol/messages.py):
    AMQP 1.0's mapping, as amqp1's incoming links use it, but always keeping
    the bare message (a stream consumer gets back the bytes published)."""

    def to_core(self, data: bytes) -> tuple[bytes, bytes, bytes | None]:
        """A record that is no AMQP 1.0 message (clients may publish any
        bytes; RabbitMQ stores them as they are) is a body without
        properties, kept as native for stream consumers; RabbitMQ's AMQP
        readers fail on such a record, Warren's 0-9-1 ones get the bytes.
        Annotations the core does not carry (no ``x-`` prefix) are kept in
        native, before the bare message (mapping.unmapped_annotations)."""
        try:
            msg = decode_message(data)
            properties, body = to_core(msg)
        except (DecodeError, ValueError):
            return _NO_PROPERTIES, data, data
        if msg.message_annotations is not None:
            unmapped = unmapped_annotations(msg)
            if unmapped:
                return properties, body, unmapped + data[msg.bare_at :]
        return properties, body, data[msg.bare_at :]

    def to_wire(self, msg: Message) -> bytes:
        """RabbitMQ 4's AMQP 1.0 form of a 0-9-1 message, or the native bare
        message with the header and annotations the core keeps, without the
        stream's own headers (and the filter value, which Publish v2 carries
        beside a record, not in it); a header with only defaults is left out,
        so a record published without one comes back as it was."""
        amqp = from_core(msg.properties, msg.body, msg.native)
        annotations = amqp.message_annotations
        if annotations is not None:
            content = annotations.content
            for key in _STREAM_HEADERS:
                content.pop(key, None)
            if msg.native is not None:
                content.pop("x-stream-filter-value", None)
            if not content:
                amqp.message_annotations = None
        header = amqp.header
        if (
            header is not None
            and not header.durable
            and header.priority is None
            and header.ttl is None
        ):
            amqp.header = None
        return encode_message(amqp)


# A stream's chunk records (the stream protocol's Publishes stored whole) read
# by AMQP consumers, on a broker or a follower's replica: AMQP 1.0's mapping.
SHARED_DECODER.decode = AMQP1StreamMessages().to_core


def replica_stream_server(
    config: Config,
    root: Path,
    leader: Callable[[], str],
    host: str,
    link: tuple[str, ssl.SSLContext | None] | None = None,
) -> ReplicaStreamServer:
    """A follower's stream protocol read service, with AMQP 1.0's record codec
    (cluster/node.py's StreamProtocolReadsFactory)."""
    messages = AMQP1StreamMessages()
    return ReplicaStreamServer(config, root, leader, host, messages=messages, link=link)


def default_listeners(
    config: Config, amqp_handoffs: HeaderHandoffs | None = None
) -> list[Listener]:
    """The listeners the configuration asks for: AMQP on ``bind:amqp_port``, MQTT on
    ``mqtt_bind:mqtt_port`` (and ``mqtt_tls_port``; -1 disables either), the stream
    protocol on ``stream_bind:stream_port`` (and ``stream_tls_listen_port``) unless
    both are -1, and the HTTP
    management API on ``http_bind:http_port`` unless that port is -1, which also
    serves AMQP (``/ws/amqp``) and MQTT (``/mqtt``) over WebSocket (docs/http-api.md),
    and the Prometheus metrics on ``prometheus_bind:prometheus_port`` unless -1.
    HTTP comes last: the broker starts listeners in order, and a WebSocket client
    needs the AMQP or MQTT listener started. ``amqp_handoffs`` (by default AMQP
    1.0's listener's headers and AMQP_HANDOFFS) are the other protocols the AMQP
    port serves by their header; with
    any, the HTTP port also serves the AMQP port's protocols at ``/ws``
    (subprotocol ``amqp``, RabbitMQ 4's AMQP 1.0 over WebSocket), told apart by
    their header in the same way."""
    listeners: list[Listener] = []
    if amqp_handoffs is None:
        # AMQP 1.0 (issue 30): its listener binds nothing; it takes the clients
        # the AMQP listener hands over, so it comes first (started before them).
        amqp1 = AMQP1Listener(management=management_handler)
        listeners.append(amqp1)
        handoffs: HeaderHandoffs = {
            **AMQP_HANDOFFS,
            AMQP_HEADER: amqp1.new_protocol,
            SASL_HEADER: amqp1.new_protocol,
        }
    else:
        handoffs = amqp_handoffs
    amqp = AMQPListener(config.bind, config.amqp_port, config.amqp_tls_port, handoffs)
    mqtt = MQTTListener(config.mqtt_bind, config.mqtt_port, config.mqtt_tls_port)
    listeners += [amqp, mqtt]
    if config.coap_enabled:  # after MQTT: its retained messages are CoAP's too
        listeners.append(CoAPListener(config.coap_bind, config.coap_port, MQTTRetained(mqtt)))
    if config.coap_dtls_enabled:
        listeners.append(
            CoAPSListener(
                config.coap_bind,
                config.coap_dtls_port,
                MQTTRetained(mqtt),
                config.coap_dtls_psk_file,
            )
        )
    stream_tls_port = config.stream_tls_listen_port
    if config.stream_port >= 0 or stream_tls_port >= 0:
        listeners.append(
            StreamListener(
                config.stream_bind,
                config.stream_port,
                stream_tls_port,
                AMQP1StreamMessages(),
            )
        )
    if config.http_port >= 0:
        websockets = [
            WebSocketEndpoint("/ws/amqp", ("amqp", "amqpws"), amqp.new_protocol),
            WebSocketEndpoint("/mqtt", ("mqtt", "mqttv3.1"), mqtt.new_protocol),
        ]
        if handoffs:
            websockets.append(WebSocketEndpoint("/ws", ("amqp",), amqp.new_protocol))
        listeners.append(
            HTTPListener(config.http_bind, config.http_port, websockets, config.http_tls_port)
        )
    if config.prometheus_port >= 0:
        listeners.append(
            PrometheusListener(
                config.prometheus_bind, config.prometheus_port, config.prometheus_tls_port
            )
        )
    return listeners


class MQTTRetained:
    """MQTT's retained messages as CoAP reads and writes them (coap/pubsub.py's
    RetainedTopics): the composition root joins the two protocols."""

    def __init__(self, mqtt: MQTTListener) -> None:
        self.mqtt = mqtt

    def latest(self, vhost: str, topic_filter: str, now_ms: int) -> tuple[bytes, bytes] | None:
        found = self.mqtt.state.retained(vhost).matching(topic_filter, now_ms)
        if not found:
            return None
        newest = max(found, key=lambda m: m.timestamp)
        return newest.payload, newest.properties

    def put(
        self, vhost: str, topic: str, payload: bytes, qos: int, properties: bytes, now_ms: int
    ) -> object | None:
        store = self.mqtt.state.retained(vhost)
        store.put(RetainedMessage.published(topic, payload, qos, properties, now_ms, None))
        return store.log


class Broker(CoreBroker):
    """An embeddable broker with its standard listeners.

    ``async with Broker(Config(amqp_port=0)) as broker:`` serves until the block
    exits; ``broker.amqp_port`` is the port actually bound. ``listeners``
    replaces the standard ones.
    """

    def __init__(
        self,
        config: Config | None = None,
        listeners: Sequence[Listener] | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(config, (), **overrides)
        self.listeners = list(
            listeners if listeners is not None else default_listeners(self.config)
        )
        shovels = ShovelComponent(
            self._local_amqp_uri,
            node_name(),
            lambda v, n: self._drop_parameter(v, "shovel", n),
            lambda: self.clock,
        )
        self.parameter_components[shovels.name] = shovels
        federation = Federation(
            self.vhosts.get, self._local_amqp_uri, lambda: self.cluster_name, lambda: self.clock
        )
        for component in (federation.upstream_component, federation.set_component):
            self.parameter_components[component.name] = component
        #: Broker events POSTed to the webhooks file's and the API's targets
        #: (docs/webhooks.md).
        file = self.config.webhooks_file
        saved = SavedTargets(
            self.layout.root / SAVED_FILE, lambda: self.layout.mirror, self.config.damaged_metadata
        )
        targets = load_targets(file) if file is not None else []
        self.webhooks = Webhooks(targets, lambda: self.clock, node_name(), saved)
        self.webhooks.attach(self.events)
        self.webhook_status = self.webhooks.status

    async def start(self) -> None:
        assert self.webhooks is not None
        self.webhooks.load_saved()  # before a definitions file's webhooks
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        if self.webhooks is not None:
            await self.webhooks.close()

    def _local_amqp_uri(self, vhost: str) -> str:
        """How a shovel reaches this broker: the AMQP port as the default user."""
        cfg = self.config
        host = "127.0.0.1" if cfg.bind in ("0.0.0.0", "::", "") else cfg.bind
        user, password = quote(cfg.default_user, safe=""), quote(cfg.default_password, safe="")
        return f"amqp://{user}:{password}@{host}:{self.amqp_port}/{quote(vhost, safe='')}"

    def _drop_parameter(self, vhost: str, component: str, name: str) -> None:
        if vhost in self.vhosts:
            self.clear_parameter(vhost, component, name)
