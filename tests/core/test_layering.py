"""The package layering docs/architecture.md promises, checked on the source.

core/ and store/ import no protocol package (a protocol package calls the core,
never the other way), and a protocol package never imports another one. The
broker knows its listeners only through warren.node; warren.app, the
composition root, is the one module that brings the broker and the protocol
packages together. Read from the source with ast, so a lazy import inside a
function (or under TYPE_CHECKING) counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from paths import REPO

# Reads the source, not the build: the same in both builds, so once
# (tests/passes.py).
pytestmark = pytest.mark.passes("compiled")

SRC = REPO / "src" / "warren"
#: Packages that speak a protocol to the outside world: the listeners', and
#: shovel/ and federation/ (AMQP clients of other brokers; what they share is
#: warren/links.py's), cluster/ (replication between nodes) and stream_protocol/
#: (RabbitMQ's stream protocol), coap/ (CoAP over UDP).
PROTOCOL_PACKAGES = (
    "amqp",
    "amqp1",
    "coap",
    "http",
    "mqtt",
    "stream_protocol",
    "shovel",
    "federation",
    "cluster",
)


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, absolute names, wherever the import sits."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _in_package(module: str, package: str) -> bool:
    """Whether ``module`` is warren.<package> or in it (warren.amqp1 is not in amqp)."""
    return module == f"warren.{package}" or module.startswith(f"warren.{package}.")


def _files(package: str) -> list[Path]:
    return sorted((SRC / package).glob("*.py"))


@pytest.mark.parametrize("package", ["core", "store"])
def test_core_and_store_import_no_protocol_package(package: str) -> None:
    offenders = {
        f"{path.relative_to(SRC)}: {name}"
        for path in _files(package)
        for name in imported_modules(path)
        if any(_in_package(name, p) for p in PROTOCOL_PACKAGES)
    }
    assert not offenders


@pytest.mark.parametrize("package", PROTOCOL_PACKAGES)
def test_a_protocol_package_imports_no_other(package: str) -> None:
    others = [p for p in PROTOCOL_PACKAGES if p != package]
    offenders = {
        f"{path.relative_to(SRC)}: {name}"
        for path in _files(package)
        for name in imported_modules(path)
        if any(_in_package(name, p) for p in others)
    }
    assert not offenders


@pytest.mark.parametrize(
    "module",
    [
        "broker.py",
        "alarms.py",
        "store_factory.py",
        "node.py",
        "definitions_document.py",
        "definitions_import.py",
        "definitions_export.py",
        "json_tables.py",
        "config.py",
        "config_checks.py",
    ],
)
def test_the_broker_imports_no_protocol_package(module: str) -> None:
    offenders = {
        name
        for name in imported_modules(SRC / module)
        if any(_in_package(name, p) for p in PROTOCOL_PACKAGES)
    }
    assert not offenders


@pytest.mark.parametrize(
    "module", ["batched_protocol.py", "header_handoff.py", "bound_port.py", "tls.py"]
)
def test_what_the_protocols_share_imports_none_of_them(module: str) -> None:
    """The asyncio half and the protocol-header handoff serve every protocol package
    (amqp/ hands AMQP 1.0 clients to amqp1/ through header_handoff.py, never directly)."""
    offenders = {
        name
        for name in imported_modules(SRC / module)
        if any(_in_package(name, p) for p in PROTOCOL_PACKAGES)
    }
    assert not offenders


def test_only_the_composition_root_imports_the_broker() -> None:
    """No cycle amqp <-> broker or definitions_* <-> broker: they see a Node."""
    allowed = {
        "warren.broker": {"app.py"},
        # The front ends that start a broker: the lazy package attribute, the command
        # and the pytest plugin (docs/testing.md).
        "warren.app": {"__init__.py", "cli.py", "pytest_plugin.py"},
    }
    offenders = {
        f"{path.relative_to(SRC)}: {name}"
        for path in sorted(SRC.rglob("*.py"))
        for name in imported_modules(path)
        if name in allowed and str(path.relative_to(SRC)) not in allowed[name]
    }
    assert not offenders


def test_the_check_sees_imports() -> None:
    names = imported_modules(SRC / "amqp" / "publish_checks.py")
    assert "warren.core.properties" in names


def test_nothing_outside_the_spark_package_imports_it() -> None:
    """warren.spark (the PySpark data source) is a client of the broker, never a part."""
    offenders = {
        f"{path.relative_to(SRC)}: {name}"
        for path in sorted(SRC.rglob("*.py"))
        if "spark" not in path.relative_to(SRC).parts
        for name in imported_modules(path)
        if name == "warren.spark" or name.startswith("warren.spark.")
    }
    assert not offenders


#: What a protocol reaches through its client session only (core/session.py):
#: the one place "answer once it is durable and held by the followers" and the
#: login rules (failed-login guard, attempt counters, loopback users, connection
#: limits) and a connection's opening and closing (the counts, the listing, its
#: exclusive queues) are written. cluster/ implements replication itself.
_DURABILITY_NAMES = {
    "syncer",
    "after_changes",
    "when_replicated",
    "changes_stored",
    "gen",
    "auth_guard",
    "auth_attempts",
    "check_connection_limit",
    "loopback_users",
    "connection_opened",
    "connection_closed",
    "delete_exclusive_queues",
}


def durability_reaches(source: str) -> set[tuple[int, str]]:
    """(line, name) of every use of what only the client session may use."""
    return {
        (node.lineno, node.attr)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in _DURABILITY_NAMES
    }


@pytest.mark.parametrize("package", [p for p in PROTOCOL_PACKAGES if p != "cluster"])
def test_a_protocol_reaches_durability_and_logins_only_through_its_client_session(package: str) -> None:
    offenders = {
        f"{path.relative_to(SRC)}:{line}: .{name}"
        for path in _files(package)
        for line, name in durability_reaches(path.read_text(encoding="utf-8"))
    }
    assert not offenders


def test_the_durability_check_sees_a_direct_use() -> None:
    sample = "def f(conn, mark, cb):\n    conn.broker.syncer.after_changes(mark, cb)\n"
    assert durability_reaches(sample) == {(2, "syncer"), (2, "after_changes")}
    assert durability_reaches("conn.client_session.change_mark()\n") == set()


#: What a protocol reaches through its client session's delivery streams only
#: (core/deliveries.py): the one place consuming (a consumer attached to and
#: cancelled from its queue, the queues asked to deliver again, a pull) and
#: settling (the queue's settler: acks, requeues, drops, the delivery-limit
#: count) are written. The store's acks are the queue's business too.
_QUEUE_INTERNALS = {
    "settler",
    "add_consumer",
    "remove_consumer",
    "schedule_delivery",
    "pull_next",
    "ack_many",
    "ack_run",
    "reject_many",
    "reject_run",
    "requeue_refusal",
}


def queue_reaches(source: str) -> set[tuple[int, str]]:
    """(line, name) of every use of a queue's consuming or settling internals."""
    return {
        (node.lineno, node.attr)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in _QUEUE_INTERNALS
    }


