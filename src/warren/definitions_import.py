"""Importing definitions in RabbitMQ's JSON format (``load_definitions``).

The format is what ``rabbitmqctl export_definitions`` and the management API's
``/api/definitions`` produce: top-level lists of ``users``, ``vhosts``,
``permissions``, ``topic_permissions``, ``parameters`` (vhost limits and
operator policies are runtime parameters), ``global_parameters``,
``policies``, ``queues``, ``exchanges`` and ``bindings``; and Warren's own
``webhooks`` (the API's webhook targets, webhooks/saved.py), which RabbitMQ
has not.

Import follows RabbitMQ 3.10's ``rabbit_definitions:apply_defs/3``: the same
order, and the same idempotency (users, permissions, policies and parameters
are set again; existing queues and exchanges are left as they are; names
starting with ``amq.`` are skipped). Unlike RabbitMQ it checks the whole
document before changing anything, so a malformed entry is reported without a
half-applied import; what only applying can reveal (say, a binding whose queue
is missing) still stops the import where it occurs. Reading the document is
in definitions_document.py, the export in definitions_export.py.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from warren.config import ConfigError
from warren.core.exchange import exchange_class
from warren.core.policies import Policy, validate_policy
from warren.core.queue_arguments import (
    is_quorum,
    is_stream,
    validate_queue_arguments,
    validate_quorum_declaration,
    validate_stream_declaration,
    with_default_type,
)
from warren.core.runtime_parameters import is_int, validate_default_queue_type, validate_limits
from warren.core.users import (
    HASHING_ALGORITHMS,
    MD5,
    SHA256,
    USER_LIMIT_KEYS,
    Permission,
    User,
    hash_password,
    hashing_algorithm,
    valid_hash,
)
from warren.core.vhost import PREDECLARED
from warren.definitions_document import DefinitionsError, Entry, entries, wrap_errors

if TYPE_CHECKING:
    from warren.core.exchange import Exchange
    from warren.core.queue import Queue
    from warren.node import Node

__all__ = ["CATEGORIES", "Known", "checked_import", "import_definitions", "import_steps"]

log = logging.getLogger("warren.definitions")

_VERSION_KEYS = ("rabbit_version", "rabbitmq_version", "product_name", "product_version")

CATEGORIES = (
    "users",
    "vhosts",
    "permissions",
    "topic_permissions",
    "parameters",
    "global_parameters",
    "policies",
    "queues",
    "exchanges",
    "bindings",
    "webhooks",
)


def _proplist_to_dict(value: Any) -> Any:
    """RabbitMQ 3.10 exports an operator policy's definition as ``[[key, value], ...]``
    (and then cannot import it); Warren reads that form as the object it means."""
    if (
        isinstance(value, list)
        and value
        and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in value)
    ):
        return {k: v for k, v in value}
    return value


# -- users and permissions -----------------------------------------------------------------


def _tags(entry: Entry) -> list[str]:
    """rabbit_auth_backend_internal:tag_list_from/1: a list, or a comma-separated string."""
    rec = entry.rec
    tags = rec.get("tags")
    if tags is None:
        admin = rec.get("administrator")
        if admin is None:
            raise entry.error("user has no 'tags'")
        return ["administrator"] if str(admin).lower() == "true" else []
    if isinstance(tags, str):
        return [t.strip() for t in tags.split(",") if t.strip()]
    if isinstance(tags, list) and all(isinstance(t, str) for t in tags):
        return [t.strip() for t in tags]
    raise entry.error("'tags' must be a list of strings or a comma-separated string")


def _hashing_algorithm(entry: Entry, version: Any) -> str:
    """The user's hashing algorithm: RabbitMQ's SHA-256 (the default), SHA-512 and
    MD5, and bcrypt as LavinMQ exports it."""
    algorithm = entry.rec.get("hashing_algorithm")
    if algorithm is None:
        # rabbit_auth_backend_internal:hashing_algorithm/2: exports before 3.6 used MD5.
        if isinstance(version, str) and re.match(r"3\.[0-5]\.", version):
            return MD5
        return SHA256
    canonical = hashing_algorithm(algorithm) if isinstance(algorithm, str) else None
    if canonical is None:
        raise entry.error(
            f"hashing_algorithm '{algorithm}' is not supported (Warren checks "
            f"{', '.join(sorted(HASHING_ALGORITHMS))})"
        )
    return canonical


def _user_update(entry: Entry, version: Any) -> Callable[[Node], None]:
    name = entry.name("name", "user")
    tags = _tags(entry)
    rec = entry.rec
    if "password" in rec and "password_hash" in rec:
        raise entry.error("both password and password_hash are provided")
    algorithm = SHA256
    if "password_hash" in rec:
        algorithm = _hashing_algorithm(entry, version)
        password_hash = entry.text("password_hash")
        if not valid_hash(password_hash, algorithm):
            raise entry.error(f"'password_hash' is not a {algorithm} hash") from None
    elif "password" in rec:
        password_hash = hash_password(entry.text("password"))
    else:
        password_hash = ""  # no password login, as RabbitMQ
    preset = entry.table("permissions")
    perms = {vhost: _permission(entry, p) for vhost, p in preset.items()}
    limits = _user_limits(entry) if "limits" in rec else None

    def apply(broker: Node) -> None:
        user = broker.users.users.get(name)
        if user is None:
            user = broker.users.users[name] = User(name, password_hash, tags)
            user.permissions.update(perms)  # preconfigured, for new users only
        else:
            user.password_hash = password_hash
            user.tags = tags
        user.hashing_algorithm = algorithm
        if limits is not None:  # as RabbitMQ's put_user: given limits replace the user's
            user.limits = dict(limits)

    return apply


def _permission(entry: Entry, rec: Any) -> Permission:
    if not isinstance(rec, dict):
        raise entry.error("permissions must be JSON objects")
    configure, write, read = _regexes(entry, ("configure", "write", "read"), rec)
    return Permission(configure, write, read)


def _regexes(entry: Entry, keys: tuple[str, ...], rec: Any = None) -> list[str]:
    """The permission regexes ``keys`` of ``rec`` (default: the entry), each checked."""
    rec = entry.rec if rec is None else rec
    values: list[str] = []
    for key in keys:
        value = rec.get(key)
        if not isinstance(value, str):
            raise entry.error(f"permission '{key}' must be a string")
        try:
            re.compile(value)
        except re.error as exc:
            raise entry.error(
                f"permission '{key}' is not a valid regular expression: {exc}"
            ) from None
        values.append(value)
    return values


#: A vhost entry that does not say its default queue type: the vhost's stays.
_UNSAID = "\x00unsaid"


def _add_vhost(broker: Node, name: str, default_queue_type: str | None) -> None:
    vhost = broker.add_vhost(name)
    if default_queue_type != _UNSAID:
        vhost.metadata.set_default_queue_type(default_queue_type)


def _default_queue_type(entry: Entry) -> str | None:
    """A vhost entry's default queue type: in its ``metadata`` (RabbitMQ 3.13's
    exports, which 3.13 reads) or beside it (4.x writes both); _UNSAID when neither
    has one."""
    metadata = entry.rec.get("metadata")
    for where in (metadata if isinstance(metadata, dict) else {}, entry.rec):
        if "default_queue_type" in where:
            try:
                return validate_default_queue_type(where["default_queue_type"])
            except ValueError as exc:
                raise entry.error(str(exc)) from None
    return _UNSAID


def _set_permission(broker: Node, user: str, vhost: str, perm: Permission) -> None:
    broker.users.users[user].permissions[vhost] = perm


def _set_topic_permission(
    broker: Node, user: str, vhost: str, exchange: str, write: str, read: str
) -> None:
    broker.users.set_topic_permission(user, vhost, exchange, write, read)


def _user_limits(entry: Entry) -> dict[str, int]:
    """A user's ``limits``: max-connections and max-channels, integers (RabbitMQ's
    validation texts)."""
    limits = entry.table("limits")
    for key, value in limits.items():
        if key not in USER_LIMIT_KEYS:
            raise entry.error(f'Validation failed\n\nUnrecognised terms [{{<<"{key}">>,...}}]')
        if not is_int(value):
            raise entry.error(
                f"Validation failed\n\n{key} should be a number, actually was {value}"
            )
    return limits


def _set_limits(broker: Node, vhost: str, limits: dict[str, int]) -> None:
    broker.vhosts[vhost].set_limits(limits)


# -- the plan ------------------------------------------------------------------------------


class Known:
    """The names a document's check counts on: the broker's, and those the
    documents checked before it add (the files of a ``load_definitions``
    directory, all checked before the first is applied)."""

    def __init__(self, broker: Node) -> None:
        self.users = set(broker.users.users)
        self.vhosts = set(broker.vhosts)
        #: The default queue type each vhost will have when its queues are declared.
        self.default_types = {name: v.default_queue_type for name, v in broker.vhosts.items()}
        self.exchanges = {(v.name, x) for v in broker.vhosts.values() for x in v.exchanges}
        self.queues = {(v.name, q) for v in broker.vhosts.values() for q in v.queues}

    def add_vhost(self, name: str) -> None:
        """A vhost the broker will have, with its predeclared exchanges."""
        if name not in self.vhosts:
            self.vhosts.add(name)
            self.exchanges.update((name, x) for x in ["", *(p[0] for p in PREDECLARED)])


def _plan(broker: Node, data: dict[str, Any], known: Known) -> list[Callable[[], None]]:
    """Check the whole document; the steps that apply it, in RabbitMQ's order.
    ``known`` gets the document's names."""
    for key in data:
        if key not in CATEGORIES and key not in _VERSION_KEYS:
            log.warning("definitions: unknown key '%s' ignored", key)
    version = data.get("rabbitmq_version", data.get("rabbit_version"))
    steps: list[Callable[[], None]] = []

    # users, vhosts
    user_names = known.users
    for entry in entries(data, "users"):
        steps.append(partial(_user_update(entry, version), broker))
        user_names.add(entry.text("name"))
    vhost_names = known.vhosts
    default_types = known.default_types
    for entry in entries(data, "vhosts"):
        name = entry.name("name", "vhost")
        known.add_vhost(name)
        dqt = _default_queue_type(entry)
        if dqt != _UNSAID:
            default_types[name] = dqt
        steps.append(partial(_add_vhost, broker, name, dqt))

    def need_vhost(entry: Entry) -> str:
        vhost = entry.text("vhost")
        if vhost not in vhost_names:
            raise entry.error(f"virtual host '{vhost}' does not exist")
        return vhost

    # queue limits (rabbit_definitions:validate_limits/1), permissions
    _check_queue_limits(broker, data)
    for entry in entries(data, "permissions"):
        user, vhost, perm = entry.text("user"), need_vhost(entry), _permission(entry, entry.rec)
        if user not in user_names:
            raise entry.error(f"user '{user}' does not exist")
        steps.append(partial(_set_permission, broker, user, vhost, perm))
    for entry in entries(data, "topic_permissions"):
        user, vhost = entry.text("user"), need_vhost(entry)
        exchange, (write, read) = entry.text("exchange"), _regexes(entry, ("write", "read"))
        if user not in user_names:
            raise entry.error(f"user '{user}' does not exist")
        steps.append(partial(_set_topic_permission, broker, user, vhost, exchange, write, read))

    # exchanges
    exchange_names = known.exchanges
    for entry in entries(data, "exchanges"):
        vhost = need_vhost(entry)
        exchange_names.add((vhost, entry.text("name")))
        steps.extend(_exchange_steps(broker, entry, vhost))

    # global parameters, policies, parameters
    for entry in entries(data, "global_parameters"):
        log.info(
            "definitions: global parameter %r skipped (not used by Warren)",
            entry.rec.get("name"),
        )
    for entry in entries(data, "policies"):
        vhost = need_vhost(entry)
        steps.append(partial(_set_policy, broker, vhost, _policy(entry, entry.rec, False)))
    limit_steps: list[Callable[[], None]] = []
    for entry in entries(data, "parameters"):
        component = entry.text("component")
        vhost = need_vhost(entry)
        value = entry.rec.get("value")
        if component == "operator_policy":
            if not isinstance(value, dict):
                raise entry.error("'value' must be a JSON object")
            steps.append(partial(_set_policy, broker, vhost, _policy(entry, value, True)))
        elif component == "vhost-limits":
            if entry.rec.get("name") != "limits":
                raise entry.error("vhost-limits must be named 'limits'")
            limits = wrap_errors(entry, partial(validate_limits, value))
            # Set after the queues: RabbitMQ checks an import's queues against
            # the limits in force before it (above), never against the file's own.
            limit_steps.append(partial(_set_limits, broker, vhost, limits))
        elif component == "policy":
            raise entry.error("policies may not be set using this method")
        elif component in broker.parameter_components:
            comp = broker.parameter_components[component]
            name = entry.name("name", "parameter")
            value = wrap_errors(entry, partial(comp.validate, vhost, name, value))
            steps.append(partial(broker.set_parameter, vhost, component, name, value))
        else:
            log.warning(
                "definitions: %s: parameter component '%s' is not supported; skipped",
                entry.where,
                component,
            )

    # queues, bindings
    queue_names = known.queues
    for entry in entries(data, "queues"):
        vhost = need_vhost(entry)
        queue_names.add((vhost, entry.text("name")))
        steps.extend(_queue_steps(broker, entry, vhost, default_types.get(vhost)))
    for entry in entries(data, "bindings"):
        steps.append(_binding_step(broker, entry, need_vhost(entry), queue_names, exchange_names))
    steps.extend(limit_steps)
    steps.extend(_webhook_steps(broker, data))
    return steps


