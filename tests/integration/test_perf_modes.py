"""`warren perf throughput`'s consumer modes against an embedded Warren: single and
multiple acks, consumer message counts (-D), draining a backlog (-x 0), filling one
(-y 0 -C N --keep), and Ctrl-C during a run.

perf runs as a real subprocess; what it printed is checked against what the broker
holds afterwards, and the acks against the frames that crossed the wire.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import struct
import subprocess
import threading
from typing import Any

from conftest import BrokerThread
from test_perf import perf, perf_json, queue_names, warren_process

from warren.amqp import spec


def queue_state(broker: BrokerThread, name: str) -> tuple[int, int, int]:
    """(ready, unacked, consumers) of a queue, read on the broker's loop."""

    def read() -> tuple[int, int, int]:
        q = broker.broker.vhosts["/"].queues[name]
        return q.message_count, q.unacked, q.consumer_count

    return broker.call(read)


class Relay:
    """A TCP relay in front of the broker that keeps every byte the clients sent, to
    check the acks as they crossed the wire."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sent: list[bytearray] = []  # per connection, client -> broker
        self.threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            record = bytearray()
            self.sent.append(record)
            for args in ((client, upstream, record), (upstream, client, None)):
                t = threading.Thread(target=self._pump, args=args, daemon=True)
                t.start()
                self.threads.append(t)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
        try:
            while data := src.recv(65536):
                if record is not None:
                    record += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> list[tuple[int, bool]]:
        """Stop; the (delivery tag, multiple) of every basic.ack the clients sent."""
        self.listener.close()
        for t in self.threads:
            t.join(10)
        acks: list[tuple[int, bool]] = []
        for stream in self.sent:
            pos = 8  # the protocol header
            while pos + 7 <= len(stream):
                ftype, _ch, size = struct.unpack_from(">BHI", stream, pos)
                if ftype == 1 and struct.unpack_from(">I", stream, pos + 7)[0] == ACK:
                    tag, bits = struct.unpack_from(">QB", stream, pos + 11)
                    acks.append((tag, bool(bits & 1)))
                pos += 8 + size
        return acks


ACK = spec.BasicAck.INDEX


def summary_count(lines: list[str], label: str) -> int:
    """The count on the summary line that starts with ``label``."""
    found = [line.split() for line in lines if line.strip().startswith(label)]
    return int(found[-1][1].replace(",", ""))


def interrupted_run(broker: BrokerThread, queue: str) -> tuple[subprocess.Popen[str], str, str]:
    """Start a rate-limited run, read its stdout up to the first live line, send SIGINT
    right then (while the parent is still printing or just done), collect the rest."""
    proc = warren_process(
        "perf",
        "throughput",
        "--uri",
        broker.url,
        "-r",
        "20000",
        "-a",
        "10",
        "-q",
        "100",
        "--queue",
        queue,
        "--keep",
    )
    assert proc.stdout is not None
    head = []
    for line in proc.stdout:
        head.append(line)
        if "msg/s" in line:
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=60)
    return proc, "".join(head) + out, err


def test_ctrl_c_while_a_live_line_is_printed_still_prints_the_summary(
    broker: BrokerThread,
) -> None:
    # Before the fix about every second run died with a KeyboardInterrupt raised as
    # print() of the live line returned: no summary. Three runs in a row.
    for round_ in range(3):
        queue = f"perf-int-{round_}"
        proc, out, err = interrupted_run(broker, queue)
        assert proc.returncode == 130, f"{out}\n{err}"
        assert "Traceback" not in err, err
        lines = out.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("Summary"))
        # The summary starts on a fresh line after an empty one, after the live lines.
        assert lines[start - 1] == "", out
        assert all("msg/s" in line for line in lines[1 : start - 1]), out
        published = summary_count(lines[start:], "published")
        consumed = summary_count(lines[start:], "consumed")
        assert published >= 15_000  # 20,000 msg/s for more than a second
        # The totals are those up to the stop: every message published is either
        # counted (and acked) by the consumer or back in the queue.
        ready, unacked, consumers = queue_state(broker, queue)
        assert (unacked, consumers) == (0, 0)
        assert consumed + ready == published, out


def run_through_relay(
    broker: BrokerThread, queue: str, *args: str
) -> tuple[dict[str, Any], list[tuple[int, bool]]]:
    relay = Relay(broker.port)
    try:
        s = perf_json("throughput", "--uri", relay.url, "--queue", queue, "--keep", *args)
    finally:
        acks = relay.close()
    return s, acks


def test_single_acks_ack_every_message_with_multiple_false(broker: BrokerThread) -> None:
    s, acks = run_through_relay(broker, "perf-single", "-C", "3000", "-q", "100", "--single-ack")
    assert s["published"] == s["consumed"] == 3000
    assert s["params"]["single_ack"] is True
    # One basic.ack per delivery, none of them multiple.
    assert len(acks) == 3000
    assert not [a for a in acks if a[1]]
    assert sorted(tag for tag, _ in acks) == list(range(1, 3001))
    # The broker settled every one of them.
    assert queue_state(broker, "perf-single") == (0, 0, 0)


def test_multi_ack_every_n_is_perftests_dash_capital_a(broker: BrokerThread) -> None:
    for flag in ("-A", "--multi-ack-every", "-a"):
        queue = f"perf-multi{flag}"
        s, acks = run_through_relay(broker, queue, "-C", "3000", "-q", "500", flag, "100")
        assert s["consumed"] == 3000
        assert s["params"]["ack"] == 100 and s["params"]["single_ack"] is False
        # multiple=true every 100 (and whenever the consumer ran dry), up to the last tag.
        assert acks and all(multiple for _, multiple in acks)
        assert 30 <= len(acks) < 3000
        assert max(tag for tag, _ in acks) == 3000
        assert queue_state(broker, queue) == (0, 0, 0)


def test_single_ack_and_multi_ack_exclude_each_other() -> None:
    r = perf("throughput", "--single-ack", "-a", "10")
    assert r.returncode == 2
    assert "not allowed with argument" in r.stderr


def fill(broker: BrokerThread, queue: str, n: int) -> dict[str, Any]:
    """The PerfTest way to a backlog: publishers only, -C messages each, --keep."""
    s = perf_json(
        "throughput", "--uri", broker.url, "-x", "1", "-y", "0", "--queue", queue,
        "-C", str(n), "-c", "1000", "--keep",
    )  # fmt: skip
    assert s["published"] == s["confirmed"] == n
    assert s["consumed"] == 0
    assert queue_state(broker, queue) == (n, 0, 0)
    return s


def test_fill_then_drain_with_single_acks(broker: BrokerThread) -> None:
    fill(broker, "perf-backlog", 20_000)
    s = perf_json(
        "throughput", "--uri", broker.url, "-x", "0", "-y", "1", "--queue", "perf-backlog",
        "--drain", "--single-ack", "-q", "1000", "--keep",
    )  # fmt: skip
    assert s["published"] == 0
    assert s["backlog"] == s["expected"] == s["consumed"] == 20_000
    assert s["consume_rate"] > 0
    assert s["client_cpu"]["publishers"] == []
    assert "errors" not in s
    # Drained and settled: nothing ready, nothing unacked, the consumer gone.
    assert queue_state(broker, "perf-backlog") == (0, 0, 0)


def test_drain_with_two_consumers_and_no_ack_deletes_the_queue(broker: BrokerThread) -> None:
    fill(broker, "perf-backlog2", 10_000)
    r = perf(
        "throughput", "--uri", broker.url, "-x", "0", "-y", "2", "--queue", "perf-backlog2",
        "--drain",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert summary_count(lines, "consumed") == 10_000
    assert summary_count(lines, "backlog") == 10_000
    assert summary_count(lines, "published") == 0
    assert "perf-backlog2" not in queue_names(broker)


def test_drain_of_an_empty_queue_ends_at_once(broker: BrokerThread) -> None:
    s = perf_json("throughput", "--uri", broker.url, "-x", "0", "--queue", "perf-empty", "--drain")
    assert s["consumed"] == s["backlog"] == 0
    assert "errors" not in s


def test_consumer_message_count_leaves_the_rest_queued(broker: BrokerThread) -> None:
    fill(broker, "perf-part", 5000)
    s = perf_json(
        "throughput", "--uri", broker.url, "-x", "0", "-y", "2", "--queue", "perf-part",
        "-D", "1500", "-a", "100", "-q", "300", "--keep",
    )  # fmt: skip
    assert s["consumed"] == s["expected"] == 3000
    assert s["backlog"] == 5000
    # Each consumer acked exactly its 1,500; what it held beyond went back.
    assert queue_state(broker, "perf-part") == (2000, 0, 0)


def test_consumer_message_count_ends_a_run_with_endless_publishers(broker: BrokerThread) -> None:
    s = perf_json(
        "throughput", "--uri", broker.url, "-x", "1", "-y", "1", "--queue", "perf-d",
        "-D", "4000", "--single-ack", "-q", "100", "-r", "20000", "--keep",
    )  # fmt: skip
    assert s["consumed"] == 4000
    assert s["published"] >= 4000
    ready, unacked, consumers = queue_state(broker, "perf-d")
    assert (unacked, consumers) == (0, 0)
    assert ready == s["published"] - 4000


def test_drain_needs_no_publishers() -> None:
    r = perf("throughput", "-x", "1", "--drain")
    assert r.returncode == 2
    assert "--drain needs -x 0" in r.stderr
