"""Persistence: vhost definitions and the disk-backed per-queue message segment store."""
