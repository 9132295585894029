"""A small etcd v3 client over etcd's JSON gateway (aiohttp, no gRPC stack).

Clustering needs only a handful of etcd's calls: keys (get, put, delete, a
prefix range), leases (grant, keep alive, revoke), a transaction that creates
a key only when it does not exist (the leader election), and watches. etcd
serves all of them as JSON over HTTP at /v3/... since 3.3; keys and values are
base64 in the JSON and 64-bit numbers are strings. The client walks its
endpoint list: a call that cannot reach one endpoint is retried on the next,
so a cluster of three etcd members survives losing one.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

log = logging.getLogger("warren.cluster")


class EtcdError(Exception):
    """etcd refused a call, or no endpoint answered."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class WatchEvent:
    """A change to a watched key: ``deleted`` or a put of ``value``."""

    key: str
    value: bytes
    deleted: bool
    revision: int


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: str) -> str:
    """The range_end that makes a range cover every key starting with ``prefix``."""
    raw = bytearray(prefix.encode())
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return _b64(bytes(raw))
        raw.pop()
    return _b64(b"\0")  # every key


def _kv(item: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_unb64(item.get("key")).decode(),
        value=_unb64(item.get("value")),
        create_revision=int(item.get("create_revision", 0)),
        mod_revision=int(item.get("mod_revision", 0)),
        lease=int(item.get("lease", 0)),
    )


