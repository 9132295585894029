"""core/session.py's ClientSession and Settlements on a real event loop, with
the real group commit (store/sync.py's GroupSync) and real segment stores:
when answers that promise durability may go out, for every protocol.

The protocols' own tests show the same rules through real clients (confirms
in test_pika_confirms_tx.py and the test_disk_full*.py files, MQTT acks in
tests/protocol/mqtt/, held replies in test_declare_sync.py); here each rule is shown
once, on the session itself."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from conftest import BrokerThread, new_event_loop

from warren.core.errors import AccessRefused
from warren.core.message import Message
from warren.core.session import ClientSession, LoginRefused, Settlements
from warren.core.users import CONFIGURE
from warren.store.segment_store import SegmentStore
from warren.store.sync import GroupSync

PERSISTENT = b"\x10\x00\x02"


def _run(test: Callable[[], Awaitable[None]]) -> None:
    loop = new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(test(), 30))
    finally:
        loop.close()


def _store(path: Path) -> SegmentStore:
    store = SegmentStore(path)
    store.append(Message("", "q", PERSISTENT, b"body", 1000))
    return store


class _Named:
    name = "test connection"


class _Answers:
    """What a protocol's settled() callback got, and a way to wait for it."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[Any], bool]] = []
        self.changed = asyncio.Event()

    def settled(self, tokens: list[Any], ok: bool) -> None:
        self.batches.append((list(tokens), ok))
        self.changed.set()

    async def wait_for(self, n: int) -> list[tuple[list[Any], bool]]:
        while len(self.batches) < n:
            self.changed.clear()
            await self.changed.wait()
        return self.batches


class _LosingStore:
    """A store whose write-out failed and dropped its buffered appends (what a
    full disk does, store/disk_budget.py); otherwise a real segment store."""

    def __init__(self, store: SegmentStore) -> None:
        self.store = store

    def flush(self) -> None:
        self.store.flush()

    def sync(self) -> None:
        self.store.sync()

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        self.store.collect_sync(fds, paths, dirs)

    def lost_between(self, first: int, last: int) -> bool:
        return True


def test_ordered_answers_go_out_in_the_order_they_were_added(tmp_path: Path) -> None:
    async def test() -> None:
        syncer = GroupSync(asyncio.get_running_loop())
        a, b = _store(tmp_path / "a"), _store(tmp_path / "b")
        answers = _Answers()
        waiting: Settlements[str] = Settlements(
            SimpleNamespace(syncer=syncer), answers.settled, lambda: None, ordered=True
        )
        assert waiting.add("1", [a]) and waiting.add("2", [b])
        assert waiting.after_waiting("3")  # needs no sync, but goes after 2
        assert waiting.add("4", [a])  # a's batch is not the newest: a new one
        assert await answers.wait_for(3) == [(["1"], True), (["2", "3"], True), (["4"], True)]
        assert not waiting.waiting and not waiting.after_waiting("5")
        syncer.close()

    _run(test)


def test_unordered_answers_share_their_store_sets_batch(tmp_path: Path) -> None:
    async def test() -> None:
        syncer = GroupSync(asyncio.get_running_loop())
        a, b = _store(tmp_path / "a"), _store(tmp_path / "b")
        answers = _Answers()
        waiting: Settlements[int] = Settlements(
            SimpleNamespace(syncer=syncer), answers.settled, lambda: None
        )
        assert waiting.add(1, [a]) and waiting.add(2, [b]) and waiting.add(3, [a])
        assert waiting.add_many(range(4, 7), [a, b])
        assert sorted(await answers.wait_for(3)) == [([1, 3], True), ([2], True), ([4, 5, 6], True)]
        syncer.close()

    _run(test)


def test_nothing_durable_is_answered_at_once(tmp_path: Path) -> None:
    async def test() -> None:
        syncer = GroupSync(asyncio.get_running_loop())
        answers = _Answers()
        waiting: Settlements[int] = Settlements(
            SimpleNamespace(syncer=syncer), answers.settled, lambda: None
        )
        assert not waiting.add(1, None) and not waiting.add(2, [])
        unstarted: Settlements[int] = Settlements(
            SimpleNamespace(syncer=None), answers.settled, lambda: None
        )
        assert not unstarted.add(3, [_store(tmp_path / "a")])  # no group commit
        assert answers.batches == []  # the caller answers, not the session
        syncer.close()

    _run(test)


