"""TLS for every listener: one server context built from the ``[main] tls_*`` settings.

LavinMQ's keys: ``tls_cert`` (PEM certificate chain), ``tls_key`` (PEM private
key), ``tls_min_version`` (1.2 by default; 1.3 to refuse 1.2) and
``tls_ciphers`` (an OpenSSL cipher list for TLS 1.2; empty keeps OpenSSL's
secure defaults). The AMQP (``[amqp] tls_port``, 5671 by convention), MQTT
(``[mqtt] tls_port``, 8883) and HTTP (``[mgmt] tls_port``, 15671) listeners
each wrap their TLS socket with a context from `server_context`.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warren.config import Config

__all__ = ["TLS_VERSIONS", "TLSContexts", "server_context"]

TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def _load(ctx: ssl.SSLContext, config: Config, what: str) -> None:
    assert config.tls_cert and config.tls_key
    try:
        ctx.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise OSError(f"cannot load tls_cert/tls_key for {what}: {exc}") from None


def server_context(config: Config, what: str) -> ssl.SSLContext:
    """A context to serve with; OSError (naming ``what``, e.g. "the AMQP TLS port")
    when no certificate is configured or it cannot be loaded."""
    if not config.tls_cert or not config.tls_key:
        raise OSError(f"{what} needs tls_cert and tls_key")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = TLS_VERSIONS[config.tls_min_version]
    if config.tls_ciphers:
        try:
            ctx.set_ciphers(config.tls_ciphers)
        except ssl.SSLError as exc:
            raise OSError(f"tls_ciphers {config.tls_ciphers!r}: {exc}") from None
    _load(ctx, config, what)
    return ctx


class TLSContexts:
    """The broker's one server context, shared by its TLS listeners, and its reload.

    `reload` (SIGHUP) reads tls_cert and tls_key again into the same context:
    new handshakes use the new certificate, established connections keep going.
    The files are tried in a scratch context first, so a bad pair leaves the
    running certificate in place."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._context: ssl.SSLContext | None = None

    def context(self, what: str) -> ssl.SSLContext:
        if self._context is None:
            self._context = server_context(self.config, what)
        return self._context

    def reload(self) -> bool:
        """True when the certificate was reloaded; False when no TLS listener uses one."""
        if self._context is None:
            return False
        server_context(self.config, "the certificate reload")  # raises OSError if bad
        _load(self._context, self.config, "the certificate reload")
        return True