def _webhook_steps(broker: Node, data: dict[str, Any]) -> list[Callable[[], None]]:
    """Warren's ``webhooks``: the API's targets, set again (docs/webhooks.md)."""
    if "webhooks" not in data:
        return []
    hooks = broker.webhooks
    if hooks is None:
        log.warning("definitions: webhooks skipped (this broker has none)")
        return []
    # Here, not at the top: the core broker imports this module, and warren.webhooks
    # (aiohttp) only with webhooks.
    from warren.webhooks.targets import parse_targets

    try:
        targets = parse_targets(data["webhooks"], "definitions: webhooks")
    except ConfigError as exc:
        raise DefinitionsError(str(exc)) from None
    for target in targets:
        if target.name in hooks.fixed:
            raise DefinitionsError(
                f"definitions: webhooks: '{target.name}' is the webhooks file's target"
            )

    def put_all() -> None:
        for target in targets:
            hooks.put(target)

    return [put_all]


def _policy(entry: Entry, rec: dict[str, Any], operator: bool) -> Policy:
    name = entry.name("name", "policy")
    definition = rec.get("definition")
    if operator:
        definition = _proplist_to_dict(definition)
    return wrap_errors(
        entry,
        lambda: validate_policy(
            name,
            rec.get("pattern"),
            definition,
            rec.get("priority", 0),
            rec.get("apply-to", "all"),
            operator=operator,
        ),
    )


