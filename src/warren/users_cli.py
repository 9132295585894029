"""``warren users``: users, passwords and permissions of a stopped or running broker.

On a stopped broker the command edits the data directory's users.json itself,
holding the directory's lock while it does (so a broker cannot start half way
through); on a running one (the lock is held) it makes the same change through
the management API, as ``warren ctl`` would, at ``[mgmt] bind:port`` of the
same configuration. So the first administrator of a fresh installation can be
created before the broker ever runs:

    warren users -D /var/lib/warren add admin --tags administrator
    warren users -D /var/lib/warren set-permissions admin / '.*' '.*' '.*'
"""

from __future__ import annotations

import argparse
import getpass
import io
import sys
from collections.abc import Sequence

from warren.config import Config
from warren.core.names import name_problem
from warren.core.users import Permission, UserStore, hash_password
from warren.ctl.context import quoted
from warren.ctl.output import Column, render_table
from warren.offline import add_location_arguments, config_from, data_dir_lock, usable_data_dir
from warren.store.damage import DamagedFile
from warren.store.layout import DataDir
from warren.store.users_file import load_users, save_users

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="warren users",
        description="Add users, change passwords and set permissions, on a stopped broker "
        "(users.json in the data directory) or a running one (through its management API).",
    )
    add_location_arguments(p)
    p.add_argument(
        "-u", "--user", default="guest", help="for a running broker: the API user (default guest)"
    )
    p.add_argument("--password", default="guest", help="for a running broker: its password")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="list users, their tags and vhosts")
    for name, what in (
        ("add", "create (or replace) a user"),
        ("change-password", "set a password"),
    ):
        c = sub.add_parser(name, help=what)
        c.add_argument("name", metavar="NAME")
        c.add_argument(
            "new_password",
            nargs="?",
            metavar="PASSWORD",
            help="omit to be prompted, or to read it from the first line of stdin",
        )
        if name == "add":
            c.add_argument("--tags", default="", help="comma-separated, e.g. administrator")
    c = sub.add_parser("set-tags", help="replace a user's tags")
    c.add_argument("name", metavar="NAME")
    c.add_argument("tags", nargs="*", metavar="TAG")
    c = sub.add_parser("delete", help="delete a user")
    c.add_argument("name", metavar="NAME")
    c = sub.add_parser("set-permissions", help="set a user's permissions in a vhost")
    c.add_argument("name", metavar="NAME")
    c.add_argument("vhost", metavar="VHOST")
    for kind in ("configure", "write", "read"):
        c.add_argument(kind, metavar=kind.upper(), help="regular expression, e.g. '.*'")
    c = sub.add_parser("clear-permissions", help="remove a user's permissions in a vhost")
    c.add_argument("name", metavar="NAME")
    c.add_argument("vhost", metavar="VHOST")
    return p


def _new_password(args: argparse.Namespace) -> str:
    if args.new_password is not None:
        return str(args.new_password)
    if sys.stdin.isatty():
        return getpass.getpass(f"password for {args.name}: ")
    return sys.stdin.readline().rstrip("\n")


def _ctl_argv(args: argparse.Namespace, config: Config, password: str | None) -> list[str]:
    """The ``warren ctl`` command that makes the same change on a running broker."""
    url = f"http://{config.http_bind}:{config.http_port}"
    head = ["--url", url, "--user", args.user, "--password", args.password]
    cmd = args.command
    if cmd == "list":
        return [*head, "users"]
    if cmd == "add":
        return [*head, "users", "add", args.name, password or "", "--tags", args.tags]
    if cmd == "change-password":
        return [*head, "users", "change-password", args.name, password or ""]
    if cmd == "set-tags":
        return [*head, "users", "set-tags", args.name, *args.tags]
    if cmd == "delete":
        return [*head, "users", "delete", args.name]
    if cmd == "set-permissions":
        return [
            *head,
            "--vhost",
            args.vhost,
            "permissions",
            "set",
            args.name,
            args.configure,
            args.write,
            args.read,
        ]
    return [*head, "--vhost", args.vhost, "permissions", "clear", args.name]


