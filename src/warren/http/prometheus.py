"""The Prometheus endpoints, and their own listener ([prometheus], port 15692).

RabbitMQ's ``rabbitmq_prometheus`` plugin serves ``/metrics``,
``/metrics/per-object`` and ``/metrics/detailed`` on a port of its own
(``prometheus.tcp.port``), without authentication; Warren serves them there
and on the management port. The broker is read on its loop in slices and
the text written and sent in chunks, the loop given back after each
(warren/metrics): a scrape of 10,000 queues never holds clients up for more
than a few milliseconds (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web

from warren import metrics
from warren.http.bound_sites import BoundSites
from warren.proxy_accept import listener_proxy

if TYPE_CHECKING:
    from warren.node import Node

__all__ = ["MetricsEndpoints", "PrometheusListener"]

log = logging.getLogger("warren.http")


class MetricsEndpoints:
    """The three metrics routes of one aiohttp application."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/metrics", self.aggregated)
        app.router.add_get("/metrics/per-object", self.per_object)
        app.router.add_get("/metrics/detailed", self.detailed)

    async def aggregated(self, request: web.Request) -> web.StreamResponse:
        """Summed, unless [prometheus] return_per_object_metrics says otherwise."""
        snap = await metrics.snapshot(self.node)
        per_object = self.node.config.prometheus_return_per_object_metrics
        return await _respond(request, metrics.render_chunks(snap, per_object))

    async def per_object(self, request: web.Request) -> web.StreamResponse:
        snap = await metrics.snapshot(self.node)
        return await _respond(request, metrics.render_chunks(snap, True))

    async def detailed(self, request: web.Request) -> web.StreamResponse:
        """``family`` and ``vhost`` may each be given several times (RabbitMQ's
        query); unknown families are ignored, as RabbitMQ does."""
        families = set(request.query.getall("family", []))
        vhosts = request.query.getall("vhost", []) or None
        snap = await metrics.snapshot(self.node)
        return await _respond(request, metrics.detailed_chunks(snap, families, vhosts))


async def _respond(request: web.Request, chunks: Iterator[str]) -> web.StreamResponse:
    """Send the chunks as they are made (chunked transfer encoding), giving the
    loop back after each: rendering on the loop in steps of a millisecond or
    so, rather than in a thread that would take the GIL from it for its
    switch interval at a time."""
    response = web.StreamResponse(headers={"Content-Type": metrics.CONTENT_TYPE})
    await response.prepare(request)
    for chunk in chunks:
        if chunk:
            await response.write(chunk.encode("utf-8"))
        await asyncio.sleep(0)
    await response.write_eof()
    return response


class PrometheusListener:
    """The ``http/prometheus`` listener (warren.node.Listener): the metrics endpoints
    on bind:port (and tls_port over HTTPS), nothing else."""

    name = "http/prometheus"

    def __init__(self, bind: str, port: int, tls_port: int = -1) -> None:
        self.bind = bind
        self.requested_port = port
        self.requested_tls_port = tls_port
        #: The HTTPS port bound (0: none).
        self.tls_port = 0
        self._port = 0
        #: Bound and listening, not yet served (start() serves them).
        self._sites = BoundSites()
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        return self._port

    def bind_ports(self, node: Node) -> None:
        """Bind and listen on the metrics port (and its HTTPS port), answering
        nothing yet: BindError when a port is taken."""
        if self._sites:
            return
        try:
            self._port = self._sites.bind("Prometheus", self.bind, self.requested_port)
            if self.requested_tls_port >= 0:
                tls = node.tls.context("the Prometheus HTTPS port")
                self.tls_port = self._sites.bind(
                    "Prometheus HTTPS", self.bind, self.requested_tls_port, tls
                )
        except BaseException:
            self._sites.close()
            raise

    async def start(self, node: Node) -> None:
        """Serve the metrics on the ports bind_ports() bound (binding them first if not)."""
        self.bind_ports(node)
        app = web.Application()
        MetricsEndpoints(node).add_routes(app)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        try:
            await runner.setup()
            await self._sites.start(runner, listener_proxy(node.config, node.clock, "prometheus"))
        except BaseException:
            self._sites.close()
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("listening on HTTP (Prometheus metrics) %s:%s", self.bind, self._port)
        if self.tls_port:
            log.info("listening on HTTPS (Prometheus metrics) %s:%s", self.bind, self.tls_port)

    async def stop(self) -> None:
        self._sites.close()
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        await runner.cleanup()

