"""Broker configuration: defaults, LavinMQ-style INI files and validation.

The INI layout deliberately reuses LavinMQ's section and key names
(``[main] data_dir``, ``[amqp] port`` ...) so an existing LavinMQ config file
works unchanged. An unknown section or key stops the start with the file,
line and nearest known name (a typo must not leave the broker on defaults);
LavinMQ settings of features Warren does not have are warned about and
ignored, so a LavinMQ file still starts the broker (config_names.py). The
file is read by config_ini.py; what each setting accepts is config_checks.py's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from warren import config_mgmt_oauth
from warren.config_checks import LOG_LEVELS, check_field, normalize_log_level
from warren.config_coap import CoAPSettings, coap_problem
from warren.config_edges import EdgeSettings
from warren.config_ini import ConfigError, ini_sections, read_ini
from warren.config_oauth2 import OAuth2Extra
from warren.sample_retention import DEFAULT_POLICIES, Retention

__all__ = [
    "Config",
    "ConfigError",
    "LOG_LEVELS",
    "check_field",
    "ini_sections",
    "normalize_log_level",
]


#: RabbitMQ's stream protocol TLS port: stream_tls_port's when tls_cert/tls_key are set.
STREAM_TLS_PORT = 5551


@dataclass
class Config(config_mgmt_oauth.MgmtOAuthSettings, EdgeSettings, CoAPSettings):
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
        sees a half-applied file (config_ini.read_ini reads and checks it
        all first). Returns where each field set came from (``file:line``),
        for validate().
        """
        updates, origin = read_ini(path)
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
        if (coap := coap_problem(self)) is not None:
            raise fail(*coap)

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
