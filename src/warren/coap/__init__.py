"""CoAP (RFC 7252, with Observe, RFC 7641) on the MQTT topic space (docs/coap.md).

A protocol package: it imports the core and warren.node, never another
protocol's package (MQTT's retained messages reach it through warren.app).
codec.py is the wire format, endpoint.py the message layer (deduplication,
confirmable resends) on the node clock, pubsub.py the ``/ps`` resources,
observe.py the subscriptions, server.py the UDP listener.
"""
