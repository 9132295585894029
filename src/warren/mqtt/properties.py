"""MQTT 5 properties (spec section 2.2.2.2) and reason codes (section 2.4).

Properties are carried as a plain ``dict`` from property identifier to value,
in wire order. The two repeatable identifiers hold lists: ``USER_PROPERTY``
a list of ``(name, value)`` string pairs (order kept, names may repeat) and
``SUBSCRIPTION_IDENTIFIER`` a list of ints (it repeats only in PUBLISH).
"""

from __future__ import annotations

from typing import Final

__all__ = ["PROPERTY_NAMES", "PROPERTY_TYPES", "Properties", "PropertyValue"]

PropertyValue = int | str | bytes | list[tuple[str, str]] | list[int]
Properties = dict[int, PropertyValue]

# Property value types.
BYTE: Final = 1
TWO_BYTE_INT: Final = 2
FOUR_BYTE_INT: Final = 4
VARIABLE_BYTE_INT: Final = 5
UTF8_STRING: Final = 6
BINARY_DATA: Final = 7
UTF8_PAIR: Final = 8

# Property identifiers.
PAYLOAD_FORMAT_INDICATOR: Final = 0x01
MESSAGE_EXPIRY_INTERVAL: Final = 0x02
CONTENT_TYPE: Final = 0x03
RESPONSE_TOPIC: Final = 0x08
CORRELATION_DATA: Final = 0x09
SUBSCRIPTION_IDENTIFIER: Final = 0x0B
SESSION_EXPIRY_INTERVAL: Final = 0x11
ASSIGNED_CLIENT_IDENTIFIER: Final = 0x12
SERVER_KEEP_ALIVE: Final = 0x13
AUTHENTICATION_METHOD: Final = 0x15
AUTHENTICATION_DATA: Final = 0x16
REQUEST_PROBLEM_INFORMATION: Final = 0x17
WILL_DELAY_INTERVAL: Final = 0x18
REQUEST_RESPONSE_INFORMATION: Final = 0x19
RESPONSE_INFORMATION: Final = 0x1A
SERVER_REFERENCE: Final = 0x1C
REASON_STRING: Final = 0x1F
RECEIVE_MAXIMUM: Final = 0x21
TOPIC_ALIAS_MAXIMUM: Final = 0x22
TOPIC_ALIAS: Final = 0x23
MAXIMUM_QOS: Final = 0x24
RETAIN_AVAILABLE: Final = 0x25
USER_PROPERTY: Final = 0x26
MAXIMUM_PACKET_SIZE: Final = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE: Final = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE: Final = 0x29
SHARED_SUBSCRIPTION_AVAILABLE: Final = 0x2A

# Packet types (fixed header, upper nibble); WILL is the CONNECT will's property set.
WILL: Final = 0
CONNECT: Final = 1
CONNACK: Final = 2
PUBLISH: Final = 3
PUBACK: Final = 4
PUBREC: Final = 5
PUBREL: Final = 6
PUBCOMP: Final = 7
SUBSCRIBE: Final = 8
SUBACK: Final = 9
UNSUBSCRIBE: Final = 10
UNSUBACK: Final = 11
PINGREQ: Final = 12
PINGRESP: Final = 13
DISCONNECT: Final = 14
AUTH: Final = 15

_ACKS = frozenset({PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, DISCONNECT, AUTH, CONNACK})
_ALL = frozenset(range(16)) - {PINGREQ, PINGRESP}
_MESSAGE = frozenset({PUBLISH, WILL})

