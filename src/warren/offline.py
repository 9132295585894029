"""What the commands that work on a stopped broker's data directory share
(`warren users`, `warren orphans`): the configuration from -c/-D, the same
check of the data directory `warren` makes before it starts, and the data
directory's lock, which a running broker holds."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import sys
from collections.abc import Iterator
from pathlib import Path

from warren.cli import data_dir_problem
from warren.config import Config, ConfigError

__all__ = ["add_location_arguments", "config_from", "data_dir_lock", "usable_data_dir"]


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


def usable_data_dir(config: Config, prog: str, *, create: bool) -> Path | None:
    """The data directory, resolved; None (one line printed, as `warren` prints it)
    when this user cannot use it: a file, not writable, not creatable. A missing
    directory is made when ``create`` (a new broker's users), else refused."""
    given = config.data_dir
    if not create and not (Path(given).exists() or Path(given).is_symlink()):
        problem: str | None = f"data dir {given} does not exist"
    else:
        problem = data_dir_problem(given)
    if problem is not None:
        print(f"{prog}: {problem}", file=sys.stderr)
        return None
    root = Path(given).resolve()
    if create:
        root.mkdir(parents=True, exist_ok=True)
    return root


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
