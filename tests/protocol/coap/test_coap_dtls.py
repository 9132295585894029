"""CoAP over DTLS (coaps://, PSK) with aiocoap's DTLS client (tinydtls through
DTLSSocket) against an embedded broker: publish and observe as the PSK
identity's user, a wrong key or an unknown identity gets no session."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("DTLSSocket", reason="DTLSSocket (make test installs it)")

import aiocoap  # noqa: E402
from aiocoap import Code, Message  # noqa: E402
from coaphelp import HOST  # noqa: E402
from mqttclient import Client  # noqa: E402

from warren.pytest_plugin import WarrenBroker, start_broker  # noqa: E402


@pytest.fixture(scope="module")
def warren(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarrenBroker]:
    psk = tmp_path_factory.mktemp("coaps") / "psk"
    psk.write_text("# identity:key\ndev:dev-secret-key\nghost:no-such-user\n")
    broker = start_broker(
        http_port=-1,
        prometheus_port=-1,
        stream_port=-1,
        coap_dtls_enabled=True,
        coap_dtls_port=0,
        coap_dtls_psk_file=str(psk),
        auth_failure_delay=0,
    )

    def users() -> None:
        u = broker.broker.users
        u.add_user("dev", "unused-password")
        u.set_permissions("dev", "/")
        u.set_topic_permission("dev", "/", "amq.topic", write="^dev\\.", read="^dev\\.")

    broker.call(users)
    try:
        yield broker
    finally:
        broker.stop()


def base(warren: WarrenBroker) -> str:
    listener = warren.broker.listener("coaps")
    assert listener is not None
    return f"coaps://{HOST}:{listener.port}/ps"


def run(warren: WarrenBroker, identity: bytes, key: bytes, coro_fn: Any) -> Any:
    async def main() -> Any:
        ctx = await aiocoap.Context.create_client_context()
        ctx.client_credentials.load_from_dict(
            {f"{base(warren)}/*": {"dtls": {"psk": key, "client-identity": identity}}}
        )
        try:
            return await asyncio.wait_for(coro_fn(ctx), 30)
        finally:
            await ctx.shutdown()

    return asyncio.run(main())


def test_publish_and_observe_over_dtls(warren: WarrenBroker) -> None:
    sub = Client(warren.mqtt_port, client_id="coaps-sub")
    sub.connect()
    sub.subscribe("dev/#", qos=1)
    pub = Client(warren.mqtt_port, client_id="coaps-pub")
    pub.connect()

    async def exchange(ctx: aiocoap.Context) -> list[Any]:
        url = base(warren)
        posted = await ctx.request(
            Message(code=Code.POST, uri=f"{url}/dev/t/1", payload=b"21.5")
        ).response
        observing = ctx.request(Message(code=Code.GET, uri=f"{url}/dev/+/cmd", observe=0))
        first = await observing.response
        await asyncio.to_thread(pub.publish, "dev/a/cmd", b"on", 1)
        note = await observing.observation.__aiter__().__anext__()
        observing.observation.cancel()
        refused = await ctx.request(
            Message(code=Code.POST, uri=f"{url}/other/t", payload=b"x")
        ).response
        spoofed = await ctx.request(
            Message(code=Code.POST, uri=f"{url}/dev/t/2?u=guest&p=guest", payload=b"x")
        ).response
        return [posted.code, first.code, note.payload, refused.code, spoofed.code]

    try:
        codes = run(warren, b"dev", b"dev-secret-key", exchange)
        assert codes == [Code.CHANGED, Code.CONTENT, b"on", Code.FORBIDDEN, Code.UNAUTHORIZED]
        got = sub.next()
        assert (got.topic, got.payload, got.qos) == ("dev/t/1", b"21.5", 1)
    finally:
        sub.close()
        pub.close()


@pytest.mark.parametrize(
    ("identity", "key", "code"),
    [
        (b"dev", b"wrong-key", None),  # no session: the request gets no answer
        (b"nobody", b"dev-secret-key", None),  # no key for the identity
        (b"ghost", b"no-such-user", Code.UNAUTHORIZED),  # a session, but no user
    ],
)
def test_no_session_or_no_user(
    warren: WarrenBroker, identity: bytes, key: bytes, code: Any
) -> None:
    async def post(ctx: aiocoap.Context) -> Any:
        req = Message(code=Code.POST, uri=f"{base(warren)}/dev/t/3", payload=b"x")
        try:
            # A wrong key goes unanswered (its Finished does not decrypt): a
            # short wait, which a handshake that should succeed does not get.
            wait = 5 if code is None else 30
            return (await asyncio.wait_for(ctx.request(req).response, wait)).code
        except (aiocoap.error.Error, TimeoutError):
            return None

    assert run(warren, identity, key, post) == code


def test_the_psk_file_is_checked(tmp_path: Path) -> None:
    from warren.coap.dtls import load_psk_file

    good = tmp_path / "good"
    good.write_text("a:b:c\n\n# comment\nd:e\n")
    assert load_psk_file(str(good)) == {b"a": b"b:c", b"d": b"e"}
    bad = tmp_path / "bad"
    for text in ("no-separator\n", "dev:" + "k" * 17 + "\n", "i" * 33 + ":key\n"):
        bad.write_text(text)
        with pytest.raises(ValueError, match="bad:1"):
            load_psk_file(str(bad))
