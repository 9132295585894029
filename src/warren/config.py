"""Broker configuration: defaults, LavinMQ-style INI files and validation.

The INI layout deliberately reuses LavinMQ's section and key names
(``[main] data_dir``, ``[amqp] port`` ...) so an existing LavinMQ config file
works unchanged. An unknown section or key stops the start with the file,
line and nearest known name (a typo must not leave the broker on defaults);
LavinMQ settings of features Warren does not have are warned about and
ignored, so a LavinMQ file still starts the broker (config_names.py). What
each setting accepts is config_checks.py's.
"""

from __future__ import annotations

import configparser
import dataclasses
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from warren import config_mgmt_oauth
from warren.config_checks import LOG_LEVELS, check_field, normalize_log_level
from warren.config_edges import EDGE_INI_KEYS, EdgeSettings
from warren.config_names import (
    RENAMED,
    UNSUPPORTED_KEYS,
    line_numbers,
    suggestion,
    unsupported_section,
)
from warren.config_oauth2 import OAuth2Extra, from_lavinmq, is_extra_key, parse_extra
from warren.sample_retention import DEFAULT_POLICIES, Retention

__all__ = ["Config", "ConfigError", "LOG_LEVELS", "check_field", "normalize_log_level"]

log = logging.getLogger("warren.config")

#: RabbitMQ's stream protocol TLS port: stream_tls_port's when tls_cert/tls_key are set.
STREAM_TLS_PORT = 5551


class ConfigError(ValueError):
    """Invalid configuration; the message is meant to be shown to the operator as is."""


