"""MQTT topic names and filters: core/mqtt_topics.py's, which CoAP shares
(a protocol package imports no other, so the topic space lives in the core)."""

from __future__ import annotations

from warren.core.mqtt_topics import (
    MAX_TOPIC_BYTES,
    amqp_to_mqtt,
    is_valid_topic_filter,
    is_valid_topic_name,
    mqtt_to_amqp,
    parse_shared,
    too_long,
)

__all__ = [
    "MAX_TOPIC_BYTES",
    "amqp_to_mqtt",
    "is_valid_topic_filter",
    "is_valid_topic_name",
    "mqtt_to_amqp",
    "parse_shared",
    "too_long",
]