def _set_policy(broker: Node, vhost: str, policy: Policy) -> None:
    setter = (
        broker.vhosts[vhost].set_operator_policy
        if policy.operator
        else broker.vhosts[vhost].set_policy
    )
    setter(policy.name, policy.pattern, policy.definition, policy.priority, policy.apply_to)


def _check_queue_limits(broker: Node, data: dict[str, Any]) -> None:
    new: dict[str, int] = {}
    for entry in entries(data, "queues"):
        vhost, name = entry.text("vhost"), entry.text("name")
        v = broker.vhosts.get(vhost)
        if v is None or name not in v.queues:
            new[vhost] = new.get(vhost, 0) + 1
    for vhost, count in new.items():
        v = broker.vhosts.get(vhost)
        cap = None if v is None else v.limits.get("max-queues")
        if v is None or cap is None or cap < 0:
            continue
        if len(v.queues) + count > cap:
            raise DefinitionsError(
                f'Adding {count} queue(s) to virtual host "{vhost}" would exceed the limit '
                f"of {cap} queue(s).\n\nThis virtual host currently has {len(v.queues)} "
                "queue(s) defined.\n\nImport aborted!"
            )


def _exchange_steps(broker: Node, entry: Entry, vhost: str) -> list[Callable[[], None]]:
    name = entry.name("name", "exchange")
    if name == "" or name.startswith("amq."):
        log.warning("definitions: %s: exchange '%s' skipped (reserved name)", entry.where, name)
        return []
    type_ = entry.text("type")
    if exchange_class(type_) is None:
        raise entry.error(f"unknown exchange type '{type_}'")
    durable = entry.flag("durable", True)
    auto_delete = entry.flag("auto_delete", False)
    internal = entry.flag("internal", False)
    arguments = entry.arguments()

    def declare() -> None:
        v = broker.vhosts[vhost]
        if name not in v.exchanges:
            wrap_errors(
                entry,
                lambda: v.declare_exchange(name, type_, durable, auto_delete, internal, arguments),
            )

    return [declare]