@dataclass
class Config(config_mgmt_oauth.MgmtOAuthSettings, EdgeSettings):
    """Everything the broker needs to start; defaults match LavinMQ/RabbitMQ where sensible."""

    data_dir: str = "./data"
    log_level: str = "info"
    #: The RabbitMQ release Warren announces, for clients and tools that check it: AMQP's
    #: connection.start ``version``, the management API's ``rabbitmq_version`` and
    #: ``management_version`` (/api/overview) and the ``rabbit`` application (/api/nodes).
    #: 3.10.8: the release whose management API answers Warren follows (tests/http).
    rabbitmq_version: str = "3.10.8"
    bind: str = "127.0.0.1"
    amqp_port: int = 5672
    #: The HTTP management API (RabbitMQ's, warren.http): address and port; port 0
    #: picks a free one, -1 disables the listener.
    http_bind: str = "127.0.0.1"
    http_port: int = 15672
    #: The Prometheus metrics on their own listener (RabbitMQ's prometheus.tcp.ip /
    #: prometheus.tcp.port, default 15692): /metrics, /metrics/per-object,
    #: /metrics/detailed; 0 picks a free port, -1 disables it ([prometheus]).
    prometheus_bind: str = "127.0.0.1"
    prometheus_port: int = 15692
    #: The same over HTTPS (RabbitMQ's prometheus.ssl.port, 15691 by convention);
    #: -1: none. Needs tls_cert/tls_key.
    prometheus_tls_port: int = -1
    #: /metrics gives one sample per object, as /metrics/per-object (RabbitMQ's
    #: prometheus.return_per_object_metrics).
    prometheus_return_per_object_metrics: bool = False
    #: Seconds; what the server proposes in connection.tune. 0 disables heartbeats.
    heartbeat: int = 300
    frame_max: int = 131072
    channel_max: int = 2047
    #: Client connections (every protocol) open at once; beyond it an AMQP socket
    #: is closed before the handshake (RabbitMQ's connection_max), an MQTT CONNECT
    #: refused with Quota exceeded. 0: no limit.
    max_connections: int = 0
    #: Connections open with a PROXY protocol header (v1 or v2, docs/security.md),
    #: as RabbitMQ's proxy_protocol: [main] proxy_protocol for every listener, or
    #: [amqp]/[mqtt]/[stream]/[mgmt] proxy_protocol for one (None: [main]'s).
    proxy_protocol: bool = False
    amqp_proxy_protocol: bool | None = None
    mqtt_proxy_protocol: bool | None = None
    stream_proxy_protocol: bool | None = None
    http_proxy_protocol: bool | None = None
    #: ms a client has to send its PROXY header, else it is closed.
    proxy_protocol_timeout: int = 5000
    #: Rate limits (core/rate_limits.py, docs/security.md; 0: none): connections
    #: per source address per second, messages published per connection per
    #: second (the publisher is slowed, never dropped), subscriptions per client.
    connection_rate_limit: int = 0
    publish_rate_limit: int = 0
    max_subscriptions_per_client: int = 0
    #: Consumers per AMQP channel; basic.consume beyond it is refused with 530
    #: (RabbitMQ's consumer_max_per_channel). 0: no limit.
    max_consumers_per_channel: int = 0
    #: Bytes; largest message body accepted from publishers.
    max_message_size: int = 134217728
    default_user: str = "guest"
    default_password: str = "guest"
    #: Users that may only log in over loopback (RabbitMQ's loopback_users).
    #: An empty tuple lifts the restriction.
    loopback_users: tuple[str, ...] = ("guest",)
    default_vhost: str = "/"
    #: Bytes per message segment file; a queue's messages are appended to these.
    segment_size: int = 8 * 1024 * 1024
    #: fdatasync before confirming persistent messages (group-committed). False
    #: trades crash safety for speed, as LavinMQ's setting does.
    sync: bool = True
    #: Bytes of free disk below which publishers are blocked (connection.blocked).
    free_disk_min: int = 50 * 1024 * 1024
    #: Fraction of the machine's RAM (or of the cgroup limit, when smaller) the
    #: broker's resident memory may reach before publishers are blocked, as
    #: RabbitMQ's vm_memory_high_watermark.relative; 0 disables the alarm.
    memory_high_watermark: float = 0.4
    #: Bytes; when non-zero, the memory limit instead of the fraction (RabbitMQ's
    #: vm_memory_high_watermark.absolute).
    memory_high_watermark_absolute: int = 0
    #: Milliseconds a delivery may stay unacknowledged before its channel is closed
    #: (406), as RabbitMQ's consumer_timeout; 0 disables. x-consumer-timeout on a
    #: queue overrides it.
    consumer_timeout: int = 1_800_000
    #: Milliseconds between samples of the message rates the management API and
    #: metrics report (RabbitMQ's collect_statistics_interval); 0: never sampled
    #: (counters still count, rates stay 0).
    collect_statistics_interval: int = 5000
    #: MQTT 3.1.1/5 (warren.mqtt, docs/mqtt.md): address and port; -1 disables the
    #: TCP listener (MQTT over WebSocket on the HTTP port stays).
    mqtt_bind: str = "127.0.0.1"
    mqtt_port: int = 1883
    #: MQTT over TLS (LavinMQ's [mqtt] tls_port); -1: none. Needs tls_cert/tls_key.
    mqtt_tls_port: int = -1
    #: PEM certificate chain and private key for the TLS listeners ([main] tls_cert,
    #: tls_key as LavinMQ names them).
    tls_cert: str | None = None
    tls_key: str | None = None
    #: Oldest TLS version accepted: "1.2" or "1.3" ([main] tls_min_version).
    tls_min_version: str = "1.2"
    #: OpenSSL cipher list for TLS 1.2 ([main] tls_ciphers); empty: OpenSSL's defaults.
    tls_ciphers: str = ""
    #: Client certificates ([main] tls_ca_cert: the PEM CA bundle they are verified
    #: against; tls_verify_peer: ask clients for one; tls_fail_if_no_peer_cert: require
    #: it), as RabbitMQ's ssl_options cacertfile, verify and fail_if_no_peer_cert.
    tls_ca_cert: str | None = None
    tls_verify_peer: bool = False
    tls_fail_if_no_peer_cert: bool = False
    #: The user a verified client certificate logs in as (AMQP EXTERNAL, MQTT):
    #: "common_name", "distinguished_name" (the whole subject, RFC 4514, RabbitMQ's
    #: default) or "subject_alternative_name" (the first DNS or email SAN).
    tls_cert_login_from: str = "common_name"
    #: SNI ([main] tls_sni_certs): a directory of <hostname>.pem/<hostname>.key pairs
    #: served to clients naming that host; others get tls_cert. None: no SNI.
    tls_sni_certs: str | None = None
    #: AMQP over TLS (amqps, 5671 by convention; LavinMQ's [amqp] tls_port); -1: none.
    amqp_tls_port: int = -1
    #: The management API over HTTPS (15671 by convention; [mgmt] tls_port); -1: none.
    http_tls_port: int = -1
    #: Bytes: the largest request body the management API reads (RabbitMQ's
    #: management.http.max_body_size and its default); a larger one is refused (400).
    http_max_body_size: int = 10_000_000
    #: Bytes: the same for a definitions upload (POST /api/definitions): 20 MB holds
    #: some 200,000 queues.
    http_max_definitions_size: int = 20_000_000
    #: Bytes of request bodies the management API holds at once, every request
    #: together; a request that would go beyond it is refused (503) until others end.
    http_body_budget: int = 64 * 1024 * 1024
    #: Bytes: the largest request body the HTTP bridge reads (docs/http-bridge.md);
    #: a larger one is refused (413). [mgmt] bridge_max_body_size.
    http_bridge_max_body_size: int = 1_000_000
    #: How long the rates and lengths history of each kind of object is kept
    #: (RabbitMQ's management.sample_retention_policies and their defaults): (max
    #: age, interval) pairs in seconds, by max age. ``global``: vhosts, the overview
    #: and the node; ``basic``: queues, exchanges, channels and connections;
    #: ``detailed``: RabbitMQ's per channel and queue figures, which Warren does not
    #: keep (the overview lists it). [mgmt] sample_retention_policies.<policy>.<age>.
    sample_retention_global: Retention = DEFAULT_POLICIES["global"]
    sample_retention_basic: Retention = DEFAULT_POLICIES["basic"]
    sample_retention_detailed: Retention = DEFAULT_POLICIES["detailed"]
    #: Clustering (docs/clustering.md; LavinMQ's [clustering] keys): etcd elects the
    #: leader, which serves clients; followers replicate its data directory.
    clustering: bool = False
    #: etcd client URLs (comma-separated in the INI file).
    clustering_etcd_endpoints: tuple[str, ...] = ("localhost:2379",)
    #: Prefix of every key this cluster keeps in etcd.
    clustering_etcd_prefix: str = "warren"
    #: Where followers connect to replicate (bind address and port).
    clustering_bind: str = "127.0.0.1"
    clustering_port: int = 5679
    #: How other nodes reach this one's replication port, tcp://host:port (empty:
    #: tcp://<clustering_bind>:<clustering_port>).
    clustering_advertised_uri: str = ""
    #: Actions a follower may lag behind before it leaves the in-sync replica set.
    clustering_max_unsynced_actions: int = 8192
    #: Seconds of the leader's etcd lease: how long a dead leader holds the cluster.
    clustering_lease_ttl: int = 5
    #: While this node follows: the port (on [amqp] bind) of its read-only stream
    #: service (amqp/replica.py), advertised to AMQP clients of the leader so
    #: readers such as Spark's executors spread over the followers; -1: none.
    clustering_stream_read_port: int = -1
    #: While this node follows: the port (on [stream] bind) of its read-only
    #: stream protocol service (stream_protocol/replica.py), named in the
    #: leader's Metadata as the streams' replica on this node; -1: none.
    clustering_stream_protocol_read_port: int = -1
    #: Replication over mutual TLS ([clustering] tls): the leader serves it with
    #: tls_cert/tls_key and takes only followers whose certificate tls_ca_cert
    #: verifies; a follower checks the leader's the same way, against its address.
    clustering_tls: bool = False
    #: etcd over https:// endpoints: the CA bundle its certificate is verified
    #: against (empty: the system's) and this node's client certificate and key
    #: for etcd's --client-cert-auth ([clustering] etcd_ca_cert, etcd_cert, etcd_key).
    clustering_etcd_ca_cert: str | None = None
    clustering_etcd_cert: str | None = None
    clustering_etcd_key: str | None = None
    #: How many nodes the cluster is meant to have (RabbitMQ's
    #: cluster_formation.target_cluster_size_hint): the reached-target-cluster-size
    #: health check fails while fewer are members.
    clustering_target_cluster_size_hint: int = 1
    #: This node's name in the cluster (etcd's keys, /api/cluster, the logs); empty:
    #: the id kept in the data directory (random hex, made on first start).
    clustering_node_name: str = ""
    #: The exchange MQTT publishes to and subscribes on (RabbitMQ's mqtt.exchange).
    mqtt_exchange: str = "amq.topic"
    #: The vhost of MQTT clients whose user name does not say ``vhost:user``.
    mqtt_vhost: str = "/"
    #: Let clients without a user name in as default_user (RabbitMQ's allow_anonymous).
    mqtt_allow_anonymous: bool = True
    #: Offer AMQP 1.0 clients SASL ANONYMOUS, logging them in as default_user
    #: (RabbitMQ 4's anonymous_login_user); loopback_users still applies.
    amqp1_allow_anonymous: bool = True
    #: Announce product "RabbitMQ" and a 4.x version (``rabbitmq_version`` when 4.1
    #: or later, else 4.1.0) in the AMQP 1.0 open instead of Warren's own: RabbitMQ's
    #: AMQP 1.0 clients (rabbitmq-amqp-python-client ...) refuse any other broker.
    amqp1_announce_rabbitmq: bool = False
    #: RabbitMQ's stream protocol (warren.stream_protocol, docs/streams.md):
    #: address and port (5552, as RabbitMQ's with rabbitmq_stream enabled); 0 picks
    #: a free one, -1 disables the listener.
    stream_bind: str = "127.0.0.1"
    stream_port: int = 5552
    #: The stream protocol over TLS; None (the default): RabbitMQ's 5551 when
    #: tls_cert and tls_key are set, else none (see stream_tls_listen_port); -1: none.
    stream_tls_port: int | None = None
    #: Offer stream clients SASL ANONYMOUS, logging them in as default_user.
    stream_allow_anonymous: bool = True
    #: The host and port stream clients are told to connect to (Open's answer,
    #: Metadata); empty/0: the address and port the client reached.
    stream_advertised_host: str = ""
    stream_advertised_port: int = 0
    #: The largest frame this side proposes in Tune (RabbitMQ's default 1 MiB; 0: no limit).
    stream_frame_max: int = 1 << 20
    #: The heartbeat interval this side proposes in Tune, seconds (0: none).
    stream_heartbeat: int = 60
    #: Unacknowledged QoS 1/2 deliveries per MQTT session (RabbitMQ's mqtt.prefetch);
    #: an MQTT 5 client's smaller Receive Maximum wins. Large, because a session's
    #: window is refilled once per event-loop turn: 100 caps a subscriber at ~25k
    #: msg/s while 4096 keeps up with a full-speed publisher (docs/benchmarks.md).
    mqtt_prefetch: int = 4096
    #: Seconds: the longest MQTT 5 Session Expiry Interval granted (RabbitMQ 3.13's
    #: max_session_expiry_interval_seconds); 3.1.1 persistent sessions never expire.
    mqtt_max_session_expiry: int = 86400
    #: Seconds: keep alives above this are lowered with MQTT 5's Server Keep Alive;
    #: 0 accepts any.
    mqtt_max_keepalive: int = 0
    #: Topic aliases a client may set per connection (MQTT 5 Topic Alias Maximum).
    mqtt_topic_alias_maximum: int = 16
    #: Seconds an MQTT packet may take from its first byte to its last, whatever the
    #: keep alive (0 too): a client that announces a packet and never completes it
    #: is closed then (MQTT 5: DISCONNECT 0x8D). 0: no limit.
    mqtt_packet_timeout: float = 60.0
    #: Bytes all MQTT connections together may hold in packets not yet complete;
    #: beyond it the connection with the largest is closed (MQTT 5: DISCONNECT
    #: 0x97 Quota exceeded). Also the largest packet accepted (the Maximum Packet
    #: Size MQTT 5 clients are told) when smaller than max_message_size's. 0: no limit.
    mqtt_partial_packet_memory: int = 256 * 1024 * 1024
    #: Milliseconds a refused login is held once its address has failed before in
    #: the last minute, doubling with each further failure (at most 2 s); 0: never.
    auth_failure_delay: int = 200
    #: Failed logins per source address and minute after which its logins are
    #: refused unchecked until they age out; 0: no limit.
    auth_failures_per_minute: int = 30
    #: The login chain, in order (RabbitMQ's auth_backends): ``oauth2`` checks a
    #: password that looks like a JWT as an access token (when
    #: oauth2_resource_server_id is set), ``internal`` the user store.
    auth_backends: tuple[str, ...] = ("oauth2", "internal")
    #: [oauth2], RabbitMQ's auth_oauth2.* (docs/security.md): empty id: off.
    oauth2_resource_server_id: str = ""
    oauth2_jwks_url: str | None = None
    #: ``kid:path`` PEM public keys (or certificates), comma separated.
    oauth2_signing_keys: tuple[str, ...] = ()
    oauth2_default_key: str | None = None
    oauth2_issuer: str | None = None
    oauth2_verify_aud: bool = True
    oauth2_scope_prefix: str | None = None
    oauth2_preferred_username_claims: tuple[str, ...] = ()
    oauth2_additional_scopes_key: str | None = None
    #: Seconds between JWKS fetches caused by an unknown kid (at most one per).
    oauth2_jwks_min_refetch_interval: int = 10
    #: The dotted [oauth2] keys (config_oauth2.py): aliases, resource servers, JWKS TLS.
    oauth2_extra: OAuth2Extra = dataclasses.field(default_factory=OAuth2Extra)
    #: A RabbitMQ definitions export (JSON file, or a directory of them) imported
    #: at every start, as RabbitMQ's ``load_definitions``. None: nothing to load.
    load_definitions: str | None = None
    #: A JSON file of webhook targets (docs/webhooks.md): broker events are
    #: POSTed to them. None: no webhooks.
    webhooks_file: str | None = None
    #: What a damaged metadata file (users.json, vhosts.json, a definitions log,
    #: MQTT's session and retained logs ...) does at start: "refuse" to start,
    #: naming the file, or "set-aside": rename it to <name>.damaged-<time> and start
    #: without what it held (store/damage.py, docs/storage.md "Damage").
    damaged_metadata: str = "refuse"
    #: RabbitMQ 4.x's deprecated feature ``deprecated_features.permit.global_qos``
    #: ([deprecated_features] permit.global_qos): True, as RabbitMQ 4.0-4.2 permit
    #: it by default, keeps 3.x's global prefetch (basic.qos global=true; a quorum
    #: queue refuses such a consumer, 540); False, RabbitMQ 4.3's default, takes
    #: global=true as per-consumer, as if global QoS were gone.
    permit_global_qos: bool = True

    @classmethod
    def from_ini(cls, path: str | os.PathLike[str]) -> Config:
        """Defaults overlaid with the settings of one INI file, validated."""
        config = cls()
        config.validate(config.apply_ini(path))
        return config

    def apply_ini(self, path: str | os.PathLike[str]) -> dict[str, str]:
        """Overlay the settings found in ``path`` onto this config.

        All-or-nothing: on any error nothing is changed, so a caller never
        sees a half-applied file. Each value is range-checked here so the
        error can name the file, line, section and key it came from; an
        unknown section or key is an error too (config_names.py). Returns
        where each field set came from (``file:line``), for validate().
        """
        name = os.fspath(path)
        parser = configparser.ConfigParser(
            # A literal [DEFAULT] section would otherwise leak its keys into
            # every section; treat it as just another unknown section.
            default_section="\x00warren-no-default\x00",
            # Passwords and paths may contain '%'.
            interpolation=None,
            # "port = 5672   ; a comment", as the docs write them; a ';' not
            # preceded by whitespace stays part of the value.
            inline_comment_prefixes=(";",),
        )
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            parser.read_string(text, source=name)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ConfigError(f"cannot read config file {name}: {reason}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{name}: malformed config file: not UTF-8 text ({exc})") from exc
        except configparser.Error as exc:
            raise ConfigError(_malformed(name, text, exc)) from exc
        lines = from_lavinmq(parser, line_numbers(text), name)  # LavinMQ's [oauth]

        def where(section: str, key: str | None = None) -> str:
            number = lines.get((section, key)) or lines.get((section, None))
            return f"{name}:{number}" if number else name

        updates: dict[str, Any] = {}
        origin: dict[str, str] = {}
        retention: dict[str, list[tuple[int, int]]] = {}
        retention_origin: dict[str, str] = {}
        oauth2_extra: list[tuple[str, str, str]] = []
        for section in parser.sections():
            if unsupported_section(section):
                log.warning(
                    "%s: LavinMQ's [%s] is not supported by Warren; its settings are ignored",
                    where(section),
                    section,
                )
                continue
            if section not in _INI_SECTIONS:
                raise ConfigError(f"{where(section)}: {_unknown_section(section)}")
            for key in parser.options(section):
                raw = parser.get(section, key)
                if section == "mgmt" and key.startswith(_RETENTION_PREFIX):
                    try:
                        policy, pair = _parse_retention(key, raw)
                    except ValueError as exc:
                        raise ConfigError(
                            _ini_error(where(section, key), section, key, raw, str(exc))
                        ) from None
                    retention.setdefault(policy, []).append(pair)
                    retention_origin.setdefault(policy, where(section, key))
                    continue
                if section == "oauth2" and is_extra_key(key):
                    oauth2_extra.append((key, raw, where(section, key)))
                    continue
                spec = _INI_KEYS.get((section, key))
                if spec is None:
                    if (section, key) in UNSUPPORTED_KEYS:
                        log.warning(
                            "%s: LavinMQ's [%s] %s is not supported by Warren; ignored",
                            where(section, key),
                            section,
                            key,
                        )
                        continue
                    raise ConfigError(f"{where(section, key)}: {_unknown_key(section, key)}")
                field, convert = spec
                try:
                    value = convert(raw)
                except ValueError as exc:
                    raise ConfigError(
                        _ini_error(where(section, key), section, key, raw, str(exc))
                    ) from None
                problem = check_field(field, value)
                if problem is not None:
                    raise ConfigError(_ini_error(where(section, key), section, key, raw, problem))
                updates[field] = value
                origin[field] = f"{where(section, key)}: [{section}] {key}"
        for policy, pairs in retention.items():
            # The policies set replace their defaults; the others keep theirs.
            field = f"sample_retention_{policy}"
            value = tuple(sorted(pairs))
            problem = check_field(field, value)
            if problem is not None:
                raise ConfigError(
                    f"{retention_origin[policy]}: [mgmt] {_RETENTION_PREFIX}{policy}: {problem}"
                )
            updates[field] = value
            origin[field] = f"{retention_origin[policy]}: [mgmt] {_RETENTION_PREFIX}{policy}"
        if oauth2_extra:
            try:
                updates["oauth2_extra"] = parse_extra(oauth2_extra)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        for field, value in updates.items():
            setattr(self, field, value)
        return origin

    def validate(self, origin: Mapping[str, str] | None = None) -> None:
        """Raise ConfigError for the first out-of-range setting.

        Run after all sources (defaults, file, flags) are merged, so a config
        built in code gets the same checks as one read from disk. ``origin``
        (field -> where it was set, as apply_ini returns) lets a problem between
        several settings name the line of the one that asked for the others.
        """
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            problem = check_field(f.name, value)
            if problem is not None:
                raise ConfigError(f"invalid {f.name} {value!r}: {problem}")

        def fail(field: str, message: str) -> ConfigError:
            source = (origin or {}).get(field)
            return ConfigError(f"{source}: {message}" if source else message)

        if self.tls_verify_peer and not self.tls_ca_cert:
            raise fail(
                "tls_verify_peer",
                "tls_verify_peer needs tls_ca_cert (the CA bundle to verify with)",
            )
        if self.tls_fail_if_no_peer_cert and not self.tls_verify_peer:
            raise fail(
                "tls_fail_if_no_peer_cert", "tls_fail_if_no_peer_cert needs tls_verify_peer = true"
            )
        if self.clustering_tls and not (self.tls_cert and self.tls_key and self.tls_ca_cert):
            raise fail(
                "clustering_tls",
                "[clustering] tls needs tls_cert, tls_key (this node's certificate) and "
                "tls_ca_cert (the CA that signs every node's)",
            )
        if self.http_body_budget < max(self.http_max_body_size, self.http_max_definitions_size):
            raise fail(
                "http_body_budget",
                "[mgmt] body_budget must hold the largest body allowed "
                "(max_body_size, max_definitions_size)",
            )
        if bool(self.clustering_etcd_cert) != bool(self.clustering_etcd_key):
            which = "clustering_etcd_cert" if self.clustering_etcd_cert else "clustering_etcd_key"
            raise fail(which, "[clustering] etcd_cert and etcd_key go together")
        if (oauth := config_mgmt_oauth.problem(self)) is not None:
            raise fail(*oauth)

    def proxy_protocol_for(self, section: str) -> bool:
        """Whether the listener of ``section`` (amqp, mqtt, stream, mgmt, prometheus,
        clustering: a follower's read ports) takes a PROXY header: its own
        proxy_protocol, else [main]'s."""
        own: bool | None = getattr(
            self, f"{'http' if section == 'mgmt' else section}_proxy_protocol"
        )
        return self.proxy_protocol if own is None else own

    @property
    def stream_tls_listen_port(self) -> int:
        """The stream protocol's TLS port to open (-1: none): stream_tls_port, or
        for its default 5551 once there is a certificate to serve, so that setting
        tls_cert and tls_key is enough, while a port set without them still fails
        the start (it needs them)."""
        if self.stream_tls_port is not None:
            return self.stream_tls_port
        return STREAM_TLS_PORT if self.tls_cert and self.tls_key else -1

    @property
    def logging_level(self) -> int:
        """The :mod:`logging` level for ``log_level`` (accepts 'warn')."""
        return LOG_LEVELS[normalize_log_level(self.log_level)]