class EtcdClient:
    def __init__(
        self, endpoints: list[str], timeout: float = 5.0, tls: ssl.SSLContext | None = None
    ) -> None:
        """``tls``: the context https:// endpoints are reached with (tls.etcd_context)."""
        if not endpoints:
            raise ValueError("etcd: no endpoints")
        self._tls = tls
        scheme = "https" if tls is not None else "http"
        self._endpoints = [e if "://" in e else f"{scheme}://{e}" for e in endpoints]
        self._current = 0
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        #: The store's revision as of the last answer (a watch from revision + 1
        #: misses nothing that happened after it).
        self.revision = 0

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._tls) if self._tls is not None else None
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(
        self, path: str, body: dict[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        """POST ``body`` to /v3/``path`` on the first endpoint that answers, within
        ``timeout`` seconds for all of them (default: the client's, per endpoint)."""
        errors: list[str] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout is not None else None
        for attempt in range(len(self._endpoints)):
            index = (self._current + attempt) % len(self._endpoints)
            url = f"{self._endpoints[index]}/v3/{path}"
            limit = self._timeout
            if deadline is not None:
                left = deadline - loop.time()
                if left <= 0:
                    errors.append(f"{url}: not tried, out of time")
                    break
                limit = aiohttp.ClientTimeout(total=min(left, self._timeout.total or left))
            try:
                async with self._http().post(url, json=body, timeout=limit) as resp:
                    text = await resp.text()
                    if resp.status != 200:
                        raise EtcdError(f"etcd {path}: HTTP {resp.status}: {text.strip()}")
                    self._current = index
                    result: dict[str, Any] = json.loads(text)
                    if "error" in result:  # some gateway errors come with status 200
                        raise EtcdError(f"etcd {path}: {result['error']}")
                    header = result.get("header") or result.get("result", {}).get("header")
                    if header and "revision" in header:
                        self.revision = int(header["revision"])
                    return result
            except (TimeoutError, aiohttp.ClientError, OSError, ssl.SSLError) as exc:
                errors.append(f"{url}: {type(exc).__name__}: {exc}")
        raise EtcdError("no etcd endpoint answered: " + "; ".join(errors))

    # -- keys -------------------------------------------------------------------------
    async def get(self, key: str) -> KeyValue | None:
        result = await self.call("kv/range", {"key": _b64(key)})
        kvs = result.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        result = await self.call("kv/range", {"key": _b64(prefix), "range_end": prefix_end(prefix)})
        return [_kv(item) for item in result.get("kvs") or []]

    async def put(self, key: str, value: bytes | str, lease: int = 0) -> int:
        """Set ``key``; returns the store's revision after the put."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        result = await self.call("kv/put", body)
        return int(result.get("header", {}).get("revision", 0))

    async def delete(self, key: str) -> int:
        """Delete ``key``; returns how many keys went (0 or 1)."""
        result = await self.call("kv/deleterange", {"key": _b64(key)})
        return int(result.get("deleted", 0))

    async def create(self, key: str, value: bytes | str, lease: int = 0) -> KeyValue | None:
        """Put ``key`` only if it does not exist (one transaction). None when it was
        created; otherwise the key as it is (its holder)."""
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        body = {
            "compare": [
                {"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}
            ],
            "success": [{"request_put": put}],
            "failure": [{"request_range": {"key": _b64(key)}}],
        }
        result = await self.call("kv/txn", body)
        if result.get("succeeded"):
            return None
        for response in result.get("responses") or []:
            kvs = response.get("response_range", {}).get("kvs") or []
            if kvs:
                return _kv(kvs[0])
        # Deleted between the compare and the range: report an empty holder.
        return KeyValue(key, b"", 0, 0, 0)

    async def replace(
        self,
        key: str,
        expected_mod_revision: int,
        value: bytes | str,
        held: tuple[str, int] | None = None,
    ) -> bool:
        """Put ``key`` only if it was last modified at ``expected_mod_revision``
        (0: only if it does not exist) and, with ``held=(other, lease)``, only while
        the key ``other`` is attached to ``lease`` (a leader's write fenced by its
        leadership: once its lease is gone, the write fails). Whether it was put."""
        target: dict[str, Any] = {"key": _b64(key), "result": "EQUAL"}
        if expected_mod_revision:
            target.update(target="MOD", mod_revision=str(expected_mod_revision))
        else:
            target.update(target="CREATE", create_revision="0")
        compare = [target]
        if held is not None:
            other, lease = held
            compare.append(
                {"key": _b64(other), "result": "EQUAL", "target": "LEASE", "lease": str(lease)}
            )
        body = {
            "compare": compare,
            "success": [{"request_put": {"key": _b64(key), "value": _b64(value)}}],
        }
        result = await self.call("kv/txn", body)
        return bool(result.get("succeeded"))

    # -- leases -----------------------------------------------------------------------
    async def grant(self, ttl: int) -> int:
        result = await self.call("lease/grant", {"TTL": str(ttl)})
        return int(result["ID"])

    async def keepalive(self, lease: int, timeout: float | None = None) -> int:
        """Refresh ``lease`` once; its remaining TTL (0 or less: it has expired)."""
        result = await self.call("lease/keepalive", {"ID": str(lease)}, timeout)
        return int(result.get("result", {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """End ``lease`` now (its keys go with it); an unknown lease is no error."""
        try:
            await self.call("lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if "not found" not in str(exc):
                raise

    # -- watches ----------------------------------------------------------------------
    async def watch(
        self, key: str, start_revision: int = 0, prefix: bool = False
    ) -> AsyncIterator[WatchEvent]:
        """Yield the changes to ``key`` (or every key under it with ``prefix``) from
        ``start_revision`` (0: from now) until the caller stops iterating. Raises
        EtcdError when the stream breaks; the caller watches again from the
        revision after the last event it saw."""
        request: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            request["range_end"] = prefix_end(key)
        if start_revision:
            request["start_revision"] = str(start_revision)
        url = f"{self._endpoints[self._current]}/v3/watch"
        try:
            async with self._http().post(
                url,
                json={"create_request": request},
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeout.total),
            ) as resp:
                if resp.status != 200:
                    raise EtcdError(f"etcd watch: HTTP {resp.status}")
                buffer = b""
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        for event in _watch_events(line):
                            yield event
                    # The gateway may also send objects without newlines between.
                    while buffer.strip():
                        try:
                            decoded = json.loads(buffer)
                        except ValueError:
                            break
                        buffer = b""
                        for event in _watch_events_from(decoded):
                            yield event
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self._current = (self._current + 1) % len(self._endpoints)
            raise EtcdError(f"etcd watch broke: {type(exc).__name__}: {exc}") from exc
        raise EtcdError("etcd watch: the stream ended")


def _watch_events(line: bytes) -> list[WatchEvent]:
    line = line.strip()
    if not line:
        return []
    return _watch_events_from(json.loads(line))


def _watch_events_from(decoded: dict[str, Any]) -> list[WatchEvent]:
    if "error" in decoded:
        raise EtcdError(f"etcd watch: {decoded['error']}")
    result = decoded.get("result", {})
    if result.get("canceled"):
        raise EtcdError(f"etcd watch canceled: {result.get('cancel_reason', '')}")
    events = []
    for item in result.get("events") or []:
        kv = item.get("kv", {})
        events.append(
            WatchEvent(
                key=_unb64(kv.get("key")).decode(),
                value=_unb64(kv.get("value")),
                deleted=item.get("type") == "DELETE",
                revision=int(kv.get("mod_revision", 0)),
            )
        )
    return events
