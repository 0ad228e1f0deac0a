"""A minimal streaming client for the load generator: one HTTP/1.1 POST on its own connection, its server-sent events
read as they arrive, stdlib asyncio only (a client library's own parsing would be part of what is measured).

    POST /v1/completions HTTP/1.1          ->  HTTP/1.1 200 OK
    Content-Length: N                          Transfer-Encoding: chunked      (uvicorn, for a streamed body)
                                               <hex size>\\r\\n<bytes>\\r\\n ... 0\\r\\n\\r\\n
    {"model": ..., "stream": true, ...}        the bytes: "data: {json}\\n\\n" events, then "data: [DONE]\\n\\n"

post_stream() times each event that carries text (the first is the time to first token; the gaps between them are
the inter-token latencies) and reads the usage of the last chunk. `disconnect_after` closes the connection after
that many text events, as a client that goes away does.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field


@dataclass
class StreamResult:
    status: int = 0
    sent: float = 0.0                                         # time.perf_counter() when the request was sent
    arrivals: list[float] = field(default_factory=list)       # when each event with text arrived
    text: str = ""
    token_ids: list[int] = field(default_factory=list)        # the generated ids, where the request asked for them
    completion_tokens: int | None = None                      # from the usage chunk
    finish_reason: str | None = None
    error: str | None = None                                  # an error body or event, or a broken connection
    disconnected: bool = False                                # we closed it on purpose

    @property
    def ttft(self) -> float | None:
        return self.arrivals[0] - self.sent if self.arrivals else None

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:])]


async def post_stream(host: str, port: int, path: str, body: bytes, disconnect_after: int | None = None,
                      result: StreamResult | None = None) -> StreamResult:
    """POST `body` (sent as is: it may be malformed on purpose) and read the response to its end. `result`, when
    given, is filled as the events arrive (a caller that cancels the read keeps what came)."""
    r = result if result is not None else StreamResult()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        r.sent = time.perf_counter()
        await writer.drain()
        status_line = await reader.readline()
        r.status = int(status_line.split()[1])
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding") != "chunked":          # a plain body: an error, or not streamed
            data = await reader.readexactly(int(headers.get("content-length", 0)))
            if r.status != 200:
                r.error = data.decode(errors="replace")
            return r
        pending = b""
        while size := int((await reader.readline()).strip() or b"0", 16):
            pending += await reader.readexactly(size)
            await reader.readexactly(2)                            # the chunk's trailing \r\n
            *events, pending = pending.split(b"\n\n")
            for ev in events:
                if _event(r, ev) and disconnect_after is not None and len(r.arrivals) >= disconnect_after:
                    r.disconnected = True
                    return r
    except (ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError) as e:
        r.error = f"{type(e).__name__}: {e}"
    finally:
        writer.close()                  # for a disconnect: the server sees the connection go at its next send
    return r


def _event(r: StreamResult, ev: bytes) -> bool:
    """Record one server-sent event; True when it carried text."""
    if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
        return False
    obj = json.loads(ev[6:])
    if "error" in obj:
        r.error = obj["error"].get("message", "error")
        return False
    if obj.get("usage"):
        r.completion_tokens = obj["usage"]["completion_tokens"]
    for c in obj.get("choices", []):
        r.finish_reason = c.get("finish_reason") or r.finish_reason
        r.token_ids += c.get("token_ids") or []                  # vLLM's return_token_ids
        piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
        if piece:
            r.arrivals.append(time.perf_counter())
            r.text += piece
            return True
    return False