def _queue_steps(
    broker: Node, entry: Entry, vhost: str, default_type: str | None
) -> list[Callable[[], None]]:
    name = entry.name("name", "queue")
    if name.startswith("amq."):
        log.warning("definitions: %s: queue '%s' skipped (reserved name)", entry.where, name)
        return []
    durable = entry.flag("durable", True)
    auto_delete = entry.flag("auto_delete", False)
    arguments = entry.arguments()
    qtype = entry.rec.get("type")
    if qtype in ("quorum", "stream") and "x-queue-type" not in arguments:
        arguments["x-queue-type"] = qtype  # the export's type field, as RabbitMQ reads it
    # The vhost's default queue type, as RabbitMQ 3.13's import applies it.
    arguments = with_default_type(default_type, durable, False, auto_delete, arguments)
    # Checked with the document, as declare_queue checks a new queue: a start
    # refused by a queue's arguments must not have applied the entries before it.
    if is_stream(arguments) or is_quorum(arguments):
        check = validate_stream_declaration if is_stream(arguments) else validate_quorum_declaration
        wrap_errors(entry, lambda: check(name, vhost, durable, False, auto_delete, arguments))
    else:
        wrap_errors(entry, lambda: validate_queue_arguments(name, vhost, arguments))

    def declare() -> None:
        v = broker.vhosts[vhost]
        if name not in v.queues:
            wrap_errors(
                entry,
                lambda: v.declare_queue(
                    name, durable=durable, auto_delete=auto_delete, arguments=arguments
                ),
            )

    return [declare]


