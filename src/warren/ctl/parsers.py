"""The argparse side of ``warren ctl``: every resource, action and option."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from warren.ctl import commands as c
from warren.ctl import super_streams as ss
from warren.ctl.context import Handler, positive_int
from warren.ctl.startup import cmd_await_startup

# -- registration ----------------------------------------------------------------------------


GLOBALS_NOTE = (
    "The global options (--url, --user, --password, --vhost, --json, --timeout, --cacert, "
    "--insecure; listed by `warren ctl --help`) may be given here too."
)


def register(resources: Any, common: argparse.ArgumentParser) -> None:
    """Add every resource and action to the ``COMMAND`` sub-parsers."""

    # The listing options may be given to the resource alone (`queues -a`) or to
    # its `list` action; they default to 'not given' (see Context.opt).
    def listing_options(p: argparse.ArgumentParser, scoped: bool) -> None:
        lo = p.add_argument_group("listing options")
        lo.add_argument(
            "--columns",
            metavar="FIELDS",
            default=argparse.SUPPRESS,
            help="comma-separated API fields to show instead of the default columns "
            "(dotted for nested ones, e.g. name,messages,message_stats.publish)",
        )
        lo.add_argument(
            "--no-headers",
            action="store_true",
            default=argparse.SUPPRESS,
            help="leave out the header line",
        )
        lo.add_argument(
            "--sort",
            metavar="FIELD",
            default=argparse.SUPPRESS,
            help="order by this API field (dotted for nested ones), e.g. messages",
        )
        lo.add_argument(
            "--reverse",
            action="store_true",
            default=argparse.SUPPRESS,
            help="reverse the order (largest first with --sort)",
        )
        if scoped:
            lo.add_argument(
                "-a",
                "--all-vhosts",
                action="store_true",
                default=argparse.SUPPRESS,
                help="list every vhost's (adds a vhost column) instead of --vhost's",
            )

    def resource(
        name: str,
        help_text: str,
        list_handler: Handler | None = None,
        list_help: str = "",
        scoped: bool = False,
        list_extra: Callable[[argparse.ArgumentParser], None] | None = None,
    ) -> Any:
        """A resource's parser and its actions' group; with a list handler, the
        resource alone lists (taking the list action's options too)."""
        p = resources.add_parser(
            name, help=help_text, description=help_text, parents=[common], epilog=GLOBALS_NOTE
        )
        p.set_defaults(resource_parser=p)
        if list_handler is not None:
            p.set_defaults(handler=list_handler)
            listing_options(p, scoped)
            if list_extra is not None:
                list_extra(p)
        group = p.add_subparsers(dest="action", metavar="ACTION")
        if list_handler is not None:
            lp = action(group, "list", list_handler, list_help)
            listing_options(lp, scoped)
            if list_extra is not None:
                list_extra(lp)
        return group

    def action(group: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = group.add_parser(
            name, help=help_text, description=help_text, parents=[common], epilog=GLOBALS_NOTE
        )
        p.set_defaults(handler=handler)
        return p

    # status
    p = resources.add_parser(
        "status",
        help="broker overview: version, node, object counts, listeners",
        description="Broker overview (GET /api/overview).",
        parents=[common],
        epilog=GLOBALS_NOTE,
    )
    p.set_defaults(handler=c.cmd_status)

    # await-startup
    p = resources.add_parser(
        "await-startup",
        help="wait until the broker answers (rabbitmqctl await_startup)",
        description="Wait until the broker's management API answers: every listener is "
        "then up. Retries refused connections for --timeout seconds (default 30); exit "
        "0 once it answers, 2 if it did not in time (3 if the credentials are refused).",
        parents=[common],
        epilog=GLOBALS_NOTE,
    )
    p.set_defaults(handler=cmd_await_startup)

    # cluster
    g = resource("cluster", "the cluster (Warren's clustering, GET /api/cluster)")
    action(g, "status", c.cmd_cluster_status, "leader, in-sync replicas, followers and their lag")

    # vhosts
    g = resource("vhosts", "virtual hosts: list, add, delete", c.cmd_vhosts_list, "list vhosts")
    p = action(g, "add", c.cmd_vhosts_add, "create a virtual host")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--description")
    p.add_argument("--tags", help="comma-separated")
    p.add_argument("--default-queue-type", metavar="TYPE")
    p = action(g, "delete", c.cmd_vhosts_delete, "delete a virtual host and everything in it")
    p.add_argument("name", metavar="NAME")

    # users
    g = resource(
        "users",
        "users: list, add, delete, set-tags, change-password",
        c.cmd_users_list,
        "list users and their tags",
    )
    p = action(g, "add", c.cmd_users_add, "create (or replace) a user")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "new_password",
        nargs="?",
        metavar="PASSWORD",
        help="omit to be prompted, or to read it from the first line of stdin",
    )
    p.add_argument("--tags", default="", help="comma-separated, e.g. administrator")
    p = action(g, "delete", c.cmd_users_delete, "delete a user")
    p.add_argument("name", metavar="NAME")
    p = action(g, "set-tags", c.cmd_users_set_tags, "replace a user's tags (none clears them)")
    p.add_argument("name", metavar="NAME")
    p.add_argument("tags", nargs="*", metavar="TAG")
    p = action(g, "change-password", c.cmd_users_change_password, "set a user's password")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "new_password",
        nargs="?",
        metavar="PASSWORD",
        help="omit to be prompted, or to read it from the first line of stdin",
    )
    p.add_argument("--tags", default=None, help="also replace the tags (default: keep them)")

    # permissions
    def user_filter(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--of-user",
            dest="for_user",
            metavar="USER",
            default=argparse.SUPPRESS,
            help="list this user's permissions in every vhost instead",
        )

    g = resource(
        "permissions",
        "permissions: list, set, clear",
        c.cmd_permissions_list,
        "list permissions in --vhost",
        scoped=True,
        list_extra=user_filter,
    )
    p = action(g, "set", c.cmd_permissions_set, "set a user's permissions in --vhost")
    p.add_argument("target_user", metavar="USER")
    p.add_argument("configure", metavar="CONFIGURE", help="regular expression, e.g. '.*'")
    p.add_argument("write", metavar="WRITE", help="regular expression")
    p.add_argument("read", metavar="READ", help="regular expression")
    p = action(g, "clear", c.cmd_permissions_clear, "remove a user's permissions in --vhost")
    p.add_argument("target_user", metavar="USER")

    # queues
    g = resource(
        "queues",
        "queues: list, declare, delete, purge",
        c.cmd_queues_list,
        "list queues in --vhost",
        scoped=True,
    )
    p = action(g, "declare", c.cmd_queues_declare, "declare a queue in --vhost")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--durable",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="survive a broker restart (default: durable)",
    )
    p.add_argument("--auto-delete", action="store_true", help="delete after its last consumer")
    p.add_argument("--type", metavar="TYPE", help="classic, stream, quorum ... (sets x-queue-type)")
    p.add_argument("--arguments", metavar="JSON", help="e.g. '{\"x-max-length\": 1000}'")
    p = action(g, "delete", c.cmd_queues_delete, "delete a queue")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--if-unused", action="store_true", help="only if it has no consumers")
    p.add_argument("--if-empty", action="store_true", help="only if it has no messages")
    p = action(g, "purge", c.cmd_queues_purge, "remove every ready message of a queue")
    p.add_argument("name", metavar="NAME")

    # exchanges
    g = resource(
        "exchanges",
        "exchanges: list, declare, delete",
        c.cmd_exchanges_list,
        "list exchanges in --vhost",
        scoped=True,
    )
    p = action(g, "declare", c.cmd_exchanges_declare, "declare an exchange in --vhost")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "-t", "--type", default="direct", help="direct, fanout, topic, headers ... (default direct)"
    )
    p.add_argument(
        "--durable",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="survive a broker restart (default: durable)",
    )
    p.add_argument("--auto-delete", action="store_true", help="delete after its last binding")
    p.add_argument("--internal", action="store_true", help="no direct publishing")
    p.add_argument("--arguments", metavar="JSON", help='e.g. \'{"alternate-exchange": "ae"}\'')
    p = action(g, "delete", c.cmd_exchanges_delete, "delete an exchange")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--if-unused", action="store_true", help="only if it has no bindings")

    # super streams (rabbitmq-streams add_super_stream, delete_super_stream)
    g = resource("super-streams", "super streams: add, delete")
    p = action(g, "add", ss.cmd_add, "add a super stream: its exchange and partition streams")
    ss.add_options(p)
    p = action(g, "delete", ss.cmd_delete, "delete a super stream and its partition streams")
    p.add_argument("name", metavar="NAME")

    # bindings
    def binding_filters(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--source",
            metavar="EXCHANGE",
            default=argparse.SUPPRESS,
            help="only this source exchange's",
        )
        p.add_argument(
            "--destination",
            metavar="NAME",
            default=argparse.SUPPRESS,
            help="only those to this destination",
        )

    g = resource(
        "bindings",
        "bindings: list, add, delete",
        c.cmd_bindings_list,
        "list bindings in --vhost",
        scoped=True,
        list_extra=binding_filters,
    )
    for name, handler, text in (
        ("add", c.cmd_bindings_add, "bind a queue (or exchange) to an exchange"),
        ("delete", c.cmd_bindings_delete, "remove a binding"),
    ):
        p = action(g, name, handler, text)
        p.add_argument("source", metavar="SOURCE", help="source exchange")
        p.add_argument("destination", metavar="DESTINATION", help="destination queue (or exchange)")
        p.add_argument("-k", "--routing-key", default="", help="binding key (default empty)")
        p.add_argument(
            "--destination-type",
            choices=("queue", "exchange"),
            default="queue",
            help="default queue",
        )
        p.add_argument("--arguments", metavar="JSON", help="binding arguments (headers exchanges)")

    # connections, channels, consumers
    g = resource(
        "connections",
        "client connections: list, close",
        c.cmd_connections_list,
        "list client connections (of every vhost)",
    )
    p = action(g, "close", c.cmd_connections_close, "close a client connection")
    p.add_argument("name", metavar="NAME", help="the connection's name, as listed")
    p.add_argument("--reason", help="told to the client (X-Reason)")
    resource("channels", "channels: list", c.cmd_channels_list, "list channels (of every vhost)")
    resource(
        "consumers",
        "consumers: list",
        c.cmd_consumers_list,
        "list consumers in --vhost",
        scoped=True,
    )

    # policies
    g = resource(
        "policies",
        "policies: list, set, clear",
        c.cmd_policies_list,
        "list policies in --vhost",
        scoped=True,
    )
    p = action(g, "set", c.cmd_policies_set, "create or replace a policy in --vhost")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "pattern", metavar="PATTERN", help="regular expression matched against queue/exchange names"
    )
    p.add_argument("definition", metavar="JSON", help="e.g. '{\"max-length\": 1000}'")
    p.add_argument("--priority", type=int, default=0, help="default 0")
    p.add_argument(
        "--apply-to",
        default="all",
        choices=("all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams"),
        help="default all",
    )
    p = action(g, "clear", c.cmd_policies_clear, "remove a policy")
    p.add_argument("name", metavar="NAME")

    # definitions
    g = resource("definitions", "definitions (JSON): export, import")
    p = action(g, "export", c.cmd_definitions_export, "write the definitions as JSON")
    p.add_argument("file", nargs="?", metavar="FILE", help="default (or -): stdout")
    p.add_argument("--vhost-only", action="store_true", help="only --vhost's definitions")
    p = action(g, "import", c.cmd_definitions_import, "load definitions from a JSON file")
    p.add_argument("file", metavar="FILE", help="- reads stdin")
    p.add_argument(
        "--vhost-only", action="store_true", help="a single vhost's file, loaded into --vhost"
    )

    # publish, get
    p = resources.add_parser(
        "publish",
        help="publish one message (body from --body or stdin)",
        description="Publish one message through the API (POST /api/exchanges/V/X/publish).",
        parents=[common],
        epilog=GLOBALS_NOTE,
    )
    p.set_defaults(handler=c.cmd_publish)
    p.add_argument("-e", "--exchange", default="", help="default: the default exchange")
    p.add_argument("-k", "--routing-key", default="", help="for the default exchange: the queue")
    p.add_argument("-b", "--body", help="the payload (default: read stdin)")
    p.add_argument("--properties", metavar="JSON", help="e.g. '{\"priority\": 5}'")
    p.add_argument("--persistent", action="store_true", help="delivery_mode 2")
    p.add_argument("--content-type", metavar="TYPE")
    p.add_argument(
        "-H", "--header", action="append", metavar="KEY=VALUE", help="a header (repeatable)"
    )
    p = resources.add_parser(
        "get",
        help="fetch messages from a queue (requeued by default)",
        description="Fetch messages (POST /api/queues/V/Q/get). By default they are "
        "requeued (and so marked redelivered); --ack removes them.",
        parents=[common],
        epilog=GLOBALS_NOTE,
    )
    p.set_defaults(handler=c.cmd_get)
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument(
        "-n", "--count", type=positive_int, default=1, help="at most this many (default 1)"
    )
    p.add_argument("--ack", action="store_true", help="remove them (ackmode ack_requeue_false)")
    p.add_argument(
        "--ackmode",
        default="ack_requeue_true",
        choices=(
            "ack_requeue_true",
            "ack_requeue_false",
            "reject_requeue_true",
            "reject_requeue_false",
        ),
        help="default ack_requeue_true",
    )
    p.add_argument("--encoding", default="auto", choices=("auto", "base64"), help="default auto")
    p.add_argument("--truncate", type=int, metavar="BYTES", help="cut payloads to this size")
    p.add_argument(
        "--body-only",
        action="store_true",
        help="print only the payloads, one per line (base64 ones decoded)",
    )