def test_without_sync_answers_wait_for_the_turns_write_out(tmp_path: Path) -> None:
    async def test() -> None:
        syncer = GroupSync(asyncio.get_running_loop(), enabled=False)
        store, losing = _store(tmp_path / "a"), _LosingStore(_store(tmp_path / "b"))
        answers = _Answers()
        wakes: list[int] = []
        waiting: Settlements[int] = Settlements(
            SimpleNamespace(syncer=syncer), answers.settled, lambda: wakes.append(1)
        )
        assert waiting.add(1, [store]) and waiting.add(2, [store])
        assert waiting.add(3, [losing])
        assert wakes == [1]  # the protocol is asked once to take its output
        assert answers.batches == []  # nothing before the write-out
        waiting.written()
        assert answers.batches == [([1, 2], True), ([3], False)]  # the lost one refused
        waiting.written()  # nothing more
        assert len(answers.batches) == 2
        syncer.close()

    _run(test)


def test_a_batch_whose_store_lost_its_part_is_refused(tmp_path: Path) -> None:
    async def test() -> None:
        syncer = GroupSync(asyncio.get_running_loop())
        answers = _Answers()
        waiting: Settlements[int] = Settlements(
            SimpleNamespace(syncer=syncer), answers.settled, lambda: None
        )
        assert waiting.add(1, [_LosingStore(_store(tmp_path / "a"))])
        assert await answers.wait_for(1) == [([1], False)]
        syncer.close()

    _run(test)


def test_a_definitions_change_is_answered_once_synced(tmp_path: Path) -> None:
    async def test() -> None:
        syncer = GroupSync(asyncio.get_running_loop())
        session = ClientSession(SimpleNamespace(syncer=syncer), _Named())
        mark = session.change_mark()
        never: list[bool] = []
        assert not session.when_changes_durable(mark, never.append)  # nothing changed
        log = _store(tmp_path / "definitions")
        syncer.definitions_written(log)  # what a declare does through its vhost's log
        done = asyncio.get_running_loop().create_future()
        assert session.when_changes_durable(mark, done.set_result)
        assert not done.done()  # the reply is held until the round has synced
        await session.changes_durable(session.change_mark())  # nothing new: at once
        assert await done is True
        assert never == []
        syncer.close()

    _run(test)


def test_a_change_with_records_of_its_own_waits_for_them_too(tmp_path: Path) -> None:
    async def test() -> None:
        syncer = GroupSync(asyncio.get_running_loop())
        session = ClientSession(SimpleNamespace(syncer=syncer), _Named())
        done = asyncio.get_running_loop().create_future()
        records = _store(tmp_path / "sessions")  # e.g. an MQTT session's log
        assert session.when_changes_durable(session.change_mark(), done.set_result, [records])
        assert await done is True
        failed = asyncio.get_running_loop().create_future()
        broken = _BrokenStore(_store(tmp_path / "broken"))
        assert session.when_changes_durable(session.change_mark(), failed.set_result, [broken])
        assert await failed is False  # the protocol closes rather than answer
        syncer.close()

    _run(test)


def test_without_a_group_commit_records_are_synced_at_once(tmp_path: Path) -> None:
    async def test() -> None:
        store = _SyncCounting(_store(tmp_path / "a"))
        session = ClientSession(SimpleNamespace(syncer=None), _Named())
        called: list[bool] = []
        assert not session.when_changes_durable(session.change_mark(), called.append, [store])
        assert store.syncs == 1 and called == []

    _run(test)


class _BrokenStore(_LosingStore):
    """A store whose first half of a sync fails (an I/O error)."""

    def collect_sync(self, fds: list[int], paths: list[Path], dirs: list[Path]) -> None:
        raise OSError(5, "Input/output error")

    def lost_between(self, first: int, last: int) -> bool:
        return False


class _SyncCounting(_BrokenStore):
    def __init__(self, store: SegmentStore) -> None:
        super().__init__(store)
        self.syncs = 0

    def sync(self) -> None:
        self.syncs += 1
        self.store.sync()


# -- login, vhost, permissions: on a started broker, as a connection would -------------


def _session(b: BrokerThread) -> ClientSession:
    return ClientSession(b.broker, _Named())


