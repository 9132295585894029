"""The ``peer`` fixture: a scenario whose reference is RabbitMQ 3.10's
rabbitmq_amqp1_0 plugin runs against Warren and against that plugin
(amqp1_peers.py)."""

from __future__ import annotations

import pytest
from amqp1_peers import RABBITMQ_310, WARREN, Peer


@pytest.fixture(
    params=[
        WARREN,
        # RabbitMQ's run tests no Warren code: once, in make test's compiled pass.
        pytest.param(RABBITMQ_310, marks=pytest.mark.passes("compiled")),
    ]
)
def peer(request: pytest.FixtureRequest) -> Peer:
    """Warren (a fresh broker per test) or RabbitMQ 3.10 with rabbitmq_amqp1_0
    (one node per test process: ``rabbitmq_amqp1``, tests/conftest.py)."""
    if request.param == WARREN:
        broker = request.getfixturevalue("broker")
        return Peer(WARREN, broker.port, broker.url, warren=broker)
    rabbitmq = request.getfixturevalue("rabbitmq_amqp1")
    return Peer(RABBITMQ_310, rabbitmq.port, rabbitmq.url)
