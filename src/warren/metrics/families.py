"""The catalogue: every family Warren exports, with RabbitMQ's name, type and help.

Grouped as RabbitMQ's ``rabbitmq_prometheus`` plugin groups them (3.13): the
core collector's groups are the ``family`` names ``/metrics/detailed`` takes
(``queue_coarse_metrics``, ``channel_metrics``, ...). Families about the Erlang
runtime (``erlang_*`` but the node's uptime, ``*_process_reductions_total``,
``queue_process_memory_bytes``) and Raft internals (``ra_metrics``) have no
Warren counterpart and are left out (docs/metrics.md).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CLUSTER_GROUPS",
    "CORE_GROUPS",
    "Family",
    "GLOBAL",
    "GLOBAL_STREAM_ERRORS",
    "TOTALS",
]

#: (name without the rabbitmq_ prefix, Prometheus type, help)
Family = tuple[str, str, str]

#: The core collector's groups, in RabbitMQ's order.
CORE_GROUPS: Final[dict[str, tuple[Family, ...]]] = {
    "connection_churn_metrics": (
        ("connections_opened_total", "counter", "Total number of connections opened"),
        ("connections_closed_total", "counter", "Total number of connections closed or terminated"),
        ("channels_opened_total", "counter", "Total number of channels opened"),
        ("channels_closed_total", "counter", "Total number of channels closed"),
        ("queues_declared_total", "counter", "Total number of queues declared"),
        ("queues_created_total", "counter", "Total number of queues created"),
        ("queues_deleted_total", "counter", "Total number of queues deleted"),
    ),
    "node_coarse_metrics": (
        ("process_open_fds", "gauge", "Open file descriptors"),
        ("process_open_tcp_sockets", "gauge", "Open TCP sockets"),
        ("process_resident_memory_bytes", "gauge", "Memory used in bytes"),
        ("disk_space_available_bytes", "gauge", "Disk space available in bytes"),
    ),
    "node_metrics": (
        ("process_max_fds", "gauge", "Open file descriptors limit"),
        ("process_max_tcp_sockets", "gauge", "Open TCP sockets limit"),
        ("resident_memory_limit_bytes", "gauge", "Memory high watermark in bytes"),
        ("disk_space_available_limit_bytes", "gauge", "Free disk space low watermark in bytes"),
        # The one erlang_* family kept: the node's uptime (RabbitMQ 4.1's
        # RabbitMQ-Overview shows it in its node table).
        ("erlang_uptime_seconds", "gauge", "Node uptime"),
    ),
    "node_persister_metrics": (
        ("io_read_ops_total", "counter", "Total number of I/O read operations"),
        ("io_read_bytes_total", "counter", "Total number of I/O bytes read"),
        ("io_write_ops_total", "counter", "Total number of I/O write operations"),
        ("io_write_bytes_total", "counter", "Total number of I/O bytes written"),
        ("io_sync_ops_total", "counter", "Total number of I/O sync operations"),
        ("io_seek_ops_total", "counter", "Total number of I/O seek operations"),
        ("io_reopen_ops_total", "counter", "Total number of times files have been reopened"),
        ("schema_db_ram_tx_total", "counter", "Total number of Schema DB memory transactions"),
        ("schema_db_disk_tx_total", "counter", "Total number of Schema DB disk transactions"),
        ("msg_store_read_total", "counter", "Total number of Message Store read operations"),
        ("msg_store_write_total", "counter", "Total number of Message Store write operations"),
        ("queue_index_read_ops_total", "counter", "Total number of Queue Index read operations"),
        ("queue_index_write_ops_total", "counter", "Total number of Queue Index write operations"),
        ("io_read_time_seconds_total", "counter", "Total I/O read time"),
        ("io_write_time_seconds_total", "counter", "Total I/O write time"),
        ("io_sync_time_seconds_total", "counter", "Total I/O sync time"),
        ("io_seek_time_seconds_total", "counter", "Total I/O seek time"),
    ),
    "auth_attempt_metrics": (
        ("auth_attempts_total", "counter", "Total number of authentication attempts"),
        ("auth_attempts_succeeded_total", "counter", "Total number of successful authentication attempts"),
        ("auth_attempts_failed_total", "counter", "Total number of failed authentication attempts"),
    ),
    "auth_attempt_detailed_metrics": (
        ("auth_attempts_detailed_total", "counter", "Total number of authentication attempts with source info"),
        ("auth_attempts_detailed_succeeded_total", "counter", "Total number of successful authentication attempts with source info"),
        ("auth_attempts_detailed_failed_total", "counter", "Total number of failed authentication attempts with source info"),
    ),
    "queue_coarse_metrics": (
        ("queue_messages_ready", "gauge", "Messages ready to be delivered to consumers"),
        ("queue_messages_unacked", "gauge", "Messages delivered to consumers but not yet acknowledged"),
        ("queue_messages", "gauge", "Sum of ready and unacknowledged messages - total queue depth"),
    ),
    "queue_consumer_count": (
        ("queue_consumers", "gauge", "Consumers on a queue"),
    ),
    "queue_metrics": (
        ("queue_consumers", "gauge", "Consumers on a queue"),
        ("queue_consumer_capacity", "gauge", "Consumer capacity"),
        ("queue_consumer_utilisation", "gauge", "Same as consumer capacity"),
        ("queue_messages_ram", "gauge", "Ready and unacknowledged messages stored in memory"),
        ("queue_messages_ram_bytes", "gauge", "Size of ready and unacknowledged messages stored in memory"),
        ("queue_messages_ready_ram", "gauge", "Ready messages stored in memory"),
        ("queue_messages_unacked_ram", "gauge", "Unacknowledged messages stored in memory"),
        ("queue_messages_persistent", "gauge", "Persistent messages"),
        ("queue_messages_persistent_bytes", "gauge", "Size in bytes of persistent messages"),
        ("queue_messages_bytes", "gauge", "Size in bytes of ready and unacknowledged messages"),
        ("queue_messages_ready_bytes", "gauge", "Size in bytes of ready messages"),
        ("queue_messages_unacked_bytes", "gauge", "Size in bytes of all unacknowledged messages"),
        ("queue_messages_paged_out", "gauge", "Messages paged out to disk"),
        ("queue_messages_paged_out_bytes", "gauge", "Size in bytes of messages paged out to disk"),
        ("queue_head_message_timestamp", "gauge", "Timestamp of the first message in the queue, if any"),
        ("queue_disk_reads_total", "counter", "Total number of times queue read messages from disk"),
        ("queue_disk_writes_total", "counter", "Total number of times queue wrote messages to disk"),
        ("stream_segments", "counter", "Total number of stream segment files"),
    ),
    "channel_metrics": (
        ("channel_consumers", "gauge", "Consumers on a channel"),
        ("channel_messages_unacked", "gauge", "Delivered but not yet acknowledged messages"),
        ("channel_messages_unconfirmed", "gauge", "Published but not yet confirmed messages"),
        ("channel_messages_uncommitted", "gauge", "Messages received in a transaction but not yet committed"),
        ("channel_acks_uncommitted", "gauge", "Message acknowledgements in a transaction not yet committed"),
        ("consumer_prefetch", "gauge", "Limit of unacknowledged messages for each consumer"),
        ("channel_prefetch", "gauge", "Total limit of unacknowledged messages for all consumers on a channel"),
    ),
    "channel_exchange_metrics": (
        ("channel_messages_published_total", "counter", "Total number of messages published into an exchange on a channel"),
        ("channel_messages_confirmed_total", "counter", "Total number of messages published into an exchange and confirmed on the channel"),
        ("channel_messages_unroutable_returned_total", "counter", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable"),
        ("channel_messages_unroutable_dropped_total", "counter", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable"),
    ),
    "channel_queue_metrics": (
        ("channel_get_ack_total", "counter", "Total number of messages fetched with basic.get in manual acknowledgement mode"),
        ("channel_get_total", "counter", "Total number of messages fetched with basic.get in automatic acknowledgement mode"),
        ("channel_messages_delivered_ack_total", "counter", "Total number of messages delivered to consumers in manual acknowledgement mode"),
        ("channel_messages_delivered_total", "counter", "Total number of messages delivered to consumers in automatic acknowledgement mode"),
        ("channel_messages_redelivered_total", "counter", "Total number of messages redelivered to consumers"),
        ("channel_messages_acked_total", "counter", "Total number of messages acknowledged by consumers"),
        ("channel_get_empty_total", "counter", "Total number of times basic.get operations fetched no message"),
    ),
    "connection_coarse_metrics": (
        ("connection_incoming_bytes_total", "counter", "Total number of bytes received on a connection"),
        ("connection_outgoing_bytes_total", "counter", "Total number of bytes sent on a connection"),
    ),
    "connection_metrics": (
        ("connection_incoming_packets_total", "counter", "Total number of packets received on a connection"),
        ("connection_outgoing_packets_total", "counter", "Total number of packets sent on a connection"),
        ("connection_pending_packets", "gauge", "Number of packets waiting to be sent on a connection"),
        ("connection_channels", "gauge", "Channels on a connection"),
    ),
    "channel_queue_exchange_metrics": (
        ("queue_messages_published_total", "counter", "Total number of messages published to queues"),
    ),
}  # fmt: skip

#: Only on /metrics/detailed, prefixed rabbitmq_cluster_.
CLUSTER_GROUPS: Final[dict[str, tuple[Family, ...]]] = {
    "vhost_status": (("vhost_status", "gauge", "Whether a given vhost is running"),),
    "exchange_bindings": (
        ("exchange_bindings", "gauge", "Number of bindings for an exchange. This value is cluster-wide."),
    ),
    "exchange_names": (
        ("exchange_name", "gauge", "Enumerates exchanges without any additional info. This value is cluster-wide. A cheaper alternative to `exchange_bindings`"),
    ),
}  # fmt: skip

#: Object counts on /metrics and /metrics/per-object.
TOTALS: Final[tuple[Family, ...]] = (
    ("connections", "gauge", "Connections currently open"),
    ("channels", "gauge", "Channels currently open"),
    ("consumers", "gauge", "Consumers currently connected"),
    ("queues", "gauge", "Queues available"),
)

#: rabbitmq_global_*: (name, type, help, labels: "protocol", "protocol,queue_type"
#: or "queue_type,dead_letter_strategy").
GLOBAL: Final[tuple[tuple[str, str, str, str], ...]] = (
    ("messages_received_total", "counter", "Total number of messages received from publishers", "p"),
    ("messages_received_confirm_total", "counter", "Total number of messages received from publishers expecting confirmations", "p"),
    ("messages_routed_total", "counter", "Total number of messages routed to queues or streams", "p"),
    ("messages_unroutable_dropped_total", "counter", "Total number of messages published as non-mandatory into an exchange and dropped as unroutable", "p"),
    ("messages_unroutable_returned_total", "counter", "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable", "p"),
    ("messages_confirmed_total", "counter", "Total number of messages confirmed to publishers", "p"),
    ("publishers", "gauge", "Current number of publishers", "p"),
    ("consumers", "gauge", "Current number of consumers", "p"),
    ("messages_delivered_total", "counter", "Total number of messages delivered to consumers", "pq"),
    ("messages_delivered_consume_manual_ack_total", "counter", "Total number of messages delivered to consumers using basic.consume with manual acknowledgment", "pq"),
    ("messages_delivered_consume_auto_ack_total", "counter", "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment", "pq"),
    ("messages_delivered_get_manual_ack_total", "counter", "Total number of messages delivered to consumers using basic.get with manual acknowledgment", "pq"),
    ("messages_delivered_get_auto_ack_total", "counter", "Total number of messages delivered to consumers using basic.get with automatic acknowledgment", "pq"),
    ("messages_get_empty_total", "counter", "Total number of times basic.get operations fetched no message", "pq"),
    ("messages_redelivered_total", "counter", "Total number of messages redelivered to consumers", "pq"),
    ("messages_acknowledged_total", "counter", "Total number of messages acknowledged by consumers", "pq"),
    ("messages_dead_lettered_confirmed_total", "counter", "Total number of messages dead-lettered and confirmed by target queues", "qd"),
    ("messages_dead_lettered_delivery_limit_total", "counter", "Total number of messages dead-lettered due to delivery-limit exceeded", "qd"),
    ("messages_dead_lettered_expired_total", "counter", "Total number of messages dead-lettered due to message TTL exceeded", "qd"),
    ("messages_dead_lettered_maxlen_total", "counter", "Total number of messages dead-lettered due to overflow drop-head or reject-publish-dlx", "qd"),
    ("messages_dead_lettered_rejected_total", "counter", "Total number of messages dead-lettered due to basic.reject or basic.nack", "qd"),
)  # fmt: skip

#: The stream plugin's error counters (label protocol="stream"): name suffix, help.
GLOBAL_STREAM_ERRORS: Final[tuple[tuple[str, str], ...]] = tuple(
    (f"stream_error_{key}_total", f"Total number of commands {verb} {what}")
    for key, verb, what in (
        ("stream_does_not_exist", "rejected with", "stream does not exist error"),
        ("subscription_id_already_exists", "failed with", "subscription id already exists"),
        ("subscription_id_does_not_exist", "failed with", "subscription id does not exist"),
        ("stream_already_exists", "failed with", "stream already exists"),
        ("stream_not_available", "failed with", "stream not available"),
        ("sasl_mechanism_not_supported", "failed with", "sasl mechanism not supported"),
        ("authentication_failure", "failed with", "authentication failure"),
        ("sasl_error", "failed with", "sasl error"),
        ("sasl_challenge", "failed with", "sasl challenge"),
        (
            "sasl_authentication_failure_loopback",
            "failed with",
            "sasl authentication failure loopback",
        ),
        ("vhost_access_failure", "failed with", "vhost access failure"),
        ("unknown_frame", "failed with", "unknown frame"),
        ("frame_too_large", "failed with", "frame too large"),
        ("internal_error", "failed with", "internal error"),
        ("access_refused", "failed with", "access refused"),
        ("precondition_failed", "failed with", "precondition failed"),
        ("publisher_does_not_exist", "failed with", "publisher does not exist"),
    )
)
