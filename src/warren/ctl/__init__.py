"""``warren ctl`` (also ``warrenctl``): an operator's command line over the
RabbitMQ-compatible management HTTP API of Warren (or RabbitMQ, LavinMQ).

Modules:

* ``main``      the argument parser, global options and exit statuses; main()
* ``commands``  one handler per command (status, vhosts, users, queues, ...)
* ``client``    a blocking HTTP client on urllib; errors carry the exit status
* ``output``    aligned tables and key/value blocks

Standard library only, and nothing here imports the broker: the tool starts
fast and talks to any broker over HTTP. docs/ctl.md describes the commands.
"""
