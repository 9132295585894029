"""``warren ctl await-startup``: wait until the broker's management API answers.

As ``rabbitmqctl await_startup``: for scripts that start a broker in the
background and must not talk to it before it listens. Warren starts its HTTP
listener last (warren.app), so an API that answers means every listener is up.
Refused connections and server errors (a broker still starting) are retried
until ``--timeout`` seconds have passed; any other answer (wrong password:
401) ends the wait at once with its exit status.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from warren.ctl.client import EXIT_CONNECT, EXIT_OK, EXIT_SERVER, Client, CtlError, path
from warren.ctl.context import Context

__all__ = ["await_startup", "cmd_await_startup"]

#: Seconds between two attempts.
POLL_INTERVAL = 0.1
#: The longest a single attempt may take (the whole wait is --timeout).
ATTEMPT_TIMEOUT = 5.0


def await_startup(
    client: Client,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once ``GET /api/overview`` answers; CtlError (exit status 2 when
    nothing answered in time) otherwise. The clock and sleep are injectable."""
    deadline = clock() + timeout
    last: CtlError | None = None
    attempts = 0
    while True:
        left = deadline - clock()
        if attempts and left <= 0:
            break
        attempts += 1
        client.timeout = max(min(ATTEMPT_TIMEOUT, left), 0.1)
        try:
            client.get(path("overview"))
            return
        except CtlError as exc:
            if exc.status not in (EXIT_CONNECT, EXIT_SERVER):
                raise
            last = exc
        sleep(min(POLL_INTERVAL, max(deadline - clock(), 0.0)))
    assert last is not None
    raise CtlError(
        f"the broker at {client.base} did not answer within {timeout:g}s "
        f"(last: {last.message})",
        EXIT_CONNECT,
    )


def cmd_await_startup(ctx: Context) -> int:
    await_startup(ctx.client, ctx.args.timeout)
    ctx.say(f"{ctx.client.base}: started")
    return EXIT_OK
