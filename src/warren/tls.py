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

__all__ = ["TLS_VERSIONS", "server_context"]

TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


def server_context(config: Config, what: str) -> ssl.SSLContext:
    """The context a TLS listener serves with; OSError (naming ``what``, e.g. "the
    AMQP TLS port") when no certificate is configured or it cannot be loaded."""
    if not config.tls_cert or not config.tls_key:
        raise OSError(f"{what} needs tls_cert and tls_key")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = TLS_VERSIONS[config.tls_min_version]
    if config.tls_ciphers:
        try:
            ctx.set_ciphers(config.tls_ciphers)
        except ssl.SSLError as exc:
            raise OSError(f"tls_ciphers {config.tls_ciphers!r}: {exc}") from None
    try:
        ctx.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise OSError(f"cannot load tls_cert/tls_key for {what}: {exc}") from None
    return ctx