# --- value parsing -----------------------------------------------------------

_INT_RE = re.compile(r"[+-]?[0-9]+")


def _parse_int(raw: str) -> int:
    text = raw.strip()
    # Stricter than int(): no '1_000', no unicode digits, no empty value.
    if not _INT_RE.fullmatch(text):
        raise ValueError("not an integer")
    return int(text)


_FLOAT_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)")


def _parse_float(raw: str) -> float:
    text = raw.strip()
    if not _FLOAT_RE.fullmatch(text):
        raise ValueError("not a number")
    return float(text)


def _parse_str(raw: str) -> str:
    return raw.strip()


def _parse_optional_path(raw: str) -> str | None:
    """A path; an empty value means none."""
    return raw.strip() or None


def _parse_log_level(raw: str) -> str:
    return normalize_log_level(raw)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(raw: str) -> bool:
    text = raw.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("not a boolean (true/false)")


def _parse_user_list(raw: str) -> tuple[str, ...]:
    """Comma-separated user names; an empty value means 'no restricted users'."""
    return tuple(name.strip() for name in raw.split(",") if name.strip())


_INI_KEYS: dict[tuple[str, str], tuple[str, Callable[[str], Any]]] = {
    ("main", "data_dir"): ("data_dir", _parse_str),
    ("main", "log_level"): ("log_level", _parse_log_level),
    ("main", "rabbitmq_version"): ("rabbitmq_version", _parse_str),
    # RabbitMQ-like extras, not LavinMQ keys.
    ("main", "default_user"): ("default_user", _parse_str),
    ("main", "default_password"): ("default_password", _parse_str),
    ("main", "loopback_users"): ("loopback_users", _parse_user_list),
    ("main", "segment_size"): ("segment_size", _parse_int),
    ("main", "free_disk_min"): ("free_disk_min", _parse_int),
    ("main", "memory_high_watermark"): ("memory_high_watermark", _parse_float),
    ("main", "memory_high_watermark_absolute"): ("memory_high_watermark_absolute", _parse_int),
    ("main", "consumer_timeout"): ("consumer_timeout", _parse_int),
    ("main", "collect_statistics_interval"): ("collect_statistics_interval", _parse_int),
    ("main", "sync"): ("sync", _parse_bool),
    ("main", "damaged_metadata"): ("damaged_metadata", _parse_str),
    ("main", "load_definitions"): ("load_definitions", _parse_optional_path),
    ("main", "webhooks_file"): ("webhooks_file", _parse_optional_path),
    ("main", "auth_failure_delay"): ("auth_failure_delay", _parse_int),
    ("main", "auth_failures_per_minute"): ("auth_failures_per_minute", _parse_int),
    ("main", "auth_backends"): ("auth_backends", _parse_user_list),
    ("oauth2", "resource_server_id"): ("oauth2_resource_server_id", _parse_str),
    ("oauth2", "jwks_url"): ("oauth2_jwks_url", _parse_optional_path),
    ("oauth2", "signing_keys"): ("oauth2_signing_keys", _parse_user_list),
    ("oauth2", "default_key"): ("oauth2_default_key", _parse_optional_path),
    ("oauth2", "issuer"): ("oauth2_issuer", _parse_optional_path),
    ("oauth2", "verify_aud"): ("oauth2_verify_aud", _parse_bool),
    ("oauth2", "scope_prefix"): ("oauth2_scope_prefix", _parse_str),
    ("oauth2", "preferred_username_claims"): ("oauth2_preferred_username_claims", _parse_user_list),
    ("oauth2", "additional_scopes_key"): ("oauth2_additional_scopes_key", _parse_optional_path),
    ("oauth2", "jwks_min_refetch_interval"): ("oauth2_jwks_min_refetch_interval", _parse_int),
    ("main", "max_connections"): ("max_connections", _parse_int),
    ("main", "proxy_protocol"): ("proxy_protocol", _parse_bool),
    ("main", "proxy_protocol_timeout"): ("proxy_protocol_timeout", _parse_int),
    ("amqp", "proxy_protocol"): ("amqp_proxy_protocol", _parse_bool),
    ("mqtt", "proxy_protocol"): ("mqtt_proxy_protocol", _parse_bool),
    ("stream", "proxy_protocol"): ("stream_proxy_protocol", _parse_bool),
    ("mgmt", "proxy_protocol"): ("http_proxy_protocol", _parse_bool),
    ("main", "connection_rate_limit"): ("connection_rate_limit", _parse_int),
    ("main", "publish_rate_limit"): ("publish_rate_limit", _parse_int),
    ("main", "max_subscriptions_per_client"): ("max_subscriptions_per_client", _parse_int),
    ("amqp", "bind"): ("bind", _parse_str),
    ("amqp", "port"): ("amqp_port", _parse_int),
    ("amqp", "heartbeat"): ("heartbeat", _parse_int),
    ("amqp", "frame_max"): ("frame_max", _parse_int),
    ("amqp", "channel_max"): ("channel_max", _parse_int),
    ("amqp", "max_consumers_per_channel"): ("max_consumers_per_channel", _parse_int),
    ("amqp", "max_message_size"): ("max_message_size", _parse_int),
    ("main", "tls_cert"): ("tls_cert", _parse_optional_path),
    ("main", "tls_key"): ("tls_key", _parse_optional_path),
    ("main", "tls_min_version"): ("tls_min_version", _parse_str),
    ("main", "tls_ciphers"): ("tls_ciphers", _parse_str),
    ("main", "tls_ca_cert"): ("tls_ca_cert", _parse_optional_path),
    ("main", "tls_verify_peer"): ("tls_verify_peer", _parse_bool),
    ("main", "tls_fail_if_no_peer_cert"): ("tls_fail_if_no_peer_cert", _parse_bool),
    ("main", "tls_cert_login_from"): ("tls_cert_login_from", _parse_str),
    ("main", "tls_sni_certs"): ("tls_sni_certs", _parse_optional_path),
    ("amqp", "tls_port"): ("amqp_tls_port", _parse_int),
    ("mgmt", "tls_port"): ("http_tls_port", _parse_int),
    ("mgmt", "max_body_size"): ("http_max_body_size", _parse_int),
    ("mgmt", "max_definitions_size"): ("http_max_definitions_size", _parse_int),
    ("mgmt", "body_budget"): ("http_body_budget", _parse_int),
    ("mgmt", "bridge_max_body_size"): ("http_bridge_max_body_size", _parse_int),
    ("mqtt", "bind"): ("mqtt_bind", _parse_str),
    ("mqtt", "port"): ("mqtt_port", _parse_int),
    ("mqtt", "tls_port"): ("mqtt_tls_port", _parse_int),
    ("mqtt", "exchange"): ("mqtt_exchange", _parse_str),
    ("mqtt", "default_vhost"): ("mqtt_vhost", _parse_str),
    ("mqtt", "allow_anonymous"): ("mqtt_allow_anonymous", _parse_bool),
    ("amqp1", "allow_anonymous"): ("amqp1_allow_anonymous", _parse_bool),
    ("amqp1", "announce_rabbitmq"): ("amqp1_announce_rabbitmq", _parse_bool),
    ("stream", "bind"): ("stream_bind", _parse_str),
    ("stream", "port"): ("stream_port", _parse_int),
    ("stream", "tls_port"): ("stream_tls_port", _parse_int),
    ("stream", "allow_anonymous"): ("stream_allow_anonymous", _parse_bool),
    ("stream", "advertised_host"): ("stream_advertised_host", _parse_str),
    ("stream", "advertised_port"): ("stream_advertised_port", _parse_int),
    ("stream", "frame_max"): ("stream_frame_max", _parse_int),
    ("stream", "heartbeat"): ("stream_heartbeat", _parse_int),
    ("mqtt", "prefetch"): ("mqtt_prefetch", _parse_int),
    ("mqtt", "max_session_expiry_interval"): ("mqtt_max_session_expiry", _parse_int),
    ("mqtt", "max_keepalive"): ("mqtt_max_keepalive", _parse_int),
    ("mqtt", "topic_alias_maximum"): ("mqtt_topic_alias_maximum", _parse_int),
    ("mqtt", "packet_timeout"): ("mqtt_packet_timeout", _parse_float),
    ("mqtt", "partial_packet_memory"): ("mqtt_partial_packet_memory", _parse_int),
    ("clustering", "enabled"): ("clustering", _parse_bool),
    ("clustering", "etcd_endpoints"): ("clustering_etcd_endpoints", _parse_user_list),
    ("clustering", "etcd_prefix"): ("clustering_etcd_prefix", _parse_str),
    ("clustering", "node_name"): ("clustering_node_name", _parse_str),
    ("clustering", "bind"): ("clustering_bind", _parse_str),
    ("clustering", "port"): ("clustering_port", _parse_int),
    ("clustering", "advertised_uri"): ("clustering_advertised_uri", _parse_str),
    ("clustering", "max_unsynced_actions"): ("clustering_max_unsynced_actions", _parse_int),
    ("clustering", "lease_ttl"): ("clustering_lease_ttl", _parse_int),
    ("clustering", "stream_read_port"): ("clustering_stream_read_port", _parse_int),
    ("clustering", "stream_protocol_read_port"): (
        "clustering_stream_protocol_read_port",
        _parse_int,
    ),
    ("clustering", "tls"): ("clustering_tls", _parse_bool),
    ("clustering", "etcd_ca_cert"): ("clustering_etcd_ca_cert", _parse_optional_path),
    ("clustering", "etcd_cert"): ("clustering_etcd_cert", _parse_optional_path),
    ("clustering", "etcd_key"): ("clustering_etcd_key", _parse_optional_path),
    ("clustering", "target_cluster_size_hint"): (
        "clustering_target_cluster_size_hint",
        _parse_int,
    ),
    # LavinMQ's section for its management HTTP server.
    ("mgmt", "bind"): ("http_bind", _parse_str),
    ("mgmt", "port"): ("http_port", _parse_int),
    ("prometheus", "bind"): ("prometheus_bind", _parse_str),
    ("prometheus", "port"): ("prometheus_port", _parse_int),
    ("prometheus", "tls_port"): ("prometheus_tls_port", _parse_int),
    ("prometheus", "return_per_object_metrics"): (
        "prometheus_return_per_object_metrics",
        _parse_bool,
    ),
    # RabbitMQ's deprecated_features.permit.<feature> keys.
    ("deprecated_features", "permit.global_qos"): ("permit_global_qos", _parse_bool),
    **config_mgmt_oauth.INI_KEYS,
}
for _key, (_field, _kind) in EDGE_INI_KEYS.items():  # config_edges.py's
    _INI_KEYS[_key] = (_field, _parse_bool if _kind is bool else _parse_int)
