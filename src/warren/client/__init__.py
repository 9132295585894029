"""Warren's own AMQP 0-9-1 client: what ``warren perf`` and the Spark data source share.

- protocol.py: the connection as a sans-IO state machine (bytes in, events
  and bytes out): handshake, heartbeats, closes.
- blocking.py: :class:`Client`, a blocking socket transport around it, with the
  setup calls (declare, bind, qos, consume, confirm.select).
- confirms.py: publisher confirms counted in bulk for the hot publishers.
- uri.py: AMQP URIs as RabbitMQ reads them (TLS and auth parameters).

It shares the frame codec with the server (warren.amqp.spec and frames) and
nothing else of the broker: tests/core/test_layering.py checks that it imports no
server-side connection code. Shovels and federation use aiormq instead (see
docs/architecture.md).
"""

from warren.client.blocking import Client
from warren.client.protocol import AMQPError, ClientProtocol
from warren.client.uri import TLS, URI

__all__ = ["TLS", "URI", "AMQPError", "Client", "ClientProtocol"]
