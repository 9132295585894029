"""TLS for every listener: one server context built from the ``[main] tls_*`` settings.

LavinMQ's keys: ``tls_cert`` (PEM certificate chain), ``tls_key`` (PEM private
key), ``tls_min_version`` (1.2 by default; 1.3 to refuse 1.2) and
``tls_ciphers`` (an OpenSSL cipher list for TLS 1.2; empty keeps OpenSSL's
secure defaults). The AMQP (``[amqp] tls_port``, 5671 by convention), MQTT
(``[mqtt] tls_port``, 8883) and HTTP (``[mgmt] tls_port``, 15671) listeners
each wrap their TLS socket with a context from `server_context`.

Client certificates (RabbitMQ's ``ssl_options.cacertfile``, ``verify`` and
``fail_if_no_peer_cert``): ``tls_ca_cert`` names the CA bundle client
certificates are verified against; with ``tls_verify_peer`` clients are asked
for one (CERT_OPTIONAL), and ``tls_fail_if_no_peer_cert`` makes it required
(CERT_REQUIRED). `cert_login` names the user a verified certificate logs in
as (AMQP's EXTERNAL mechanism, MQTT's certificate login).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from warren.config import Config

__all__ = [
    "CERT_LOGIN_FROM", "TLS_VERSIONS", "TLSContexts", "cert_login", "distinguished_name",
    "etcd_context", "replication_contexts", "server_context",
]  # fmt: skip

TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
#: ``tls_cert_login_from`` values (RabbitMQ's ssl_cert_login_from).
CERT_LOGIN_FROM = ("common_name", "distinguished_name", "subject_alternative_name")
#: Attribute names in a distinguished name, as RabbitMQ writes them; keyed by the
#: (OpenSSL long) names ``getpeercert()`` gives. Others keep OpenSSL's name.
_DN_NAMES = {
    "surname": "SN", "givenName": "GIVENNAME", "initials": "INITIALS",
    "generationQualifier": "GENERATIONQUALIFIER", "commonName": "CN", "localityName": "L",
    "stateOrProvinceName": "ST", "organizationName": "O", "organizationalUnitName": "OU",
    "title": "TITLE", "countryName": "C", "serialNumber": "SERIALNUMBER",
    "pseudonym": "PSEUDONYM", "domainComponent": "DC", "emailAddress": "EMAILADDRESS",
    "streetAddress": "STREET", "userId": "UID",
}  # fmt: skip


def cert_login(cert: dict[str, Any] | None, login_from: str = "common_name") -> str | None:
    """The user name a verified peer certificate logs in as.

    ``cert`` is ``SSLObject.getpeercert()``: None (or empty) when the client sent
    no certificate or it was not verified, and None is returned; "" when the
    certificate carries no usable name (its login is refused). ``login_from``:
    the subject's common name, its whole distinguished name (RFC 4514, as
    RabbitMQ's default ``distinguished_name`` gives it: ``CN=alice,O=Example,C=SE``),
    or the first DNS or email subject alternative name."""
    if not cert:
        return None
    if login_from == "distinguished_name":
        return distinguished_name(cert.get("subject", ()))
    if login_from == "subject_alternative_name":
        for kind, value in cert.get("subjectAltName", ()):
            if kind in ("DNS", "email") and isinstance(value, str):
                return value
        return ""
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and isinstance(value, str):
                return value
    return ""


def distinguished_name(subject: Any) -> str:
    """``getpeercert()``'s subject as an RFC 4514 string: last RDN first, a
    multi-valued RDN joined with "+", RabbitMQ's attribute names and escaping
    (its rabbit_ssl formats the name a certificate logs in as this way)."""
    rdns = []
    for rdn in reversed(tuple(subject)):
        rdns.append(
            "+".join(
                f"{_DN_NAMES.get(key, key)}={_escape_dn_value(str(value))}" for key, value in rdn
            )
        )
    return ",".join(rdns)


def _escape_dn_value(value: str) -> str:
    """RFC 4514 escaping: a leading space or "#", a trailing space and
    ``"+,;<>\\`` get a backslash; control characters and every byte of a
    character from "~" on are written as ``\\XX`` (hex of its UTF-8 bytes)."""
    out = []
    last = len(value) - 1
    for i, ch in enumerate(value):
        code = ord(ch)
        if (i == 0 and ch in " #") or (i == last and ch == " ") or ch in '"+,;<>\\':
            out.append("\\" + ch)
        elif code < 32 or code >= 126:
            out.append("".join(f"\\{b:02X}" for b in ch.encode()))
        else:
            out.append(ch)
    return "".join(out)


def _load(ctx: ssl.SSLContext, config: Config, what: str) -> None:
    assert config.tls_cert and config.tls_key
    try:
        ctx.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise OSError(f"cannot load tls_cert/tls_key for {what}: {exc}") from None


def server_context(config: Config, what: str) -> ssl.SSLContext:
    """A context to serve with; OSError (naming ``what``, e.g. "the AMQP TLS port")
    when no certificate is configured or it cannot be loaded.

    With ``tls_sni_certs`` (a directory of ``<hostname>.pem`` and ``<hostname>.key``
    pairs; ``_wildcard.example.com.pem`` serves ``*.example.com``), the context's
    `sni_callback` answers a client that names one of those hosts with its
    certificate; other names, and clients sending none, get tls_cert."""
    if not config.tls_cert or not config.tls_key:
        raise OSError(f"{what} needs tls_cert and tls_key")
    ctx = _context(config, what, config.tls_cert, config.tls_key, "tls_cert/tls_key")
    if config.tls_sni_certs:
        _set_sni(ctx, config, what)
    return ctx


def _set_sni(ctx: ssl.SSLContext, config: Config, what: str) -> None:
    assert config.tls_sni_certs
    directory = Path(config.tls_sni_certs)
    if not directory.is_dir():
        raise OSError(f"tls_sni_certs {directory} for {what}: not a directory")
    try:
        chains = sorted(directory.glob("*.pem"))
    except OSError as exc:
        raise OSError(f"tls_sni_certs {directory} for {what}: {exc}") from None
    hosts: dict[str, ssl.SSLContext] = {}
    for chain in chains:
        key = chain.with_suffix(".key")
        if not key.exists():
            continue
        host = chain.stem.lower()
        if host.startswith("_wildcard."):
            host = "*." + host[len("_wildcard.") :]
        hosts[host] = _context(
            config, what, str(chain), str(key), f"{chain.name}/{key.name} in tls_sni_certs"
        )

    def select(sslobj: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        if not name:
            return
        name = name.lower()
        found = hosts.get(name)
        if found is None and "." in name:
            found = hosts.get("*." + name.split(".", 1)[1])
        if found is not None:
            sslobj.context = found

    ctx.sni_callback = select


def _context(config: Config, what: str, cert: str, key: str, label: str) -> ssl.SSLContext:
    """A server context for one certificate, with the shared settings."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = TLS_VERSIONS[config.tls_min_version]
    if config.tls_ciphers:
        try:
            ctx.set_ciphers(config.tls_ciphers)
        except ssl.SSLError as exc:
            raise OSError(f"tls_ciphers {config.tls_ciphers!r}: {exc}") from None
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise OSError(f"cannot load {label} for {what}: {exc}") from None
    if config.tls_ca_cert:
        _load_ca(ctx, config, what)
        if config.tls_verify_peer:
            ctx.verify_mode = (
                ssl.CERT_REQUIRED if config.tls_fail_if_no_peer_cert else ssl.CERT_OPTIONAL
            )
    return ctx


