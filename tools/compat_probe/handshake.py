"""Scenarios: the protocol header, connection.start, authentication, the vhost and
tuning.
"""

from __future__ import annotations

import time
from typing import Any

from pamqp import commands
from pamqp import encode as pencode
from pamqp import frame as pframe

from .common import (
    CLIENT_CAPABILITIES,
    FRAME_HEARTBEAT,
    PROTOCOL_HEADER,
    Observation,
    jsonable,
    scenario,
)
from .raw import describe, raw_client, raw_frame

# ======================================================================================
# Scenarios: protocol header and connection.start
# ======================================================================================


def header_probe(host: str, port: int, data: bytes) -> Observation:
    with raw_client(host, port) as client:
        client.send(data)
        return client.observe()


@scenario()
def s_header_amqp_0_9_0(host: str, port: int) -> Observation:
    """Protocol header with revision 0 (AMQP 0-9-0)."""
    return header_probe(host, port, b"AMQP\x00\x00\x09\x00")


@scenario()
def s_header_http(host: str, port: int) -> Observation:
    """Eight bytes of HTTP instead of a protocol header."""
    return header_probe(host, port, b"HTTP/1.1")


@scenario()
def s_header_amqp_0_9_old_style(host: str, port: int) -> Observation:
    """The pre-0-9-1 header layout 'AMQP' 1 1 0 9 (AMQP 0-9)."""
    return header_probe(host, port, b"AMQP\x01\x01\x00\x09")


@scenario()
def s_header_amqp_1_0(host: str, port: int) -> Observation:
    """An AMQP 1.0 protocol header."""
    return header_probe(host, port, b"AMQP\x00\x01\x00\x00")


@scenario()
def s_header_amqp_0_10(host: str, port: int) -> Observation:
    """An AMQP 0-10 protocol header."""
    return header_probe(host, port, b"AMQP\x01\x01\x00\x0a")


@scenario()
def s_header_then_frame_without_waiting(host: str, port: int) -> Observation:
    """Protocol header immediately followed by a start-ok in the same write."""
    with raw_client(host, port) as client:
        props: dict[str, Any] = {"product": "compat-probe", "capabilities": CLIENT_CAPABILITIES}
        start_ok = pframe.marshal(
            commands.Connection.StartOk(client_properties=props, response="\x00guest\x00guest"), 0
        )
        client.send(PROTOCOL_HEADER + start_ok)
        obs = client.observe()
    return obs


@scenario()
def s_server_properties(host: str, port: int) -> Observation:
    """connection.start contents and the connection.tune proposal."""
    with raw_client(host, port) as client:
        start = client.start_ok()
        tune = client.expect("Connection.Tune", 0)
        props = start.server_properties
        return {
            "version": [start.version_major, start.version_minor],
            "server_properties_keys": sorted(props),
            "capabilities": jsonable(props.get("capabilities")),
            "mechanisms": jsonable(start.mechanisms),
            "locales": jsonable(start.locales),
            "tune": {
                "channel_max": tune.channel_max,
                "frame_max": tune.frame_max,
                "heartbeat": tune.heartbeat,
            },
        }


# ======================================================================================
# Scenarios: authentication, vhost, tuning
# ======================================================================================


def _auth_probe(
    host: str,
    port: int,
    *,
    mechanism: str = "PLAIN",
    response: str,
    capabilities: dict[str, Any] | None = None,
) -> Observation:
    """Start-ok with the given credentials; a successful login is carried on to
    connection.open-ok and a channel ping, a failed one observed until EOF."""
    with raw_client(host, port) as client:
        client.start_ok(mechanism=mechanism, response=response, capabilities=capabilities)
        began = time.monotonic()
        got = client.next_frame()
        if got.kind == "frame" and getattr(got.frame, "name", "") == "Connection.Tune":
            tune = got.frame
            client.method(
                0,
                commands.Connection.TuneOk(
                    channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
                ),
            )
            client.method(0, commands.Connection.Open(virtual_host="/"))
            client.expect("Connection.OpenOk", 0)
            client.method(1, commands.Channel.Open())
            client.expect("Channel.OpenOk", 1)
            return {"logged_in": True, **client.observe(ping=1)}
        if got.kind == "eof":
            return {"logged_in": False, **_eof_observation([], began)}
        if got.kind == "timeout":
            return {"logged_in": False, "received": [], "socket": "open"}
        first = describe(got.channel, got.frame)
        if first.get("frame") == "Connection.Close":
            client.method(0, commands.Connection.CloseOk())
        obs = client.observe()
        return {"logged_in": False, **obs, "received": [first, *obs["received"]]}