_INI_SECTIONS = frozenset(section for section, _ in _INI_KEYS)


def ini_sections() -> list[str]:
    """The INI file's sections, in the order the key table introduces them (for --help)."""
    return list(dict.fromkeys(section for section, _ in _INI_KEYS))


#: [mgmt] sample_retention_policies.<global|basic|detailed>.<max age> = <interval>,
#: as RabbitMQ's keys (the age in seconds, or minute, hour, day).
_RETENTION_PREFIX = "sample_retention_policies."
_RETENTION_AGES = {"minute": 60, "hour": 3600, "day": 86400}


def _parse_retention(key: str, raw: str) -> tuple[str, tuple[int, int]]:
    """(policy, (max age, interval)) of one retention key."""
    parts = key[len(_RETENTION_PREFIX) :].split(".")
    if len(parts) != 2 or parts[0] not in ("global", "basic", "detailed"):
        raise ValueError("the key must be sample_retention_policies.<global|basic|detailed>.<age>")
    age_text = parts[1].strip()
    age = _RETENTION_AGES.get(age_text)
    if age is None:
        if not _INT_RE.fullmatch(age_text):
            raise ValueError("the age must be seconds, minute, hour or day")
        age = int(age_text)
    return parts[0], (age, _parse_int(raw))


def _ini_error(where: str, section: str, key: str, raw: str, why: str) -> str:
    return f"{where}: [{section}] {key} = {raw!r}: {why}"


