"""The 406 texts of a redeclaration that adds or drops a compared argument name
the argument's AMQP wire type, as RabbitMQ's do: 'byte' for a one-byte integer
(what pamqp sends for small numbers), 'short', 'unsignedint', 'long', 'binary'...

tests/arg_types_scenario.py declares with tables built octet by octet, against
Warren in memory here; tests/record_rabbitmq_arg_types.py recorded RabbitMQ
3.10.8's answers to the same frames in tests/data/rabbitmq_arg_types.json.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import arg_types_scenario
import pytest
from harness import Harness
from pamqp import commands
from paths import DATA

pytestmark = pytest.mark.timeout(60)

EMPTY = struct.pack(">I", 0)
RECORDED = json.loads((DATA / "rabbitmq_arg_types.json").read_text())["outcomes"]


def test_redeclaration_texts_name_the_wire_type(harness: Harness) -> None:
    with harness.amqp() as client:
        client.handshake()
        client.open_channel(1)
        observed = arg_types_scenario.run(client)
        client.close()
    assert observed.keys() == RECORDED.keys()
    differing = {k: (observed[k], RECORDED[k]) for k in RECORDED if observed[k] != RECORDED[k]}
    assert differing == {}


def test_wire_types_survive_a_restart(tmp_path: Path) -> None:
    # RabbitMQ keeps the typed table of a durable queue; so does Warren's
    # definitions log: the text after a restart names the declared type.
    key, tag, value = "x-max-length", "u", struct.pack(">H", 7)
    table = arg_types_scenario.table(key, tag, value)
    with Harness(tmp_path / "data") as b, b.amqp() as client:
        client.handshake()
        client.open_channel(1)
        client.send(arg_types_scenario.queue_declare(1, "kept", table, durable=True))
        client.expect_method(commands.Queue.DeclareOk, channel=1)
        client.close()
    with Harness(tmp_path / "data") as b, b.amqp() as client:
        client.handshake()
        client.open_channel(1)
        client.send(arg_types_scenario.queue_declare(1, "kept", EMPTY, durable=True))
        code, text, _cls, _meth = client.expect_channel_close(1)
        assert (code, text) == (
            406,
            "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'kept' in "
            "vhost '/': received none but current is the value '7' of type 'unsignedshort'",
        )
        client.close()
