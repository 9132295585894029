"""Full disks for the tests: a small tmpfs as the data directory, a file that fills
it from outside, and pika publishers with confirms that keep publishing.

tmpfs needs root (CAP_SYS_ADMIN); `small_disk` skips the test, saying why, where
mounting is not permitted.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

MiB = 1024 * 1024


@contextlib.contextmanager
def _mounted(command: list[str], where: Path, what: str) -> Iterator[Path]:
    """``where`` with ``command`` (a mount) run on it, unmounted at the end; the
    test is skipped when it cannot be mounted."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(command + [str(where)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount {what} for a full-disk test: {done.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


@contextlib.contextmanager
def tmpfs(where: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted at ``where`` (unmounted at the end)."""
    with _mounted(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs"], where, "a tmpfs"):
        yield where


@contextlib.contextmanager
def ext4(where: Path, size: int) -> Iterator[Path]:
    """An ext4 file system of ``size`` bytes (an image file beside ``where``,
    loop-mounted, no blocks reserved for root) mounted at ``where``: unlike a
    tmpfs, it keeps what a failed fallocate got."""
    image = where.with_suffix(".img")
    with open(image, "wb") as f:
        f.truncate(size)
    made = subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        pytest.skip(f"cannot make an ext4 file system: {made.stderr.strip()}")
    try:
        with _mounted(["mount", "-o", "loop", str(image)], where, "an ext4 image"):
            yield where
    finally:
        image.unlink()


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path) -> int:
    """Write zeros to ``path`` until the file system is full; the bytes written."""
    written = 0
    chunk = b"\0" * (64 * 1024)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            try:
                n = os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return written
                chunk = chunk[: len(chunk) // 2]  # fill the last pages too
                continue
            written += n
    finally:
        os.close(fd)


class ConfirmPublisher(threading.Thread):
    """A publisher that never stops on its own: persistent messages to a durable
    queue with confirms, at most ``window`` unconfirmed, as fast as the broker
    takes them (it goes on writing while blocked, as a careless client does).

    Body ``i`` (publish number i, from 1) starts with ``<tag>:<i>:``. ``acked``
    and ``nacked`` collect publish numbers; ``blocking`` the connection.blocked
    and unblocked notifications; ``closed`` the broker's close (code, text).

    With a ``budget`` it publishes that many messages and waits for
    ``release()``: a test's first phase then writes a known amount, so the
    publishers cannot fill a small disk before the test fills it (on a busy
    machine a slow publisher's first confirms came after the others had
    filled it, and it was blocked before the test began). ``limit()`` sets
    such a budget again, for the phase after the disk was given back.
    """

    def __init__(
        self,
        port: int,
        queue: str,
        size: int,
        window: int = 8,
        tag: str = "",
        arguments: dict[str, object] | None = None,
        keyed: bool = False,
        budget: int | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.arguments = arguments  # the queue's (x-queue-type: stream)
        self.keyed = keyed  # each message with a deduplication key header
        self.port = port
        self.queue = queue
        self.size = size
        self.window = window
        self.budget = budget
        self.tag = tag or queue
        self.acked: set[int] = set()
        self.nacked: set[int] = set()
        self.blocking: list[str] = []
        self.closed: tuple[int, str] | None = None
        self.published = 0
        self.error: BaseException | None = None
        self._pending: set[int] = set()
        self._stopping = False
        self._conn: pika.SelectConnection | None = None
        self._channel: object = None
        self._padding = b"x" * size
        self.ready = threading.Event()
        self.finished = threading.Event()

    # -- the test's side ----------------------------------------------------------------
    def body(self, i: int) -> bytes:
        head = f"{self.tag}:{i}:".encode()
        return head + self._padding[len(head) :]

    @staticmethod
    def number(body: bytes) -> int:
        return int(body.split(b":", 2)[1])

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    @property
    def done(self) -> bool:
        """Its budget published and every publish answered."""
        budget = self.budget
        return budget is not None and self.published >= budget and not self._pending

    def state(self) -> str:
        """What this publisher has seen, for a failure message."""
        pending = sorted(self._pending)
        return (
            f"{self.queue}: published {self.published}, acked {len(self.acked)},"
            f" nacked {len(self.nacked)}, pending {pending[:3]}..{pending[-1:]}"
            f" ({len(pending)}), blocking {self.blocking}, closed {self.closed},"
            f" error {self.error!r}, ready {self.ready.is_set()},"
            f" finished {self.finished.is_set()}"
        )

    def release(self) -> None:
        """Lift the budget: publish as fast as the broker takes them from now on."""
        conn = self._conn
        assert conn is not None
        conn.ioloop.add_callback_threadsafe(self._release)

    def limit(self, more: int) -> None:
        """Publish at most ``more`` messages beyond those published so far
        (in force when this returns). A test gives its publishers a limit
        before it gives a full disk back: unlimited, they fill it again, are
        blocked again, and the publishes they sent meanwhile are never read,
        so their confirms cannot come before the end of the test (a blocked
        publisher is not read until the alarm clears, as with RabbitMQ)."""
        conn = self._conn
        assert conn is not None
        if self.finished.is_set():
            return
        applied = threading.Event()

        def apply() -> None:
            self.budget = self.published + more
            applied.set()

        conn.ioloop.add_callback_threadsafe(apply)
        assert applied.wait(30), f"{self.queue}: pika's loop did not take the limit"

    def stop(self, timeout: float = 30) -> None:
        """Stop publishing, wait for the confirms still due, close the connection."""
        conn = self._conn
        if conn is not None and not self.finished.is_set():
            conn.ioloop.add_callback_threadsafe(self._stop)
        self.finished.wait(timeout)
        self.join(timeout)

    # -- pika's side (its ioloop thread) --------------------------------------------------
    def run(self) -> None:
        try:
            params = pika.ConnectionParameters(
                "127.0.0.1",
                self.port,
                credentials=pika.PlainCredentials("guest", "guest"),
                heartbeat=0,
                connection_attempts=1,
            )
            self._conn = pika.SelectConnection(
                params,
                on_open_callback=self._opened,
                on_open_error_callback=self._open_failed,
                on_close_callback=self._on_closed,
            )
            self._conn.add_on_connection_blocked_callback(
                lambda _c, m: self.blocking.append(m.method.NAME)
            )
            self._conn.add_on_connection_unblocked_callback(
                lambda _c, m: self.blocking.append(m.method.NAME)
            )
            self._conn.ioloop.start()
        except BaseException as exc:  # reported to the test
            self.error = exc
        finally:
            self.ready.set()
            self.finished.set()

    def _open_failed(self, _conn: object, exc: BaseException) -> None:
        self.error = exc
        assert self._conn is not None
        self._conn.ioloop.stop()

    def _opened(self, conn: pika.SelectConnection) -> None:
        conn.channel(on_open_callback=self._channel_open)

    def _channel_open(self, ch: pika.channel.Channel) -> None:
        self._channel = ch
        ch.confirm_delivery(self._confirmed)
        ch.queue_declare(
            self.queue, durable=True, arguments=self.arguments, callback=lambda _f: self._declared()
        )

    def _declared(self) -> None:
        self.ready.set()
        self._publish()

    def _publish(self) -> None:
        ch = self._channel
        props = pika.BasicProperties(delivery_mode=2)
        while (
            not self._stopping
            and len(self._pending) < self.window
            and (self.budget is None or self.published < self.budget)
        ):
            i = self.published + 1
            if self.keyed:
                headers = {"x-deduplication-header": f"{self.tag}:{i}"}
                props = pika.BasicProperties(delivery_mode=2, headers=headers)
            ch.basic_publish("", self.queue, self.body(i), props)  # type: ignore[attr-defined]
            self.published = i
            self._pending.add(i)

    def _confirmed(self, frame: pika.frame.Method) -> None:
        method = frame.method
        tag = method.delivery_tag
        done = {t for t in self._pending if t <= tag} if method.multiple else {tag}
        self._pending -= done
        (self.acked if method.NAME == "Basic.Ack" else self.nacked).update(done)
        if self._stopping:
            self._maybe_close()
        else:
            self._publish()

    def _release(self) -> None:
        self.budget = None
        if self._channel is not None:
            self._publish()

    def _stop(self) -> None:
        self._stopping = True
        self._maybe_close()

    def _maybe_close(self) -> None:
        conn = self._conn
        if not self._pending and conn is not None and conn.is_open:
            conn.close()

    def _on_closed(self, _conn: object, reason: BaseException) -> None:
        code = getattr(reason, "reply_code", None)
        if isinstance(code, int) and code != 200:
            self.closed = (code, str(getattr(reason, "reply_text", "")))
        assert self._conn is not None
        self._conn.ioloop.stop()


def eventually(
    predicate: Callable[[], bool],
    timeout: float = 30,
    what: str = "",
    detail: Callable[[], str] | None = None,
) -> None:
    """Poll ``predicate`` until it holds; fail after ``timeout`` seconds, with
    ``detail()`` (the state the test was waiting on) in the message."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            more = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"not reached in {timeout} s: {what or predicate}{more}")
        time.sleep(0.01)