def _binding_step(
    broker: Node,
    entry: Entry,
    vhost: str,
    queues: set[tuple[str, str]],
    exchanges: set[tuple[str, str]],
) -> Callable[[], None]:
    source = entry.text("source")
    destination = entry.text("destination")
    kind = entry.text("destination_type")
    if kind not in ("queue", "exchange"):
        raise entry.error(f"'destination_type' must be 'queue' or 'exchange', not '{kind}'")
    routing_key = entry.name("routing_key", "routing_key", "")
    arguments = entry.arguments()
    if (vhost, source) not in exchanges:
        raise entry.error(f"source exchange '{source}' in vhost '{vhost}' does not exist")
    if (vhost, destination) not in (queues if kind == "queue" else exchanges):
        raise entry.error(f"destination {kind} '{destination}' in vhost '{vhost}' does not exist")

    def bind() -> None:
        v = broker.vhosts[vhost]
        src = v.exchanges.get(source)
        dest: Queue | Exchange | None = (
            v.queues.get(destination) if kind == "queue" else v.exchanges.get(destination)
        )
        if src is None or dest is None:
            missing = source if src is None else destination
            raise entry.error(f"'{missing}' in vhost '{vhost}' does not exist")
        wrap_errors(entry, lambda: v.bind(src, dest, routing_key, arguments))

    return bind


def import_definitions(broker: Node, data: dict[str, Any]) -> None:
    """Apply RabbitMQ-format definitions to a started broker (on its event loop).

    Raises DefinitionsError naming the first problem; nothing is changed when
    the problem is in the document itself.
    """
    checked_import(broker, data)()


def checked_import(
    broker: Node, data: dict[str, Any], known: Known | None = None
) -> Callable[[], None]:
    """Check the whole document against the broker now (DefinitionsError, nothing
    changed); what applies it, later. A start checks every file before it writes
    anything (broker_lifecycle.py), each with the ``known`` names of the files
    before it: a refused start leaves the data dir as it was."""
    steps = _checked_steps(broker, data, known)

    def apply() -> None:
        for _ in steps:
            pass

    next(steps)  # the check
    return apply


def import_steps(broker: Node, data: dict[str, Any]) -> Iterator[None]:
    """import_definitions one object at a time: the whole document is checked here
    (DefinitionsError), then each step applies one entry and yields, so a caller on
    the event loop (the management API) can give the loop back between steps."""
    steps = _checked_steps(broker, data)
    next(steps)
    return steps


def _checked_steps(
    broker: Node, data: dict[str, Any], known: Known | None = None
) -> Iterator[None]:
    """Yields once the whole document is checked, then once per applied step."""
    if not isinstance(data, dict):
        raise DefinitionsError("definitions must be a JSON object")
    steps = _plan(broker, data, known or Known(broker))
    yield
    try:
        for step in steps:
            step()
            yield
    finally:
        if data.get("users") or data.get("permissions") or data.get("topic_permissions"):
            broker.save_users()
    counts = ", ".join(
        f"{len(data[c])} {c}" for c in CATEGORIES if isinstance(data.get(c), list) and data[c]
    )
    log.info("definitions imported: %s", counts or "nothing")
