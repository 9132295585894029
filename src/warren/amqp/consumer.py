"""An AMQP consumer: the core's Consumer, delivering as basic.deliver frames."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warren.amqp import spec
from warren.amqp.frames import content_frames, method_frame
from warren.core.consumer import Consumer
from warren.core.message import Message

if TYPE_CHECKING:
    from warren.amqp.channel import Channel
    from warren.core.queue import Queue


class AMQPConsumer(Consumer):
    __slots__ = ("channel", "prefetch_count", "prefetch_size", "unacked_count", "unacked_bytes")

    def __init__(
        self,
        channel: Channel,
        tag: str,
        queue: Queue,
        no_ack: bool,
        exclusive: bool,
        priority: int,
        arguments: dict[str, Any] | None,
    ) -> None:
        super().__init__(tag, queue, no_ack, exclusive, priority, arguments)
        self.channel = channel
        # Per-consumer limits as RabbitMQ reinterprets basic.qos(global=false).
        self.prefetch_count = channel.consumer_prefetch_count
        self.prefetch_size = channel.consumer_prefetch_size
        self.unacked_count = 0
        self.unacked_bytes = 0

    def can_take(self) -> bool:
        ch = self.channel
        if not ch.flow_active or not ch.connection.writable:
            return False
        if self.no_ack:
            return True
        if self.prefetch_count and self.unacked_count >= self.prefetch_count:
            return False
        if self.prefetch_size and self.unacked_bytes >= self.prefetch_size:
            return False
        return ch.has_global_capacity()

    def deliver(self, seq: int, msg: Message, redelivered: bool) -> None:
        ch = self.channel
        tag = ch.next_delivery_tag()
        if not self.no_ack:
            ch.track_unacked(tag, self.queue, seq, msg, self)
            self.unacked_count += 1
            self.unacked_bytes += len(msg.body)
        conn = ch.connection
        frames = [
            method_frame(
                ch.id,
                spec.BasicDeliver(
                    consumer_tag=self.tag,
                    delivery_tag=tag,
                    redelivered=redelivered,
                    exchange=msg.exchange,
                    routing_key=msg.routing_key,
                ),
            )
        ]
        frames += content_frames(ch.id, msg.properties, msg.body, conn.frame_max)
        conn.send_many(frames)

    def cancelled(self) -> None:
        self.channel.consumer_cancelled_by_server(self)