def _eof_observation(received: list[dict[str, Any]], began: float) -> Observation:
    obs: Observation = {"received": received, "socket": "closed"}
    elapsed = time.monotonic() - began
    if elapsed >= 1.0:
        obs["socket_closed_after_s"] = round(elapsed)
    return obs


def _amqplain(login: str, password: str) -> str:
    """An AMQPLAIN response: a field table without its length prefix (ASCII only)."""
    table = pencode.field_table({"LOGIN": login, "PASSWORD": password})[4:]
    return table.decode("ascii")


NO_CLOSE_CAPABILITIES = {
    k: v for k, v in CLIENT_CAPABILITIES.items() if k != "authentication_failure_close"
}


@scenario()
def s_auth_plain_wrong_password(host: str, port: int) -> Observation:
    """PLAIN, wrong password, client advertises authentication_failure_close."""
    return _auth_probe(host, port, response="\x00guest\x00wrong")


@scenario()
def s_auth_plain_wrong_password_no_capability(host: str, port: int) -> Observation:
    """PLAIN, wrong password, client does not advertise authentication_failure_close."""
    return _auth_probe(
        host, port, response="\x00guest\x00wrong", capabilities=NO_CLOSE_CAPABILITIES
    )


@scenario()
def s_auth_plain_wrong_password_no_client_properties_capabilities(
    host: str, port: int
) -> Observation:
    """PLAIN, wrong password, client properties without any capabilities table."""
    return _auth_probe(host, port, response="\x00guest\x00wrong", capabilities={})


@scenario()
def s_auth_plain_unknown_user(host: str, port: int) -> Observation:
    """PLAIN, user that does not exist (with authentication_failure_close)."""
    return _auth_probe(host, port, response="\x00compat-nobody\x00guest")


@scenario()
def s_auth_plain_authzid(host: str, port: int) -> Observation:
    """PLAIN with an authorisation identity before the first NUL."""
    return _auth_probe(host, port, response="guest\x00guest\x00guest")


@scenario()
def s_auth_plain_malformed(host: str, port: int) -> Observation:
    """PLAIN response without NUL separators."""
    return _auth_probe(host, port, response="guestguest")


@scenario()
def s_auth_plain_empty_response(host: str, port: int) -> Observation:
    """PLAIN with an empty response."""
    return _auth_probe(host, port, response="")


@scenario()
def s_auth_amqplain_success(host: str, port: int) -> Observation:
    """AMQPLAIN with the right credentials."""
    return _auth_probe(host, port, mechanism="AMQPLAIN", response=_amqplain("guest", "guest"))


@scenario()
def s_auth_amqplain_wrong_password(host: str, port: int) -> Observation:
    """AMQPLAIN with a wrong password."""
    return _auth_probe(host, port, mechanism="AMQPLAIN", response=_amqplain("guest", "wrong"))


@scenario()
def s_auth_unknown_mechanism(host: str, port: int) -> Observation:
    """A mechanism the server did not offer."""
    return _auth_probe(host, port, mechanism="COMPAT-BOGUS", response="\x00guest\x00guest")


@scenario()
def s_auth_external_mechanism(host: str, port: int) -> Observation:
    """EXTERNAL (not offered without the auth-mechanism-ssl plugin)."""
    return _auth_probe(host, port, mechanism="EXTERNAL", response="")