def _unknown_section(section: str) -> str:
    hint = RENAMED.get((section, None))
    if hint is None:
        near = suggestion(section, _INI_SECTIONS)
        hint = (
            f"did you mean [{near}]?"
            if near
            else "known sections: " + ", ".join(f"[{s}]" for s in sorted(_INI_SECTIONS))
        )
    return f"unknown section [{section}] ({hint})"


def _unknown_key(section: str, key: str) -> str:
    hint = RENAMED.get((section, key))
    if hint is None:
        here = [k for s, k in _INI_KEYS if s == section]
        if section == "mgmt":
            here.append(_RETENTION_PREFIX + "<policy>.<age>")
        near = suggestion(key, here)
        elsewhere = sorted(s for s, k in _INI_KEYS if k == key)
        if near is not None:
            hint = f"did you mean {near}?"
        elif elsewhere:
            hint = f"did you mean [{elsewhere[0]}] {key}?"
        else:
            hint = f"known keys in [{section}]: " + ", ".join(sorted(here))
    return f"unknown setting [{section}] {key} ({hint})"


def _malformed(name: str, text: str, exc: configparser.Error) -> str:
    """configparser's errors as ``file:line: malformed config file: what``."""
    if isinstance(exc, configparser.MissingSectionHeaderError):
        line = exc.line.strip()
        return f"{name}:{exc.lineno}: malformed config file: {line!r} is before any [section]"
    if isinstance(exc, configparser.DuplicateOptionError):
        return (
            f"{name}:{exc.lineno}: malformed config file: [{exc.section}] {exc.option} is set twice"
        )
    if isinstance(exc, configparser.DuplicateSectionError):
        return f"{name}:{exc.lineno}: malformed config file: [{exc.section}] appears twice"
    if isinstance(exc, configparser.ParsingError) and exc.errors:
        lineno = exc.errors[0][0]
        line = text.splitlines()[lineno - 1].strip()
        return f"{name}:{lineno}: malformed config file: not a [section] or key = value: {line!r}"
    return f"{name}: malformed config file: {exc}"
