"""AMQP 1.0 (OASIS), the third protocol on the client session (issue 30).

The values and codec (types.py, codec.py), frames and performatives, message
sections and their mapping to the core's format, addresses; the connection,
sessions and links (connection.py, session.py, incoming.py, outgoing.py) on
core/session.py's ClientSession, sans-IO, as amqp/ and mqtt/ are; server.py
the asyncio side, handed each client by the AMQP port (docs/amqp1.md).
"""
