"""MQTT topic names and filters, shared subscriptions, and the AMQP routing-key mapping.

The MQTT topic space is every protocol's that publishes on it (MQTT, CoAP's
``/ps``), so it lives in the core; mqtt/topics.py re-exports it. The mapping
is RabbitMQ's (rabbit_mqtt_util to_amqp/to_mqtt), also used by LavinMQ:
MQTT ``/`` <-> AMQP ``.``, MQTT ``+`` <-> AMQP ``*``, ``#`` unchanged.
"""

from __future__ import annotations

__all__ = [
    "MAX_TOPIC_BYTES",
    "amqp_to_mqtt",
    "is_valid_topic_filter",
    "is_valid_topic_name",
    "mqtt_to_amqp",
    "parse_shared",
    "too_long",
]

_MAX_BYTES = 0xFFFF
#: Longest topic name a client may publish to (or name its will's topic): it
#: becomes the message's AMQP routing key, a shortstr.
MAX_TOPIC_BYTES = 255


def _encodable(text: str) -> bool:
    if not text or "\x00" in text:
        return False
    try:
        return len(text.encode("utf-8")) <= _MAX_BYTES
    except UnicodeEncodeError:
        return False


def is_valid_topic_name(name: str) -> bool:
    """A PUBLISH topic: at least one character, no wildcard, no U+0000."""
    return _encodable(name) and "+" not in name and "#" not in name


def is_valid_topic_filter(topic_filter: str) -> bool:
    """A SUBSCRIBE filter: ``+`` fills a whole level, ``#`` only as the whole last level.

    A ``$share/{group}/{filter}`` filter is valid when its group and inner filter are.
    """
    if not _encodable(topic_filter):
        return False
    if topic_filter.startswith("$share/"):
        try:
            parse_shared(topic_filter)
        except ValueError:
            return False
        return True
    return _filter_levels_ok(topic_filter)


def _filter_levels_ok(topic_filter: str) -> bool:
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            return False
        if "+" in level and level != "+":
            return False
    return True


def parse_shared(topic_filter: str) -> tuple[str | None, str]:
    """``$share/group/a/b`` -> ``("group", "a/b")``; a plain filter -> ``(None, filter)``.

    Raises ValueError for a malformed shared subscription (empty group, a group
    with ``+``/``#``, no filter, or an invalid inner filter).
    """
    if not topic_filter.startswith("$share/"):
        return None, topic_filter
    rest = topic_filter[len("$share/") :]
    group, sep, inner = rest.partition("/")
    if not group or "+" in group or "#" in group:
        raise ValueError(f"invalid share name in {topic_filter!r}")
    if not sep or not inner or not _filter_levels_ok(inner):
        raise ValueError(f"invalid topic filter in {topic_filter!r}")
    return group, inner


def mqtt_to_amqp(topic: str) -> str:
    """MQTT topic name or filter -> AMQP topic routing/binding key."""
    return topic.replace("/", ".").replace("+", "*")


def amqp_to_mqtt(routing_key: str) -> str:
    """AMQP routing key -> MQTT topic (for delivery to MQTT subscribers)."""
    return routing_key.replace("*", "+").replace(".", "/")


def too_long(topic: str) -> bool:
    """Over MAX_TOPIC_BYTES in UTF-8 (at most 4 bytes a character: short ones pass)."""
    return len(topic) > MAX_TOPIC_BYTES // 4 and (
        len(topic.encode("utf-8", "surrogateescape")) > MAX_TOPIC_BYTES
    )
