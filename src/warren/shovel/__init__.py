"""Dynamic shovels (docs/shovels.md): move messages from a queue or exchange to
another exchange or queue, on this broker or another, or to an HTTP endpoint.

Shovels are runtime parameters of the ``shovel`` component, as in RabbitMQ's
shovel plugin: set through the management API
(``PUT /api/parameters/shovel/{vhost}/{name}``), definitions or
``warren ctl``; ``GET /api/shovels`` reports their state. Each shovel is an
AMQP 0-9-1 client (aiormq) of its source and destination brokers.
"""
