"""`warren perf throughput`'s consumer modes against an embedded Warren: single and
multiple acks, consumer message counts (-D), draining a backlog (-x 0), filling one
(-y 0 -C N --keep), and Ctrl-C during a run.

perf runs as a real subprocess; what it printed is checked against what the broker
holds afterwards, and the acks against the frames that crossed the wire.
"""

from __future__ import annotations

import signal
import subprocess

from conftest import BrokerThread
from test_perf import warren_process


def queue_state(broker: BrokerThread, name: str) -> tuple[int, int, int]:
    """(ready, unacked, consumers) of a queue, read on the broker's loop."""

    def read() -> tuple[int, int, int]:
        q = broker.broker.vhosts["/"].queues[name]
        return q.message_count, q.unacked, q.consumer_count

    return broker.call(read)


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
