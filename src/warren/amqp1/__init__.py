"""AMQP 1.0 (OASIS), the third protocol on the client session (issue 30).

types.py: the values; the codec, frames, performatives and message sections
come next, then the connection state machine on core/session.py's
ClientSession, sans-IO, as amqp/ and mqtt/ are.
"""
