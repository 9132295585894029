"""A channel's exchange and queue class methods: declare, delete, bind, unbind, purge.

Each checks RabbitMQ's permissions in RabbitMQ's order, then asks the vhost;
channel.py's dispatch table calls them with the channel. As RabbitMQ, they take
queue and exchange names without CR and LF (queue.purge and the basic class
keep them); that every short string is UTF-8 the connection has checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from warren.amqp import spec
from warren.core.errors import AccessRefused, NotFound
from warren.core.names import strip_cr_lf
from warren.core.users import CONFIGURE, READ, WRITE, check_routing_argument
from warren.core.vhost_routing import REPLY_TO, REPLY_TO_PREFIX

if TYPE_CHECKING:
    from warren.amqp.channel import Channel


# -- exchange class -------------------------------------------------------------------
def exchange_declare(ch: Channel, method: spec.ExchangeDeclare) -> None:
    assert ch.vhost is not None
    name = strip_cr_lf(method.exchange)
    if not method.passive:
        ch.check(CONFIGURE, "exchange", name)
        if name not in ch.vhost.exchanges:
            check_routing_argument(ch.check, "exchange", name, method.arguments)
    ch.vhost.declare_exchange(
        name,
        method.type,
        durable=method.durable,
        auto_delete=method.auto_delete,
        internal=method.internal,
        arguments=method.arguments,
        passive=method.passive,
    )
    if not method.nowait:
        ch.reply(spec.ExchangeDeclareOk())


def exchange_delete(ch: Channel, method: spec.ExchangeDelete) -> None:
    assert ch.vhost is not None
    name = strip_cr_lf(method.exchange)
    ch.check(CONFIGURE, "exchange", name)
    ch.vhost.delete_exchange(name, if_unused=method.if_unused)
    ch.publishing.forget_exchange(name)
    if not method.nowait:
        ch.reply(spec.ExchangeDeleteOk())


def exchange_bind(ch: Channel, method: spec.ExchangeBind) -> None:
    assert ch.vhost is not None
    source, destination = strip_cr_lf(method.source), strip_cr_lf(method.destination)
    ch.check(WRITE, "exchange", destination)
    if "" in (destination, source):
        raise AccessRefused("operation not permitted on the default exchange")
    ch.check(READ, "exchange", source)
    ch.check_topic(ch.vhost.exchanges.get(source), method.routing_key, READ)
    # As RabbitMQ: when both are missing, the source is the one named.
    src = ch.vhost.get_exchange(source)
    dest = ch.vhost.get_exchange(destination)
    ch.vhost.bind(src, dest, method.routing_key, method.arguments)
    if not method.nowait:
        ch.reply(spec.ExchangeBindOk())


def exchange_unbind(ch: Channel, method: spec.ExchangeUnbind) -> None:
    assert ch.vhost is not None
    source, destination = strip_cr_lf(method.source), strip_cr_lf(method.destination)
    ch.check(WRITE, "exchange", destination)
    ch.check(READ, "exchange", source)
    # Like RabbitMQ, unbinding from or to a missing exchange succeeds.
    dest = ch.vhost.exchanges.get(destination)
    src = ch.vhost.exchanges.get(source)
    if ch.vhost.default_exchange in (src, dest):
        raise AccessRefused("operation not permitted on the default exchange")
    ch.check_topic(src, method.routing_key, READ)
    if dest is not None and src is not None:
        ch.vhost.unbind(src, dest, method.routing_key, method.arguments)
    if not method.nowait:
        ch.reply(spec.ExchangeUnbindOk())


# -- queue class ----------------------------------------------------------------------
def queue_declare(ch: Channel, method: spec.QueueDeclare) -> None:
    assert ch.vhost is not None
    name = strip_cr_lf(method.queue)
    if name.startswith(REPLY_TO):
        # As RabbitMQ: the pseudo-queue (passive or not) and the address of a live
        # reply consumer "exist" with one consumer; other such names do not.
        token = name[len(REPLY_TO_PREFIX) :] if name.startswith(REPLY_TO_PREFIX) else None
        if name != REPLY_TO and token not in ch.vhost.reply_targets:
            raise NotFound(f"no queue '{name}' in vhost '{ch.vhost.name}'")
        ch.last_queue = name
        if not method.nowait:
            ch.reply(spec.QueueDeclareOk(queue=name, message_count=0, consumer_count=1))
        return
    if name and not method.passive:
        ch.check(CONFIGURE, "queue", name)
    if not method.passive and (not name or name not in ch.vhost.queues):
        check_routing_argument(ch.check, "queue", name, method.arguments)
    arguments = method.arguments
    if ch.vhost.default_queue_type is not None and not method.passive:
        arguments = ch.vhost.metadata.with_default_type(
            method.durable, method.exclusive, method.auto_delete, arguments or {}
        )
    q = ch.vhost.declare_queue(
        name,
        durable=method.durable,
        exclusive=method.exclusive,
        auto_delete=method.auto_delete,
        arguments=arguments,
        passive=method.passive,
        owner=ch.connection,
    )
    ch.last_queue = q.name
    if not method.nowait:
        ch.reply(
            spec.QueueDeclareOk(
                queue=q.name, message_count=q.message_count, consumer_count=q.consumer_count
            )
        )


def queue_bind(ch: Channel, method: spec.QueueBind) -> None:
    assert ch.vhost is not None
    queue, exchange = strip_cr_lf(method.queue), strip_cr_lf(method.exchange)
    qname = ch.queue_name(queue)
    routing_key = method.routing_key
    if not queue and not routing_key:
        routing_key = qname
    ch.check(WRITE, "queue", qname)
    if not exchange:
        raise AccessRefused("operation not permitted on the default exchange")
    ch.check(READ, "exchange", exchange)
    # Before the queue's existence, as RabbitMQ (a missing exchange: 404 below).
    ch.check_topic(ch.vhost.exchanges.get(exchange), routing_key, READ)
    ch.vhost.bind_queue(exchange, qname, routing_key, method.arguments, ch.connection)
    if not method.nowait:
        ch.reply(spec.QueueBindOk())


def queue_unbind(ch: Channel, method: spec.QueueUnbind) -> None:
    assert ch.vhost is not None
    queue, exchange = strip_cr_lf(method.queue), strip_cr_lf(method.exchange)
    qname = ch.queue_name(queue)
    routing_key = method.routing_key
    if not queue and not routing_key:
        routing_key = qname
    ch.check(WRITE, "queue", qname)
    ch.check(READ, "exchange", exchange)
    # Like RabbitMQ, unbinding a missing queue or exchange succeeds (aio-pika's
    # RPC.close unbinds its auto-deleted reply queue and relies on this).
    ex = ch.vhost.exchanges.get(exchange)
    if ex is ch.vhost.default_exchange:
        raise AccessRefused("operation not permitted on the default exchange")
    ch.check_topic(ex, routing_key, READ)
    q = ch.vhost.queues.get(qname)
    # An exclusive queue of another connection is refused (405) only when the
    # binding exists: removing a missing one succeeds, as in RabbitMQ.
    if (
        q is not None
        and ex is not None
        and ex.find_binding(q, routing_key, method.arguments) is not None
    ):
        ch.vhost.get_queue(qname, ch.connection)
        ch.vhost.unbind(ex, q, routing_key, method.arguments)
    ch.reply(spec.QueueUnbindOk())


def queue_purge(ch: Channel, method: spec.QueuePurge) -> None:
    q = ch.get_queue(method.queue)
    ch.check(READ, "queue", q.name)
    count = q.purge()
    if not method.nowait:
        ch.reply(spec.QueuePurgeOk(message_count=count))


def queue_delete(ch: Channel, method: spec.QueueDelete) -> None:
    assert ch.vhost is not None
    name = ch.queue_name(strip_cr_lf(method.queue))
    ch.check(CONFIGURE, "queue", name)
    count = ch.vhost.delete_queue(
        name, if_unused=method.if_unused, if_empty=method.if_empty, owner=ch.connection
    )
    if not method.nowait:
        ch.reply(spec.QueueDeleteOk(message_count=count))
