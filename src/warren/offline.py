"""What the commands that work on a stopped broker's data directory share
(`warren users`, `warren orphans`): the configuration from -c/-D, and the data
directory's lock, which a running broker holds."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import sys
from collections.abc import Iterator
from pathlib import Path

from warren.config import Config, ConfigError

__all__ = ["add_location_arguments", "config_from", "data_dir_lock"]


def add_location_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", metavar="FILE", help="the broker's INI file")
    p.add_argument("-D", "--data-dir", metavar="DIR", help="the data directory ([main] data_dir)")


def config_from(args: argparse.Namespace, prog: str) -> Config | None:
    """The configuration -c and -D name; None (the error printed) when it is bad."""
    try:
        config = Config.from_ini(args.config) if args.config else Config()
        if args.data_dir:
            config.data_dir = args.data_dir
        config.validate()
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    return config


@contextlib.contextmanager
def data_dir_lock(root: Path) -> Iterator[bool]:
    """Hold the data directory's lock while the block runs; yields False (and
    holds nothing) when a broker holds it."""
    with (root / ".lock").open("ab") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