def _user_table(store: UserStore) -> str:
    """The users as ``warren ctl users`` prints a running broker's."""
    rows = [{"name": u.name, "tags": ",".join(u.tags)} for u in store.users.values()]
    rows.sort(key=lambda r: r["name"])
    out = io.StringIO()
    render_table(rows, [Column("name", "name"), Column("tags", "tags")], out)
    return out.getvalue().rstrip("\n")


def _edit(
    args: argparse.Namespace, store: UserStore, vhosts: list[str], password: str | None
) -> str:
    """Apply the command to ``store``; the message to print, in ``warren ctl``'s words
    (what a running broker's change prints). ValueError: refused."""
    users = store.users
    cmd = args.command
    if cmd == "list":
        return _user_table(store)
    if cmd == "add":
        problem = name_problem("user", args.name)  # as the API's PUT /api/users
        if problem is not None:
            raise ValueError(problem)
        tags = [t.strip() for t in args.tags.split(",") if t.strip()]
        existing = users.get(args.name)
        user = store.add_user(args.name, password or "", tags)
        if existing is not None:
            user.permissions = existing.permissions
            user.topic_permissions = existing.topic_permissions
        return f"Added user {quoted(args.name)}."
    if args.name not in users:
        raise ValueError(f"no user '{args.name}'")
    user = users[args.name]
    if cmd == "change-password":
        user.password_hash = hash_password(password or "")
        user.hashing_algorithm = "rabbit_password_hashing_sha256"
        return f"Changed the password of user {quoted(args.name)}."
    if cmd == "set-tags":
        user.tags = [t.strip() for arg in args.tags for t in arg.split(",") if t.strip()]
        shown = ", ".join(user.tags) if user.tags else "(none)"
        return f"Set tags of user {quoted(args.name)} to {shown}."
    if cmd == "delete":
        store.delete_user(args.name)
        return f"Deleted user {quoted(args.name)}."
    if args.vhost not in vhosts:
        raise ValueError(f"no vhost '{args.vhost}'")
    if cmd == "set-permissions":
        user.permissions[args.vhost] = Permission(args.configure, args.write, args.read)
        return f"Set permissions of user {quoted(args.name)} in vhost {quoted(args.vhost)}."
    user.permissions.pop(args.vhost, None)
    return f"Cleared permissions of user {quoted(args.name)} in vhost {quoted(args.vhost)}."


def main(argv: Sequence[str] | None = None) -> int:
    """0: done; 1: refused (no such user or vhost, API error); 2: usage or config error."""
    args = build_parser().parse_args(argv)
    config = config_from(args, "warren users")
    if config is None:
        return 2
    root = usable_data_dir(config, "warren users", create=True)
    if root is None:
        return 1
    password = _new_password(args) if args.command in ("add", "change-password") else None
    layout = DataDir(root)
    with data_dir_lock(layout.root) as locked:
        if not locked:
            # A broker runs on this directory: make the change through it.
            from warren.ctl.main import main as ctl_main

            # Its exit statuses (docs/ctl.md) become this command's: any refusal is 1.
            return 0 if ctl_main(_ctl_argv(args, config, password)) == 0 else 1
        try:
            new = layout.is_new
            store = load_users(layout.users_file, config.damaged_metadata)
            vhosts = layout.load_vhosts(config.damaged_metadata) or [config.default_vhost]
        except DamagedFile as exc:
            print(f"warren users: {exc}", file=sys.stderr)
            return 1
        if new:
            # A fresh directory: the broker's first start would add the default user.
            store.add_user(config.default_user, config.default_password, ["administrator"])
            store.set_permissions(config.default_user, config.default_vhost)
        try:
            message = _edit(args, store, vhosts, password)
        except ValueError as exc:
            print(f"warren users: {exc}", file=sys.stderr)
            return 1
        if args.command != "list":
            save_users(store, layout.users_file)
        print(message)
    return 0