def test_a_login_is_checked_the_same_for_every_protocol(
    broker_factory: Callable[..., BrokerThread],
) -> None:
    b = broker_factory(auth_failure_delay=100, auth_failures_per_minute=3)

    def logins() -> list[object]:
        out: list[object] = []
        users = b.broker.users
        users.add_user("alice", "secret")
        users.add_user("local", "secret")
        for name, password, host in [
            ("alice", "secret", "10.0.0.1"),  # fine from anywhere
            ("alice", None, "10.0.0.1"),  # a certificate vouches for alice
            ("nobody", None, "10.0.0.1"),  # a certificate naming no user
            ("alice", "wrong", "10.0.0.2"),  # the first failure: refused at once
            ("alice", "wrong", "10.0.0.2"),  # then held, longer each time
            ("alice", "wrong", "10.0.0.2"),
            ("alice", "secret", "10.0.0.2"),  # blocked: refused unchecked
            ("guest", "guest", "10.0.0.3"),  # loopback_users: only from here
            ("guest", "guest", "127.0.0.1"),
        ]:
            try:
                out.append(_session(b).login("amqp091", name, password, host).name)
            except LoginRefused as exc:
                out.append((exc.reason, exc.delay_ms))
        return out

    assert b.call(logins) == [
        "alice",
        "alice",
        (LoginRefused.CREDENTIALS, 0.0),  # from 10.0.0.1
        (LoginRefused.CREDENTIALS, 0.0),  # the first failure from 10.0.0.2
        (LoginRefused.CREDENTIALS, 100),  # ms of the broker's clock
        (LoginRefused.CREDENTIALS, 200),
        (LoginRefused.BLOCKED, 400),
        (LoginRefused.LOOPBACK, 0.0),
        "guest",
    ]
    # Counted per protocol, blocked ones too: [attempts, succeeded, failed]; the
    # loopback refusal came after the credentials were right.
    assert b.call(lambda: b.broker.auth_attempts.by_protocol["amqp091"]) == [9, 4, 5]


def test_opening_a_vhost_checks_limits_then_access(
    broker_factory: Callable[..., BrokerThread],
) -> None:
    b = broker_factory()

    def opens() -> list[object]:
        broker = b.broker
        broker.add_vhost("full")
        broker.add_vhost("closed")
        broker.get_vhost("full").set_limits({"max-connections": 0})
        broker.users.set_permissions("guest", "full")
        out: list[object] = []
        for name in ["/", "missing", "full", "closed"]:
            session = _session(b)
            session.login("amqp091", "guest", "guest", None)
            try:
                out.append(session.open(name).name)
            except LoginRefused as exc:
                out.append((exc.reason, exc.text))
        return out

    assert b.call(opens) == [
        "/",
        (LoginRefused.NO_VHOST, "vhost missing not found"),
        (
            LoginRefused.LIMIT,
            "access to vhost 'full' refused for user 'guest': connection limit (0) is reached",
        ),
        (LoginRefused.NO_ACCESS, "access to vhost 'closed' refused for user 'guest'"),
    ]


def test_permissions_are_checked_and_kept_for_the_session(
    broker_factory: Callable[..., BrokerThread],
) -> None:
    b = broker_factory()

    def checks() -> list[bool]:
        users = b.broker.users
        users.add_user("bob", "pw")
        users.set_permissions("bob", "/", configure="bob[.].*", write=".*", read=".*")
        session = _session(b)
        session.login("mqtt311", "bob", "pw", None)
        session.open("/")
        out = [
            session.allowed(CONFIGURE, "queue", "bob.q"),
            session.allowed(CONFIGURE, "queue", "other"),
        ]
        try:
            session.check(CONFIGURE, "exchange", "other")
        except AccessRefused as exc:
            out.append("refused for user 'bob'" in exc.text)
        # A session keeps the answers it had (RabbitMQ's channels cache theirs);
        # a new session sees the change.
        users.set_permissions("bob", "/", configure=".*", write=".*", read=".*")
        out.append(session.allowed(CONFIGURE, "queue", "other"))
        fresh = _session(b)
        fresh.login("mqtt311", "bob", "pw", None)
        fresh.open("/")
        out.append(fresh.allowed(CONFIGURE, "queue", "other"))
        return out

    assert b.call(checks) == [True, False, True, False, True]
