"""What every ``warren ctl`` handler works with: the Context, argument helpers and
the listing (table or JSON, columns, sort) that every ``list`` action shares.
"""

from __future__ import annotations

import argparse
import getpass
import json
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from warren.ctl.client import EXIT_OK, EXIT_SERVER, Client, CtlError, path
from warren.ctl.output import Column, field, render_table

__all__ = [
    "DEFAULT_EXCHANGE",
    "Context",
    "Handler",
    "LocalUsageError",
    "exchange_name",
    "in_vhost",
    "json_object",
    "listing",
    "positive_int",
    "quoted",
    "read_secret",
    "scoped",
    "tag_list",
]

Handler = Callable[["Context"], int]
DEFAULT_EXCHANGE = "(AMQP default)"


class LocalUsageError(Exception):
    """Bad input found before any request (invalid JSON, unreadable file): exit 1."""


class Context:
    def __init__(
        self,
        client: Client,
        args: argparse.Namespace,
        out: TextIO,
        err: TextIO,
        inp: TextIO,
    ) -> None:
        self.client = client
        self.args = args
        self.out = out
        self.err = err
        self.inp = inp

    @property
    def vhost(self) -> str:
        vhost: str = self.args.vhost
        return vhost

    def opt(self, name: str, default: Any) -> Any:
        """An option that only some parsers of a command define (listing options)."""
        return getattr(self.args, name, default)

    @property
    def json(self) -> bool:
        return bool(self.args.json)

    def print_json(self, doc: Any) -> None:
        if doc is not None:
            self.out.write(json.dumps(doc, indent=2) + "\n")

    def say(self, message: str) -> None:
        """A confirmation line (table mode only)."""
        if not self.json:
            self.out.write(message + "\n")

    def done(self, answer: Any, message: str) -> int:
        if self.json:
            self.print_json(answer)
        else:
            self.say(message)
        return EXIT_OK


# -- argument helpers ------------------------------------------------------------------------


def json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise LocalUsageError(f"{what} is not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise LocalUsageError(f"{what} must be a JSON object, got: {text!r}")
    return value


def quoted(name: str) -> str:
    return json.dumps(name, ensure_ascii=False)


def in_vhost(ctx: Context) -> str:
    return f"in vhost {quoted(ctx.vhost)}"


def tag_list(value: Any) -> list[str]:
    """User tags come as a list (RabbitMQ 3.9+) or a comma-separated string."""
    if isinstance(value, list):
        return [str(t) for t in value if str(t)]
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    return []


def exchange_name(obj: dict[str, Any], key: str = "name") -> str:
    name = obj.get(key)
    return DEFAULT_EXCHANGE if name == "" else str(name or "")


def read_secret(ctx: Context, prompt: str) -> str:
    """A password not given on the command line: prompted on a terminal, else
    the first line of stdin (so it stays out of the process list)."""
    if ctx.inp.isatty():
        return getpass.getpass(prompt)
    line = ctx.inp.readline()
    if not line:
        raise LocalUsageError("no password given (argument or first line of stdin)")
    return line.rstrip("\r\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


# -- listing ---------------------------------------------------------------------------------


def listing(
    ctx: Context,
    rows: Any,
    columns: Sequence[Column],
    all_vhosts: bool = False,
) -> int:
    """Print a list answer: JSON as is, or a table (``--columns`` picks fields);
    ``--sort``/``--reverse`` order both."""
    sort_key, reverse = ctx.opt("sort", None), ctx.opt("reverse", False)
    if isinstance(rows, list) and sort_key is not None:
        present = [r for r in rows if field(r, sort_key) is not None]
        missing = [r for r in rows if field(r, sort_key) is None]  # last either way
        present.sort(key=lambda r: _sort_value(field(r, sort_key)), reverse=reverse)
        rows = present + missing
    elif isinstance(rows, list) and reverse:
        rows = rows[::-1]
    if ctx.json:
        ctx.print_json(rows)
        return EXIT_OK
    if not isinstance(rows, list):
        raise CtlError("the API answered a listing with something other than a list", EXIT_SERVER)
    picked = ctx.opt("columns", None)
    if picked:
        cols = [Column(name, name) for name in (c.strip() for c in picked.split(",")) if name]
    else:
        cols = list(columns)
        if all_vhosts:
            cols.insert(0, Column("vhost", "vhost"))
    render_table(rows, cols, ctx.out, headers=not ctx.opt("no_headers", False))
    return EXIT_OK


def _sort_value(value: Any) -> tuple[int, Any]:
    """Numbers (in order) before anything else (by its text)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, value)
    return (1, value if isinstance(value, str) else json.dumps(value, sort_keys=True))


def scoped(ctx: Context, resource: str) -> str:
    """``/api/<resource>/<vhost>``, or ``/api/<resource>`` with --all-vhosts."""
    if ctx.opt("all_vhosts", False):
        return path(resource)
    return path(resource, ctx.vhost)