@scenario()
def s_open_missing_vhost(host: str, port: int) -> Observation:
    """connection.open to a vhost that does not exist."""
    with raw_client(host, port) as client:
        client.start_ok()
        tune = client.expect("Connection.Tune", 0)
        client.method(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        client.method(0, commands.Connection.Open(virtual_host="compat-missing-vhost"))
        return client.observe()


def _tune_probe(
    host: str,
    port: int,
    *,
    channel_max: int | None = None,
    frame_max: int | None = None,
    heartbeat: int = 0,
) -> Observation:
    """Tune-ok with the given values, then connection.open and a channel ping."""
    with raw_client(host, port) as client:
        client.start_ok()
        tune = client.expect("Connection.Tune", 0)
        client.method(
            0,
            commands.Connection.TuneOk(
                channel_max=tune.channel_max if channel_max is None else channel_max,
                frame_max=tune.frame_max if frame_max is None else frame_max,
                heartbeat=heartbeat,
            ),
        )
        client.method(0, commands.Connection.Open(virtual_host="/"))
        client.method(1, commands.Channel.Open())
        return client.observe(ping=1)


@scenario()
def s_tune_frame_max_below_minimum(host: str, port: int) -> Observation:
    """tune-ok frame_max=1024 (< 4096, the protocol's frame-min-size)."""
    return _tune_probe(host, port, frame_max=1024)


@scenario()
def s_tune_frame_max_minimum(host: str, port: int) -> Observation:
    """tune-ok frame_max=4096 exactly."""
    return _tune_probe(host, port, frame_max=4096)


@scenario()
def s_tune_frame_max_zero(host: str, port: int) -> Observation:
    """tune-ok frame_max=0 ('no limit') while the server proposed a limit."""
    return _tune_probe(host, port, frame_max=0)


@scenario()
def s_tune_frame_max_above_server(host: str, port: int) -> Observation:
    """tune-ok frame_max larger than the server proposed."""
    return _tune_probe(host, port, frame_max=1048576)


@scenario()
def s_tune_channel_max_above_server(host: str, port: int) -> Observation:
    """tune-ok channel_max=65535, above the server's proposal."""
    return _tune_probe(host, port, channel_max=65535)


@scenario()
def s_tune_channel_max_zero(host: str, port: int) -> Observation:
    """tune-ok channel_max=0 ('no limit')."""
    return _tune_probe(host, port, channel_max=0)


@scenario()
def s_tune_channel_max_small(host: str, port: int) -> Observation:
    """tune-ok channel_max=10 (fine)."""
    return _tune_probe(host, port, channel_max=10)


@scenario()
def s_tune_heartbeat_above_server(host: str, port: int) -> Observation:
    """tune-ok heartbeat=600, above the server's proposal."""
    return _tune_probe(host, port, heartbeat=600)


@scenario()
def s_tune_heartbeat_zero_no_heartbeats(host: str, port: int) -> Observation:
    """Heartbeat 0: no heartbeat frame arrives during 2.5 s of silence."""
    with raw_client(host, port) as client:
        client.handshake(heartbeat=0)
        got = client.read(2.5)
        return {
            "first_event": got.kind if got.kind != "frame" else describe(got.channel, got.frame)
        }


@scenario()
def s_tune_heartbeat_1_silent_client(host: str, port: int) -> Observation:
    """Heartbeat 1 s and a client that never sends anything: frames seen, then the socket's fate."""
    with raw_client(host, port) as client:
        client.handshake(heartbeat=1)
        kinds: set[str] = set()
        deadline = time.monotonic() + 10.0
        fate = "open"
        while time.monotonic() < deadline:
            got = client.read(max(0.1, deadline - time.monotonic()))
            if got.kind == "eof":
                fate = "closed"
                break
            if got.kind == "timeout":
                break
            desc = describe(got.channel, got.frame)
            kinds.add(f"{desc.get('frame', 'raw')}@{got.channel}")
            if desc.get("frame") == "Connection.Close":
                kinds.add(f"Connection.Close {desc['reply_code']} {desc['reply_text']}")
        return {"frames_seen": sorted(kinds), "socket_within_10s": fate}


@scenario()
def s_tune_heartbeat_1_client_heartbeats(host: str, port: int) -> Observation:
    """Heartbeat 1 s and a client that heartbeats every 0.4 s: still open after 4 s."""
    with raw_client(host, port) as client:
        client.handshake(heartbeat=1)
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            client.send(raw_frame(FRAME_HEARTBEAT, 0, b""))
            got = client.read(0.4)
            if got.kind == "eof":
                return {"socket": "closed"}
        return client.observe(ping=1)