@pytest.mark.parametrize("package", PROTOCOL_PACKAGES)
def test_a_protocol_consumes_and_settles_only_through_its_client_session(package: str) -> None:
    offenders = {
        f"{path.relative_to(SRC)}:{line}: .{name}"
        for path in _files(package)
        for line, name in queue_reaches(path.read_text(encoding="utf-8"))
    }
    assert not offenders


def test_the_queue_check_sees_a_direct_use() -> None:
    sample = (
        "def f(q, c, seqs):\n"
        "    q.add_consumer(c)\n"
        "    q.settler.ack_many(seqs, 0)\n"
        "    q.schedule_delivery()\n"
    )
    assert queue_reaches(sample) == {
        (2, "add_consumer"),
        (3, "settler"),
        (3, "ack_many"),
        (4, "schedule_delivery"),
    }
    assert queue_reaches("ch.deliveries.ack(tag, multiple)\n") == set()


def test_spark_imports_nothing_of_perf() -> None:
    """The Spark data source and warren perf share warren.client, not each other."""
    offenders = {
        f"{path.relative_to(SRC)}: {name}"
        for path in _files("spark")
        for name in imported_modules(path)
        if name == "warren.perf" or name.startswith("warren.perf.")
    }
    assert not offenders


#: What of the server side warren.client may use: the codec it shares with it.
CLIENT_MAY_IMPORT = ("warren.amqp.spec", "warren.amqp.frames", "warren.amqp")


def test_the_client_imports_no_server_side_code() -> None:
    """warren.client shares the frame codec with the server and nothing else: no
    connection, handshake or frame loop of the server, no broker, core or store."""
    offenders = {
        f"{path.relative_to(SRC)}: {name}"
        for path in _files("client")
        for name in imported_modules(path)
        if name.startswith("warren.")
        and not name.startswith("warren.client")
        and name not in CLIENT_MAY_IMPORT
    }
    assert not offenders


def _calls_of(path: Path, names: set[str]) -> set[str]:
    """The calls in a file of a function or class whose name (or attribute) is in ``names``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in names:
                found.add(name)
    return found


def test_one_place_defines_the_server_handshake_and_frame_loop() -> None:
    """Only amqp/handshake.py sends connection.start, tune and open-ok, and only
    amqp/frame_loop.py splits the server's input into frames: the broker's
    connection and the follower's read service (amqp/replica.py) share both."""
    handshake = {"ConnectionStart", "ConnectionTune", "ConnectionOpenOk"}
    framing = {"unpack_frame_header"}
    senders = {
        str(path.relative_to(SRC))
        for path in sorted(SRC.rglob("*.py"))
        if _calls_of(path, handshake)
    }
    assert senders == {"amqp/handshake.py"}
    framers = {
        str(path.relative_to(SRC)) for path in sorted(SRC.rglob("*.py")) if _calls_of(path, framing)
    }
    assert framers == {"amqp/frame_loop.py"}
