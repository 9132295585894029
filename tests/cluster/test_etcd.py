"""warren.cluster.etcd against a real etcd: keys, the create-if-absent
transaction the election uses, leases (keep alive, revoke, expiry), watches,
compare-and-swap, and falling over to the next endpoint."""

from __future__ import annotations

import asyncio

import pytest
from etcd_proc import EtcdProcess, free_port

from warren.cluster.etcd import EtcdClient, EtcdError, WatchEvent


def _run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_keys_round_trip_binary_values_and_prefixes(etcd: EtcdProcess) -> None:
    async def main() -> None:
        client = EtcdClient([etcd.url])
        try:
            assert await client.get("w/a") is None
            rev = await client.put("w/a", b"\x00\xffbinary")
            assert rev > 0
            await client.put("w/b", "text")
            await client.put("wx", "outside the prefix")
            got = await client.get("w/a")
            assert got is not None and got.value == b"\x00\xffbinary"
            assert got.mod_revision == rev
            assert [kv.key for kv in await client.get_prefix("w/")] == ["w/a", "w/b"]
            assert await client.delete("w/a") == 1
            assert await client.delete("w/a") == 0
            assert [kv.key for kv in await client.get_prefix("w/")] == ["w/b"]
        finally:
            await client.close()

    _run(main())


def test_create_is_won_once_and_freed_by_revoking_the_lease(etcd: EtcdProcess) -> None:
    async def main() -> None:
        client = EtcdClient([etcd.url])
        try:
            lease = await client.grant(10)
            assert await client.keepalive(lease) > 0
            assert await client.create("leader", b"node-1", lease) is None
            holder = await client.create("leader", b"node-2")
            assert holder is not None and holder.value == b"node-1" and holder.lease == lease
            await client.revoke(lease)
            await client.revoke(lease)  # twice: no error
            assert await client.get("leader") is None
            assert await client.keepalive(lease) <= 0
            assert await client.create("leader", b"node-2") is None
        finally:
            await client.close()

    _run(main())


def test_an_expired_lease_takes_its_key_and_the_watch_sees_it(etcd: EtcdProcess) -> None:
    async def main() -> None:
        client = EtcdClient([etcd.url])
        try:
            lease = await client.grant(2)  # no keepalive: expires on its own
            assert await client.create("leader", b"n1", lease) is None
            start = await client.get("leader")
            assert start is not None
            async for event in client.watch("leader", start.mod_revision + 1):
                assert event.deleted and event.key == "leader"
                break
            assert await client.get("leader") is None
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_watch_replays_from_a_revision_in_order(etcd: EtcdProcess) -> None:
    async def main() -> None:
        client = EtcdClient([etcd.url])
        try:
            first = await client.put("isr/a", b"1")
            await client.put("isr/b", b"2")
            await client.delete("isr/a")
            await client.put("other", b"x")
            seen: list[WatchEvent] = []
            async for event in client.watch("isr/", first, prefix=True):
                seen.append(event)
                if len(seen) == 3:
                    break
            assert [(e.key, e.value, e.deleted) for e in seen] == [
                ("isr/a", b"1", False),
                ("isr/b", b"2", False),
                ("isr/a", b"", True),
            ]
            assert seen[0].revision == first
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_replace_is_compare_and_swap(etcd: EtcdProcess) -> None:
    async def main() -> None:
        client = EtcdClient([etcd.url])
        try:
            assert await client.replace("isr", 0, b"a,b")
            assert not await client.replace("isr", 0, b"x")  # exists now
            kv = await client.get("isr")
            assert kv is not None
            assert await client.replace("isr", kv.mod_revision, b"a")
            assert not await client.replace("isr", kv.mod_revision, b"b")  # stale
            kv2 = await client.get("isr")
            assert kv2 is not None and kv2.value == b"a"
        finally:
            await client.close()

    _run(main())


def test_replace_held_by_a_lease_fails_once_another_lease_holds_the_key(
    etcd: EtcdProcess,
) -> None:
    """The ISR write is fenced by leadership: a leader whose lease is gone (and whose
    key a successor now holds) cannot write it, whatever revision it read."""

    async def main() -> None:
        client = EtcdClient([etcd.url])
        try:
            old = await client.grant(10)
            assert await client.create("leader", b"old", old) is None
            assert await client.replace("isr", 0, b"old,b,c", held=("leader", old))
            kv = await client.get("isr")
            assert kv is not None
            await client.revoke(old)  # its lease ends: the key goes
            assert not await client.replace("isr", kv.mod_revision, b"old", held=("leader", old))
            new = await client.grant(10)
            assert await client.create("leader", b"new", new) is None
            assert not await client.replace("isr", kv.mod_revision, b"old", held=("leader", old))
            assert await client.replace("isr", kv.mod_revision, b"new", held=("leader", new))
            stored = await client.get("isr")
            assert stored is not None and stored.value == b"new"
        finally:
            await client.close()

    _run(main())


def test_a_dead_endpoint_falls_over_to_the_next(etcd: EtcdProcess) -> None:
    async def main() -> None:
        dead = f"http://127.0.0.1:{free_port()}"
        client = EtcdClient([dead, etcd.url], timeout=2)
        try:
            await client.put("k", b"v")
            kv = await client.get("k")
            assert kv is not None and kv.value == b"v"
        finally:
            await client.close()
        nowhere = EtcdClient([dead], timeout=2)
        try:
            with pytest.raises(EtcdError, match="no etcd endpoint answered"):
                await nowhere.get("k")
        finally:
            await nowhere.close()

    _run(main())
