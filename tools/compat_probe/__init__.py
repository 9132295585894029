#!/usr/bin/env python3
"""Record what an AMQP 0-9-1 client observes from a broker for many edge cases.

Every scenario is a function ``(host, port) -> dict`` that talks to a broker
over real sockets and returns a JSON-serialisable observation. Running the
scenarios against RabbitMQ gives the reference observations stored in
``tests/compat/rabbitmq_expected.json``; ``tests/compat/test_rabbitmq_compat.py``
runs the same scenarios against Warren and compares.

Two kinds of scenarios:

* pika (BlockingConnection) scenarios for what a normal client can express.
  Broker-initiated closes are recorded as ``{"closed": "channel" | "connection",
  "reply_code": ..., "reply_text": ...}``.
* raw-socket scenarios, with frames built and parsed by pamqp (or by hand for
  deliberately malformed ones), for protocol-level misbehaviour. They record
  every frame the server sent back (decoded), and what became of the socket:
  ``"closed"`` (EOF), ``"open"`` (a basic.qos ping on a channel was answered,
  or nothing at all happened within the timeout when no ping was possible) or
  ``"open (no reply)"`` (a ping was sent but neither answered nor the socket
  closed within the timeout).

Names are fixed (``compat-...``) and deleted before and after each scenario;
server-generated names in texts are replaced by placeholders (see
:func:`normalise`), so observations compare across runs and brokers.

The modules: common (the registry, settings, normalisation), raw (the raw-socket
client), pika_helpers, and the scenarios by area (AREAS below; stream_session
holds what the stream scenarios share).

Usage::

    python tools/compat_probe --host 127.0.0.1 --port 5672 [--only NAME ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib
import json
import threading
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from .common import SCENARIO_TIMEOUT, SCENARIOS, Observation, jsonable, normalise
from .pika_helpers import cleanup

#: The scenario modules, imported in this order: each registers its scenarios in
#: SCENARIOS, whose order is the order --list shows and a run takes.
AREAS = (
    "handshake",
    "framing",
    "exchanges",
    "queues",
    "basic",
    "confirms_tx",
    "reply_to",
    "properties",
    "stream_declare",
    "stream_consume",
    "stream_ops",
    "quorum",
)
for _area in AREAS:
    importlib.import_module(f"{__name__}.{_area}")

# ======================================================================================
# Runner and CLI
# ======================================================================================


def run_scenario(name: str, host: str, port: int, timeout: float = SCENARIO_TIMEOUT) -> Observation:
    """Run one scenario (with cleanup before and after) in a watchdog thread.

    Never raises: an unexpected failure is recorded as ``{"error": ...}`` and a
    scenario that does not finish within ``timeout`` as ``{"error": "timeout"}``.
    """
    spec = SCENARIOS[name]
    outcome: dict[str, Observation] = {}

    def body() -> None:
        try:
            cleanup(host, port, spec.queues, spec.exchanges)
            try:
                outcome["obs"] = spec.fn(host, port)
            finally:
                cleanup(host, port, spec.queues, spec.exchanges)
        except Exception as exc:  # recorded, so a broken broker shows up as a difference
            outcome["obs"] = {"error": f"{type(exc).__name__}: {exc}"}

    worker = threading.Thread(target=body, name=f"compat-{name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return {"error": "timeout"}
    return normalise(jsonable(outcome["obs"]))


def summarise(obs: Observation) -> str:
    text = json.dumps(obs, sort_keys=True)
    return text if len(text) <= 240 else text[:237] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these scenarios")
    parser.add_argument("--json", metavar="OUT", help="write {name: observation} to this file")
    parser.add_argument(
        "--merge", action="store_true", help="update the --json file instead of replacing it"
    )
    parser.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="add KEY to the '_meta' entry of the --json output (repeatable)",
    )
    parser.add_argument("--list", action="store_true", help="list scenario names and exit")
    args = parser.parse_args(argv)

    if args.list:
        for name, spec in SCENARIOS.items():
            print(f"{name}: {spec.doc.splitlines()[0] if spec.doc else ''}")
        return 0
    names = list(SCENARIOS) if not args.only else args.only
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")

    meta: dict[str, str] = {}
    for item in args.meta:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--meta expects KEY=VALUE, got {item!r}")
        meta[key] = value

    results: dict[str, Observation] = {}
    for name in names:
        results[name] = run_scenario(name, args.host, args.port)
        print(f"{name}: {summarise(results[name])}", flush=True)
    if args.json:
        document: dict[str, Any] = {}
        if args.merge:
            with suppress(FileNotFoundError), open(args.json, encoding="utf-8") as existing:
                document = json.load(existing)
        document.update(results)
        if meta or "_meta" in document:
            document["_meta"] = {**document.get("_meta", {}), **meta}
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2, sort_keys=True)
            out.write("\n")
    return 0