def _load_ca(ctx: ssl.SSLContext, config: Config, what: str) -> None:
    assert config.tls_ca_cert
    try:
        ctx.load_verify_locations(cafile=config.tls_ca_cert)
    except (OSError, ssl.SSLError) as exc:
        raise OSError(f"cannot load tls_ca_cert for {what}: {exc}") from None


def replication_contexts(config: Config) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts for a cluster's replication link ([clustering]
    tls): mutual TLS with this node's tls_cert/tls_key, both ends verified
    against tls_ca_cert, and the leader's certificate checked against the
    address the follower dials (its advertised host). OSError when a file
    cannot be loaded."""
    what = "[clustering] tls"
    assert config.tls_cert and config.tls_key and config.tls_ca_cert
    server = _context(config, what, config.tls_cert, config.tls_key, "tls_cert/tls_key")
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    client.minimum_version = TLS_VERSIONS[config.tls_min_version]
    _load_ca(client, config, what)
    _load(client, config, what)
    return server, client


def etcd_context(config: Config) -> ssl.SSLContext | None:
    """The client context for https:// etcd endpoints: verified against
    [clustering] etcd_ca_cert (default: the system's CAs), presenting etcd_cert
    and etcd_key when set. None when no endpoint is https:// and no etcd_* file
    is set."""
    wants = any(e.startswith("https://") for e in config.clustering_etcd_endpoints)
    if not wants and not config.clustering_etcd_ca_cert and not config.clustering_etcd_cert:
        return None
    try:
        ctx = ssl.create_default_context(cafile=config.clustering_etcd_ca_cert)
        if config.clustering_etcd_cert and config.clustering_etcd_key:
            ctx.load_cert_chain(config.clustering_etcd_cert, config.clustering_etcd_key)
    except (OSError, ssl.SSLError) as exc:
        raise OSError(f"cannot load [clustering] etcd_ca_cert/etcd_cert/etcd_key: {exc}") from None
    return ctx


class TLSContexts:
    """The broker's one server context, shared by its TLS listeners, and its reload.

    `reload` (SIGHUP) reads tls_cert and tls_key again into the same context (and
    tls_ca_cert: CAs it adds are trusted, none are forgotten before a restart; and
    the tls_sni_certs directory):
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
        if self.config.tls_ca_cert:
            _load_ca(self._context, self.config, "the certificate reload")
        if self.config.tls_sni_certs:
            _set_sni(self._context, self.config, "the certificate reload")
        return True
