"""The assembled broker: the core with the standard listeners.

The one module that knows every protocol package. ``warren.Broker`` is the
class below; broker.Broker (no listeners of its own) stays protocol-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from warren.amqp.replica_server import ReplicaReadServer
from warren.amqp.server import AMQPListener
from warren.amqp1.frames import AMQP_HEADER, SASL_HEADER
from warren.amqp1.management_node import management_handler
from warren.amqp1.server import AMQP1Listener
from warren.broker import Broker as CoreBroker
from warren.config import Config
from warren.federation.component import Federation
from warren.http.prometheus import PrometheusListener
from warren.http.server import HTTPListener
from warren.mqtt.server import MQTTListener
from warren.node import HeaderHandoffs, Listener, WebSocketEndpoint, node_name
from warren.shovel.component import ShovelComponent
from warren.stream_protocol.server import StreamListener

__all__ = ["AMQP_HANDOFFS", "Broker", "ReplicaReadServer", "default_listeners"]


#: Other protocols on the AMQP port (and over WebSocket at ``/ws``), by protocol
#: header (warren.node.HeaderHandoffs), beside AMQP 1.0's ``AMQP\x00\x01\x00\x00``
#: and ``AMQP\x03\x01\x00\x00``, which default_listeners registers with its AMQP
#: 1.0 listener (RabbitMQ 4 requires SASL: its answer to the first is the SASL
#: header, then the close).
AMQP_HANDOFFS: HeaderHandoffs = {}


def default_listeners(
    config: Config, amqp_handoffs: HeaderHandoffs | None = None
) -> list[Listener]:
    """The listeners the configuration asks for: AMQP on ``bind:amqp_port``, MQTT on
    ``mqtt_bind:mqtt_port`` (and ``mqtt_tls_port``; -1 disables either), the stream
    protocol on ``stream_bind:stream_port`` (and ``stream_tls_port``) unless both are
    -1 (the default), and the HTTP
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
    if config.stream_port >= 0 or config.stream_tls_port >= 0:
        listeners.append(
            StreamListener(config.stream_bind, config.stream_port, config.stream_tls_port)
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

    def _local_amqp_uri(self, vhost: str) -> str:
        """How a shovel reaches this broker: the AMQP port as the default user."""
        cfg = self.config
        host = "127.0.0.1" if cfg.bind in ("0.0.0.0", "::", "") else cfg.bind
        user, password = quote(cfg.default_user, safe=""), quote(cfg.default_password, safe="")
        return f"amqp://{user}:{password}@{host}:{self.amqp_port}/{quote(vhost, safe='')}"

    def _drop_parameter(self, vhost: str, component: str, name: str) -> None:
        if vhost in self.vhosts:
            self.clear_parameter(vhost, component, name)
