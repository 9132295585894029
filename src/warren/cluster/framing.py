"""Reading replication frames from an asyncio stream (the codec stays sans-IO)."""

from __future__ import annotations

import asyncio
from collections import deque

from warren.cluster import codec as c


class FrameReader:
    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._decoder = c.Decoder()
        self._frames: deque[c.Frame] = deque()

    async def next(self) -> c.Frame:
        """The next frame; ConnectionError when the peer closed, ProtocolError on garbage."""
        while not self._frames:
            data = await self._reader.read(256 * 1024)
            if not data:
                raise ConnectionError("connection closed by the peer")
            self._frames.extend(self._decoder.feed(data))
        return self._frames.popleft()

    async def batch(self) -> list[c.Frame]:
        """Every frame that is complete after (at most) one more read."""
        if not self._frames:
            data = await self._reader.read(256 * 1024)
            if not data:
                raise ConnectionError("connection closed by the peer")
            self._frames.extend(self._decoder.feed(data))
        frames = list(self._frames)
        self._frames.clear()
        return frames
