"""Webhooks: broker events POSTed as JSON to configured URLs (docs/webhooks.md).

The core announces its events (core/events.py: queue.created,
connection.closed, alarm.set ..., RabbitMQ's event exchange's names);
:class:`Webhooks` observes them and delivers each to the targets of the
``[main] webhooks_file`` whose filters want it, signed, in order, with retries
and a bounded buffer that never blocks the broker.
"""

from warren.webhooks.sender import SIGNATURE_HEADER, Webhooks, sign
from warren.webhooks.targets import WebhookTarget, load_targets, parse_targets

__all__ = ["SIGNATURE_HEADER", "WebhookTarget", "Webhooks", "load_targets", "parse_targets", "sign"]
