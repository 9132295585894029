"""An AMQP 1.0 load generator that shares no code with Warren: Qpid Proton's
reactor (python-qpid-proton), for bench/amqp1_compare.py.

One sender and one receiver, each in a process of its own (multiprocessing,
'spawn'), each a proton ``Container`` with a ``MessagingHandler``:

* the receiver attaches with ``prefetch`` credit (proton tops it up as messages
  are handled); pre-settled (``AtMostOnce``) or accepting each message
  (``auto_accept``: proton's own disposition per message);
* the sender sends one pre-encoded message body (``Message.encode`` once, then
  ``delivery`` / ``stream`` / ``advance``, what ``Message.send`` does without
  re-encoding) whenever it has credit: pre-settled, or unsettled with at most
  ``window`` awaiting the broker's disposition.

Both stop ``seconds`` after the sender first has credit; the counts and each
process's CPU share (of its wall time) come back over a queue.

    .venv/bin/python bench/amqp1_proton.py amqp://guest:guest@127.0.0.1:5672 \\
        /queues/q /queues/q --seconds 5 --size 16 [--unsettled]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import AtLeastOnce, AtMostOnce, Container

#: Granularity of the timers that end a run.
TICK = 0.1


class _Sender(MessagingHandler):  # type: ignore[misc]
    def __init__(
        self, url: str, address: str, size: int, settled: bool, window: int, seconds: float, t0: Any
    ) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
        self.url, self.address, self.settled, self.window = url, address, settled, window
        self.seconds = seconds
        self.t0 = t0  # a shared double: when this sender's link opened (time.monotonic)
        self.body = Message(body=b"\x00" * size, inferred=True).encode()
        self.sent = self.accepted = self.rejected = 0
        self.deadline = 0.0
        self.done = False
        self.sender: Any = None
        self.tag = 0

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url, allowed_mechs="PLAIN ANONYMOUS")
        opts = AtMostOnce() if self.settled else AtLeastOnce()
        self.sender = event.container.create_sender(conn, self.address, options=opts)

    def _begin(self, event: Any) -> None:
        """The clock starts at the first credit (proton's on_link_opened may come later)."""
        now = time.monotonic()
        self.t0.value = now
        self.deadline = now + self.seconds
        self.cpu0 = time.process_time()
        event.container.schedule(TICK, self)

    def on_timer_task(self, event: Any) -> None:
        if not self._over(event):
            event.container.schedule(TICK, self)

    def _over(self, event: Any) -> bool:
        """Stop at the deadline (checked here as well as in the timer: a reactor kept
        busy by credit may not get to its timers)."""
        if self.done or not self.deadline or time.monotonic() < self.deadline:
            return self.done
        self.done = True
        self.cpu = time.process_time() - self.cpu0
        event.container.stop()
        return True

    def on_sendable(self, event: Any) -> None:
        if not self.deadline:
            self._begin(event)
        self._send(event)

    def _send(self, event: Any) -> None:
        s = self.sender
        body = self.body
        while s.credit > 0 and not self._over(event):
            if not self.settled and self.sent - self.accepted - self.rejected >= self.window:
                return
            self.tag += 1
            dlv = s.delivery(str(self.tag))
            s.stream(body)
            s.advance()
            if self.settled:
                dlv.settle()
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        self._send(event)

    def on_rejected(self, event: Any) -> None:
        self.rejected += 1
        self._send(event)

    on_released = on_rejected


class _Receiver(MessagingHandler):  # type: ignore[misc]
    def __init__(
        self,
        url: str,
        address: str,
        settled: bool,
        credit: int,
        seconds: float,
        t0: Any,
        ready: Any,
    ) -> None:
        super().__init__(prefetch=credit, auto_accept=not settled)
        self.url, self.address, self.settled = url, address, settled
        self.seconds, self.t0, self.ready = seconds, t0, ready
        self.count = 0
        self.cpu0 = time.process_time()
        self.cpu = 0.0
        self.stopped = False

    def on_start(self, event: Any) -> None:
        conn = event.container.connect(self.url, allowed_mechs="PLAIN ANONYMOUS")
        opts = AtMostOnce() if self.settled else AtLeastOnce()
        event.container.create_receiver(conn, self.address, options=opts)
        event.container.schedule(TICK, self)

    def on_link_remote_open(self, event: Any) -> None:  # (its children still see it)
        self.ready.set()

    def on_message(self, event: Any) -> None:
        if self.t0.value:
            if time.monotonic() < self.t0.value + self.seconds:
                self.count += 1
            else:
                self._stop(event)

    def on_timer_task(self, event: Any) -> None:
        if self.t0.value and time.monotonic() >= self.t0.value + self.seconds:
            self._stop(event)
        elif not self.stopped:
            if not self.t0.value:
                self.cpu0 = time.process_time()
            event.container.schedule(TICK, self)

    def _stop(self, event: Any) -> None:
        if not self.stopped:
            self.stopped = True
            self.cpu = time.process_time() - self.cpu0
            event.container.stop()


def _run_sender(out: Any, *args: Any) -> None:
    h = _Sender(*args)
    Container(h).run()
    out.put(
        (
            "pub",
            {
                "sent": h.sent,
                "accepted": h.accepted,
                "rejected": h.rejected,
                "cpu": h.cpu / h.seconds if h.done else None,
            },
        )
    )


def _run_receiver(out: Any, *args: Any) -> None:
    h = _Receiver(*args)
    Container(h).run()
    out.put(("con", {"received": h.count, "cpu": h.cpu / h.seconds}))


def run(
    url: str,
    target: str,
    source: str,
    seconds: float,
    size: int,
    unsettled: bool,
    window: int = 1000,
    credit: int = 1000,
) -> dict[str, Any]:
    """One timed run: sender and receiver together; rates in msg/s and CPU shares."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    t0 = ctx.Value("d", 0.0)
    ready = ctx.Event()
    settled = not unsettled
    receiver = ctx.Process(
        target=_run_receiver, args=(out, url, source, settled, credit, seconds, t0, ready)
    )
    receiver.start()
    if not ready.wait(30):
        receiver.terminate()
        raise RuntimeError("the proton receiver did not attach within 30 s")
    sender = ctx.Process(
        target=_run_sender, args=(out, url, target, size, settled, window, seconds, t0)
    )
    sender.start()
    results = dict(out.get(timeout=seconds + 60) for _ in range(2))
    for p in (sender, receiver):
        p.join(30)
    pub, con = results["pub"], results["con"]
    return {
        "publish_rate": round(pub["sent"] / seconds, 1),
        "consume_rate": round(con["received"] / seconds, 1),
        "accepted": pub["accepted"],
        "client_cpu": {"sender": pub["cpu"], "receiver": con["cpu"]},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("url")
    ap.add_argument("target")
    ap.add_argument("source")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--unsettled", action="store_true")
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--credit", type=int, default=1000)
    a = ap.parse_args(argv)
    r = run(a.url, a.target, a.source, a.seconds, a.size, a.unsettled, a.window, a.credit)
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
