"""A PROXY protocol speaking TCP forwarder, as HAProxy with ``send-proxy``: each
connection accepted is forwarded to the broker's port after one header, so any
client library (pika, paho, rstream, urllib) goes through it unchanged."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable

from warren.proxy_header import ProxyHeader, parse

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"

TRAILER = b"AMQP\x00\x00\x09\x01"


def read_as_listener(stream: bytes) -> tuple[ProxyHeader, bytes]:
    """Read ``stream`` as ProxyHeaderProtocol does, asking parse how much to read
    each time: the header, and what was left unread (must be the rest, whole)."""
    head = b""
    while True:
        result = parse(head)
        if isinstance(result, ProxyHeader):
            assert result.length == len(head)
            return result, stream[len(head) :]
        assert result >= 1
        chunk = stream[len(head) : len(head) + result]
        if not chunk:
            raise EOFError
        head += chunk


def v1_header(source: tuple[str, int], dest: tuple[str, int]) -> bytes:
    family = "TCP6" if ":" in source[0] else "TCP4"
    return f"PROXY {family} {source[0]} {dest[0]} {source[1]} {dest[1]}\r\n".encode()


def v2_header(
    source: tuple[str, int] | None, dest: tuple[str, int] | None = None, tlvs: bytes = b""
) -> bytes:
    """A v2 PROXY (IPv4) header, or LOCAL when ``source`` is None."""
    if source is None:
        return V2_SIGNATURE + struct.pack("!BBH", 0x20, 0x00, len(tlvs)) + tlvs
    dest = dest or ("192.0.2.1", 5672)
    body = socket.inet_aton(source[0]) + socket.inet_aton(dest[0])
    body += struct.pack("!HH", source[1], dest[1]) + tlvs
    return V2_SIGNATURE + struct.pack("!BBH", 0x21, 0x11, len(body)) + body


class Forwarder:
    """Listens on 127.0.0.1:``port``; each client is piped to 127.0.0.1:``target``
    after ``header()`` (called per connection)."""

    def __init__(self, target: int, header: Callable[[], bytes]) -> None:
        self.target = target
        self.header = header
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._sockets: list[socket.socket] = [self._server]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self._sockets += [client, upstream]
            upstream.sendall(self.header())
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> Forwarder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
