"""What Warren does with a file it cannot read: refuse to start, or set it aside.

Damage to metadata (users, vhosts, definitions, MQTT sessions ...) must never
turn into a broker that starts with less than was there: a damaged users file
read as "no users" would re-create the default user, a damaged definitions log
would drop queues and their messages. So by default the broker refuses to
start and names the file (``DamagedFile``); nothing is rewritten. With
``[main] damaged_metadata = set-aside`` it renames the file out of the way
(``set_aside``: ``<name>.damaged-<UTC time>``, next to it, never deleted) and
starts without what it held, saying so in the log.

Message data is different: what is intact is always served, and unreadable
bytes are copied aside (store/segment_damage.py) rather than refused.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from warren.store.sync_files import fsync_directory

log = logging.getLogger("warren.store")

#: [main] damaged_metadata: what a damaged metadata file makes the broker do.
REFUSE = "refuse"
SET_ASIDE = "set-aside"
POLICIES = (REFUSE, SET_ASIDE)


class DamagedFile(Exception):
    """A file the broker needs cannot be read as it was written; the text names
    the file, what is wrong and what the operator can do, and is meant to be
    shown as is (the broker refuses to start with it)."""

    def __init__(self, path: Path, problem: str, remedy: str = "") -> None:
        self.path = path
        self.problem = problem
        text = f"{path}: {problem}"
        if remedy:
            text += f". {remedy}"
        super().__init__(text)


def refusal(path: Path, problem: str) -> DamagedFile:
    """The standard refusal for damaged metadata, with the way out."""
    return DamagedFile(
        path,
        problem,
        "Warren does not start with less than the data directory held: restore the "
        "file from a backup, or start with [main] damaged_metadata = set-aside "
        "(--damaged-metadata set-aside) to keep the damaged file aside and go on "
        "without what it held",
    )


def set_aside(path: Path, problem: str) -> Path:
    """Rename a damaged file next to itself (never delete it), fsync the rename,
    log it loudly; the new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    os.replace(path, target)
    fsync_directory(path.parent)
    log.error("%s is damaged (%s): kept aside as %s; going on without it", path, problem, target)
    return target


def handle(path: Path, problem: str, policy: str) -> Path:
    """Refuse (raise DamagedFile) or set the file aside, as ``policy`` says."""
    if policy != SET_ASIDE:
        raise refusal(path, problem)
    return set_aside(path, problem)
