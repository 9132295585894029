"""The SparkSession the Spark tests share, checked after every test so that one
test's broken call or dead JVM never reaches the next test.

Why it is needed: pyspark talks to its JVM through py4j, one socket per Python
thread, one reply line per call. A call interrupted while it waits for its
reply (pytest-timeout's signal method raises pytest's ``Failed`` there, a
BaseException) leaves that socket with the reply still to come: py4j closes
the socket on a network error or a KeyboardInterrupt, not on anything else.
Every later call of the thread then reads the reply meant for the call before
it: ``spark.read`` answers an int (``'int' object has no attribute 'format'``),
a reply code lands where a type code should be (``KeyError: 'c'``), and each
Spark test after the first one that timed out fails (issue 29: 18 of them, on
a busy machine).

So after each test :meth:`SharedSession.after_test`:

1. closes the calling thread's py4j connection when a call on it never
   finished (py4j then opens a new one for the next call: the late reply goes
   nowhere);
2. stops the streaming queries the test left running, and after a failed or
   interrupted test cancels its jobs;
3. after a failed or interrupted test, checks that the JVM still runs a job
   (in another thread, with a deadline); when it does not, the session and its
   JVM are discarded and the next test builds a fresh one.

And :meth:`SharedSession.get` makes the session the active one of the calling
thread's JVM thread, every time. py4j serves each connection on its own JVM
thread, and the JVM keeps its active SparkSession per thread: the thread
behind the new connection opened after (1) has none. Spark looks a Python data
source up in that active session on a write (``DataFrameWriter.save``:
``DataSource.lookupDataSource``), not in the session it writes with, so every
``df.write.format("warren")`` after a repaired call failed with
``[DATA_SOURCE_NOT_FOUND]`` while reads (looked up in their own session)
worked: the Spark tests under ``-n 2`` that ran after
test_session_guard.py's interrupted call.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: How long a failed test's session may take to run a one-task job before it is
#: judged broken and discarded: minutes, for a machine with a load of 10+ on 2
#: cores (a Spark test must not fail because the one before it was slow).
PROBE_SECONDS = 180.0


def interrupted_connection(session: Any) -> Any:
    """This thread's py4j connection if a call on it never finished, else None.

    Between calls py4j keeps a thread's connection in its client's pool
    (``deque``); it takes it out for a call and puts it back when the reply
    has been read. Out of the pool with no call running means a call that was
    interrupted: its reply is still on the way.
    """
    gateway = session.sparkContext._gateway
    if gateway is None:  # no JVM (stopped)
        return None
    client = gateway._gateway_client
    connection = client.get_thread_connection()
    if connection is None or connection.socket is None or connection in client.deque:
        return None
    return connection


def activate(session: Any) -> None:
    """Make ``session`` the active one of the JVM thread serving this Python thread.

    What pyspark does when it builds a session, for the thread that builds it
    only; a write looks its format up in the active session (module docstring).
    """
    from pyspark.sql import SparkSession

    # pyspark's own way to the JVM's SparkSession class (classic in Spark 4).
    sessions = SparkSession._get_j_spark_session_class(session._jvm)
    sessions.setActiveSession(session._jsparkSession)


class SharedSession:
    """One SparkSession at a time, built on demand by ``build`` and replaced
    when a test leaves it broken."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._session: Any = None

    def get(self) -> Any:
        if self._session is None:
            self._session = self._build()
        activate(self._session)
        return self._session

    def after_test(self, failed: bool) -> list[str]:
        """Put the session right for the next test; returns what was done."""
        done: list[str] = []
        session = self._session
        if session is None:
            return done
        connection = interrupted_connection(session)
        if connection is not None:
            # A reset, not a shutdown: nothing of the late reply is read.
            connection.close(reset=True)
            done.append("closed the py4j connection of an interrupted call")
            failed = True
        try:
            for query in session.streams.active:
                query.stop()
                done.append(f"stopped streaming query {query.name or query.id}")
            if failed:
                session.sparkContext.cancelAllJobs()
        except Exception as exc:  # the JVM may be gone: the probe decides
            done.append(f"could not clean up: {exc!r:.200}")
        if failed and not self._answers(session):
            self.discard()
            done.append("discarded the session and its JVM (it ran no job)")
        for line in done:
            log.warning("Spark test session: %s", line)
        return done

    def _answers(self, session: Any) -> bool:
        """Whether the session runs a one-task job with the right answer in time.

        In another thread (its own py4j connection): a JVM that hangs cannot
        hang the test run here, and the answer (a random count) cannot be a
        reply meant for another call.
        """
        rows = random.randint(1000, 9999)
        answer: list[Any] = []

        def probe() -> None:
            try:
                answer.append(session.range(rows).count())
            except Exception as exc:
                answer.append(exc)

        thread = threading.Thread(target=probe, name="spark-session-probe", daemon=True)
        thread.start()
        thread.join(PROBE_SECONDS)
        ok = answer == [rows]
        if not ok:
            log.warning("Spark test session: the probe job gave %r", answer or "no answer")
        return ok

    def discard(self) -> None:
        """Stop the session and end its JVM, whatever state they are in, so
        that get() builds a new one."""
        from pyspark import SparkContext
        from pyspark.sql import SparkSession, SQLContext

        session, self._session = self._session, None
        gateway = SparkContext._gateway
        if gateway is not None:
            proc = getattr(gateway, "proc", None)
            if proc is not None:
                proc.kill()
                proc.wait(60)
            gateway.shutdown_callback_server()
            gateway.close()
        context = getattr(session, "_sc", None) if session is not None else None
        accumulators = getattr(context, "_accumulatorServer", None)
        if accumulators is not None:
            accumulators.shutdown()
        # What SparkContext.stop() and SparkSession.stop() reset, without their
        # calls into a JVM that is gone; and the gateway, so that a new one starts.
        with SparkContext._lock:
            SparkContext._active_spark_context = None
            SparkContext._gateway = None
            SparkContext._jvm = None
        SparkSession._instantiatedSession = None
        SparkSession._activeSession = None
        SQLContext._instantiatedContext = None

    def close(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None
