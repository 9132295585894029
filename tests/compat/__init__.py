"""Compatibility suite: Warren must look like RabbitMQ to clients (see tools/compat_probe)."""