#: identifier -> (name, value type, packet types that may carry it)
PROPERTY_TABLE: Final[dict[int, tuple[str, int, frozenset[int]]]] = {
    PAYLOAD_FORMAT_INDICATOR: ("Payload Format Indicator", BYTE, _MESSAGE),
    MESSAGE_EXPIRY_INTERVAL: ("Message Expiry Interval", FOUR_BYTE_INT, _MESSAGE),
    CONTENT_TYPE: ("Content Type", UTF8_STRING, _MESSAGE),
    RESPONSE_TOPIC: ("Response Topic", UTF8_STRING, _MESSAGE),
    CORRELATION_DATA: ("Correlation Data", BINARY_DATA, _MESSAGE),
    SUBSCRIPTION_IDENTIFIER: (
        "Subscription Identifier",
        VARIABLE_BYTE_INT,
        frozenset({PUBLISH, SUBSCRIBE}),
    ),
    SESSION_EXPIRY_INTERVAL: (
        "Session Expiry Interval",
        FOUR_BYTE_INT,
        frozenset({CONNECT, CONNACK, DISCONNECT}),
    ),
    ASSIGNED_CLIENT_IDENTIFIER: ("Assigned Client Identifier", UTF8_STRING, frozenset({CONNACK})),
    SERVER_KEEP_ALIVE: ("Server Keep Alive", TWO_BYTE_INT, frozenset({CONNACK})),
    AUTHENTICATION_METHOD: (
        "Authentication Method",
        UTF8_STRING,
        frozenset({CONNECT, CONNACK, AUTH}),
    ),
    AUTHENTICATION_DATA: ("Authentication Data", BINARY_DATA, frozenset({CONNECT, CONNACK, AUTH})),
    REQUEST_PROBLEM_INFORMATION: ("Request Problem Information", BYTE, frozenset({CONNECT})),
    WILL_DELAY_INTERVAL: ("Will Delay Interval", FOUR_BYTE_INT, frozenset({WILL})),
    REQUEST_RESPONSE_INFORMATION: ("Request Response Information", BYTE, frozenset({CONNECT})),
    RESPONSE_INFORMATION: ("Response Information", UTF8_STRING, frozenset({CONNACK})),
    SERVER_REFERENCE: ("Server Reference", UTF8_STRING, frozenset({CONNACK, DISCONNECT})),
    REASON_STRING: ("Reason String", UTF8_STRING, _ACKS),
    RECEIVE_MAXIMUM: ("Receive Maximum", TWO_BYTE_INT, frozenset({CONNECT, CONNACK})),
    TOPIC_ALIAS_MAXIMUM: ("Topic Alias Maximum", TWO_BYTE_INT, frozenset({CONNECT, CONNACK})),
    TOPIC_ALIAS: ("Topic Alias", TWO_BYTE_INT, frozenset({PUBLISH})),
    MAXIMUM_QOS: ("Maximum QoS", BYTE, frozenset({CONNACK})),
    RETAIN_AVAILABLE: ("Retain Available", BYTE, frozenset({CONNACK})),
    USER_PROPERTY: ("User Property", UTF8_PAIR, _ALL),
    MAXIMUM_PACKET_SIZE: ("Maximum Packet Size", FOUR_BYTE_INT, frozenset({CONNECT, CONNACK})),
    WILDCARD_SUBSCRIPTION_AVAILABLE: (
        "Wildcard Subscription Available",
        BYTE,
        frozenset({CONNACK}),
    ),
    SUBSCRIPTION_IDENTIFIER_AVAILABLE: (
        "Subscription Identifier Available",
        BYTE,
        frozenset({CONNACK}),
    ),
    SHARED_SUBSCRIPTION_AVAILABLE: ("Shared Subscription Available", BYTE, frozenset({CONNACK})),
}
PROPERTY_NAMES: Final = {pid: entry[0] for pid, entry in PROPERTY_TABLE.items()}
PROPERTY_TYPES: Final = {pid: entry[1] for pid, entry in PROPERTY_TABLE.items()}
#: Properties that are 0 or 1 only (a Protocol Error otherwise).
BOOLEAN_PROPERTIES: Final = frozenset(pid for pid, e in PROPERTY_TABLE.items() if e[1] == BYTE)
#: Properties for which 0 is a Protocol Error.
NON_ZERO_PROPERTIES: Final = frozenset(
    {RECEIVE_MAXIMUM, MAXIMUM_PACKET_SIZE, TOPIC_ALIAS, SUBSCRIPTION_IDENTIFIER}
)

# Reason codes (MQTT 5, section 2.4).
SUCCESS: Final = 0x00
NORMAL_DISCONNECTION: Final = 0x00
GRANTED_QOS_0: Final = 0x00
GRANTED_QOS_1: Final = 0x01
GRANTED_QOS_2: Final = 0x02
DISCONNECT_WITH_WILL_MESSAGE: Final = 0x04
NO_MATCHING_SUBSCRIBERS: Final = 0x10
NO_SUBSCRIPTION_EXISTED: Final = 0x11
CONTINUE_AUTHENTICATION: Final = 0x18
RE_AUTHENTICATE: Final = 0x19
UNSPECIFIED_ERROR: Final = 0x80
MALFORMED_PACKET: Final = 0x81
PROTOCOL_ERROR: Final = 0x82
IMPLEMENTATION_SPECIFIC_ERROR: Final = 0x83
UNSUPPORTED_PROTOCOL_VERSION: Final = 0x84
CLIENT_IDENTIFIER_NOT_VALID: Final = 0x85
BAD_USER_NAME_OR_PASSWORD: Final = 0x86
NOT_AUTHORIZED: Final = 0x87
SERVER_UNAVAILABLE: Final = 0x88
SERVER_BUSY: Final = 0x89
BANNED: Final = 0x8A
SERVER_SHUTTING_DOWN: Final = 0x8B
BAD_AUTHENTICATION_METHOD: Final = 0x8C
KEEP_ALIVE_TIMEOUT: Final = 0x8D
SESSION_TAKEN_OVER: Final = 0x8E
TOPIC_FILTER_INVALID: Final = 0x8F
TOPIC_NAME_INVALID: Final = 0x90
PACKET_IDENTIFIER_IN_USE: Final = 0x91
PACKET_IDENTIFIER_NOT_FOUND: Final = 0x92
RECEIVE_MAXIMUM_EXCEEDED: Final = 0x93
TOPIC_ALIAS_INVALID: Final = 0x94
PACKET_TOO_LARGE: Final = 0x95
MESSAGE_RATE_TOO_HIGH: Final = 0x96
QUOTA_EXCEEDED: Final = 0x97
ADMINISTRATIVE_ACTION: Final = 0x98
PAYLOAD_FORMAT_INVALID: Final = 0x99
RETAIN_NOT_SUPPORTED: Final = 0x9A
QOS_NOT_SUPPORTED: Final = 0x9B
USE_ANOTHER_SERVER: Final = 0x9C
SERVER_MOVED: Final = 0x9D
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: Final = 0x9E
CONNECTION_RATE_EXCEEDED: Final = 0x9F
MAXIMUM_CONNECT_TIME: Final = 0xA0
SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED: Final = 0xA1
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: Final = 0xA2

# MQTT 3.1.1 CONNACK return codes (section 3.2.2.3).
V311_ACCEPTED: Final = 0x00
V311_UNACCEPTABLE_PROTOCOL_VERSION: Final = 0x01
V311_IDENTIFIER_REJECTED: Final = 0x02
V311_SERVER_UNAVAILABLE: Final = 0x03
V311_BAD_USER_NAME_OR_PASSWORD: Final = 0x04
V311_NOT_AUTHORIZED: Final = 0x05
V311_SUBACK_FAILURE: Final = 0x80
