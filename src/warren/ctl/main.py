"""``warren ctl`` / ``warrenctl``: the command line and its dispatch.

The parser is two levels deep (``warren ctl queues declare NAME``); a resource
alone (``warren ctl queues``) lists it. The global options (``--url``,
``--user``, ``--vhost``, ``--json`` ...) are accepted before the resource and
after the action alike. Exit statuses are in :mod:`warren.ctl.client`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

from warren.ctl import parsers
from warren.ctl.client import EXIT_OK, EXIT_USAGE, Client, CtlError
from warren.ctl.context import Context, LocalUsageError

__all__ = ["build_parser", "main"]

DEFAULT_URL = "http://127.0.0.1:15672"

EPILOG = """\
exit status: 0 ok, 1 usage error, 2 cannot connect, 3 authentication failed (401),
4 not authorised (403), 5 not found (404), 6 refused / bad request (400, 405, 409 ...),
7 other server error. Errors go to stderr with the API's reason.

environment: WARREN_URL, WARREN_USER, WARREN_PASSWORD set the defaults of
--url, --user and --password.
"""


class UsageError(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors raised (exit status 1, not argparse's 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


class _Hidden:
    """add_argument with the help suppressed."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    def add_argument(self, *names: str, **kw: Any) -> None:
        kw["help"] = argparse.SUPPRESS
        self.parser.add_argument(*names, **kw)


def _add_globals(p: argparse.ArgumentParser, top: bool) -> None:
    """The global options; on the sub-parsers they default to 'not given' so
    that a value given before the resource name is not overwritten."""

    def d(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    if not top:  # listed once, in `warren ctl --help`; the epilog says they work here
        g: Any = _Hidden(p)
    else:
        g = p.add_argument_group("global options")
    g.add_argument(
        "--url",
        default=d(os.environ.get("WARREN_URL", DEFAULT_URL)),
        help=f"management API base URL (env WARREN_URL; default {DEFAULT_URL})",
    )
    g.add_argument(
        "-u",
        "--user",
        default=d(None),
        help="user name (env WARREN_USER; default guest)",
    )
    g.add_argument(
        "--password",
        default=d(None),
        help="password (env WARREN_PASSWORD; default guest)",
    )
    g.add_argument(
        "-p",
        "--vhost",
        default=d("/"),
        help="virtual host of vhost-scoped commands (default /)",
    )
    g.add_argument(
        "--json",
        action="store_true",
        default=d(False),
        help="print the API's JSON instead of tables and messages",
    )
    g.add_argument(
        "--timeout",
        type=_positive_float,
        default=d(30.0),
        metavar="SECONDS",
        help="HTTP timeout (default 30)",
    )
    g.add_argument(
        "--cacert",
        metavar="FILE",
        default=d(None),
        help="for https: trust the certificates (PEM) in FILE",
    )
    g.add_argument(
        "--insecure",
        action="store_true",
        default=d(False),
        help="for https: do not verify the server's certificate",
    )


def _version() -> str:
    from warren import __version__

    return __version__


def build_parser(prog: str = "warren ctl") -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description="Manage a Warren (or RabbitMQ) broker over its management HTTP API.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_globals(parser, top=True)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    common = _Parser(add_help=False)
    _add_globals(common, top=False)
    resources = parser.add_subparsers(dest="resource", metavar="COMMAND", parser_class=_Parser)
    parsers.register(resources, common)
    return parser


def _print_usage_error(exc: UsageError, err: TextIO) -> None:
    err.write(exc.parser.format_usage())
    err.write(f"{exc.parser.prog}: error: {exc.message}\n")


def _first(*values: str | None) -> str:
    return next(v for v in values if v is not None)


def main(
    argv: Sequence[str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    stdin: TextIO | None = None,
    prog: str | None = None,
) -> int:
    """Run one command; returns the exit status (never raises SystemExit).

    ``argv`` excludes the program name (and the word ``ctl``).
    """
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    inp = stdin if stdin is not None else sys.stdin
    if prog is None:
        prog = (
            "warrenctl" if os.path.basename(sys.argv[0]).startswith("warrenctl") else "warren ctl"
        )
    parser = build_parser(prog)
    try:
        with contextlib.redirect_stdout(out):  # --help and --version
            args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:
        _print_usage_error(exc, err)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    handler = getattr(args, "handler", None)
    if handler is None:
        # `warren ctl` alone, or a resource whose parser has no default action.
        sub = getattr(args, "resource_parser", None) or parser
        sub.print_help(err)
        return EXIT_USAGE
    try:
        client = Client(
            args.url, "", "", timeout=args.timeout, cacert=args.cacert, insecure=args.insecure
        )
        # Credentials: the flags, then those in the URL, then the environment, then guest.
        client.user = _first(args.user, client.url_user, os.environ.get("WARREN_USER"), "guest")
        client.password = _first(
            args.password, client.url_password, os.environ.get("WARREN_PASSWORD"), "guest"
        )
        ctx = Context(client, args, out, err, inp)
        status: int = handler(ctx)
        return status
    except LocalUsageError as exc:
        err.write(f"{prog}: error: {exc}\n")
        return EXIT_USAGE
    except CtlError as exc:
        err.write(f"{prog}: {exc.message}\n")
        return exc.status
    except BrokenPipeError:  # `warren ctl queues | head`
        with contextlib.suppress(OSError):  # silence the flush at exit
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return EXIT_OK
    except KeyboardInterrupt:
        err.write("\n")
        return 130
