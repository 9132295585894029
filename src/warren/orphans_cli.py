"""``warren orphans``: queue and exchange directories no definition claims.

A broker refuses to start over such directories (store/orphans.py): their
definitions were lost, their messages were not. On the stopped broker's data
directory (under its lock) this command lists them, restores their
definitions from the ``definition.json`` each keeps, so the next start serves
them again, or deletes them once they are known to be unwanted:

    warren orphans -D /var/lib/warren list
    warren orphans -D /var/lib/warren restore            # every one it can
    warren orphans -D /var/lib/warren delete --vhost / old-queue
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence

from warren.offline import add_location_arguments, config_from, data_dir_lock, usable_data_dir
from warren.store import orphans as orphans_mod
from warren.store.damage import DamagedFile
from warren.store.definitions import DefinitionsLog
from warren.store.orphans import Orphan

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="warren orphans",
        description="List, restore or delete the queue and exchange directories of a "
        "stopped broker's data directory that no definition claims.",
    )
    add_location_arguments(p)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="list them: vhost, kind, name, bytes, directory")
    for name, what in (
        ("restore", "write their definitions back (from definition.json)"),
        ("delete", "delete them, messages and all"),
    ):
        c = sub.add_parser(name, help=what)
        c.add_argument("--vhost", help="only this vhost's")
        c.add_argument(
            "names",
            nargs="*",
            metavar="NAME",
            help="queue or exchange names (restore: default all; delete: required)",
        )
    return p


def _select(found: list[Orphan], vhost: str | None, names: list[str]) -> list[Orphan]:
    return [
        o for o in found if (vhost is None or o.vhost == vhost) and (not names or o.name in names)
    ]


def _restore(orphan: Orphan) -> str:
    if orphan.record is None:
        return (
            f"cannot restore {orphan.describe()}: it keeps no definition; start with "
            "damaged_metadata = set-aside and declare it again with its name"
        )
    log = DefinitionsLog(orphan.path.parent.parent / "definitions.log")
    try:
        log.put(orphan.record["key"], orphan.record["value"])
    finally:
        log.close()
    return f"restored {orphan.describe()}"


def main(argv: Sequence[str] | None = None) -> int:
    """0: done; 1: refused (a running broker, damage, nothing to act on); 2: usage."""
    args = build_parser().parse_args(argv)
    config = config_from(args, "warren orphans")
    if config is None:
        return 2
    root = usable_data_dir(config, "warren orphans", create=False)
    if root is None:
        return 1
    with data_dir_lock(root) as locked:
        if not locked:
            print(f"warren orphans: a broker runs on {root}: stop it first", file=sys.stderr)
            return 1
        found = orphans_mod.find(root)
        if args.command == "list":
            for o in found:
                print(f"{o.vhost}\t{o.kind}\t{o.name or '?'}\t{o.data_bytes}\t{o.path}")
            if not found:
                print("no orphans")
            return 0
        if args.command == "delete" and not args.names:
            print("warren orphans: delete needs the names to delete", file=sys.stderr)
            return 2
        chosen = _select(found, args.vhost, args.names)
        if not chosen:
            print("warren orphans: no such orphan", file=sys.stderr)
            return 1
        status = 0
        for orphan in chosen:
            if args.command == "delete":
                shutil.rmtree(orphan.path)
                print(f"deleted {orphan.describe()}")
                continue
            try:
                message = _restore(orphan)
            except (DamagedFile, OSError) as exc:
                message, status = f"cannot restore {orphan.describe()}: {exc}", 1
            if orphan.record is None:
                status = 1
            print(message)
    return status
