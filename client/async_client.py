"""The asyncio client: the same calls as :class:`fnrt.client.Client`'s data side, awaited."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from fnrt.client.calls import (
    DEFAULT_URL,
    LIST_PAGE,
    Call,
    Priority,
    invoke_call,
    list_call,
    result_of,
    settle,
)
from fnrt.client.result import Result
from fnrt.client.retry import DEFAULT_RETRY, Attempts, RetryPolicy
from fnrt.functions.codec import Format


class AsyncClient:
    """Talks to one fnrt server from asyncio code; many calls share one connection pool.

    >>> async with AsyncClient("http://127.0.0.1:8000") as fnrt:
    ...     results = await asyncio.gather(*(fnrt.invoke("mlp", x=x) for x in batches))
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout_s: float = 300.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.retry = retry
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=timeout_s, transport=transport
        )
        self._sleep = sleep
        self._rng = rng or random.Random()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def invoke(
        self,
        name: str,
        /,
        inputs: Mapping[str, Any] | None = None,
        *,
        priority: Priority | None = None,
        deadline_s: float | None = None,
        version: str | None = None,
        sticky: str | None = None,
        timeout_s: float | None = None,
        idempotent: bool = True,
        format: Format = Format.MSGPACK,
        headers: Mapping[str, str] | None = None,
        **arrays: Any,
    ) -> Result:
        """Call function ``name``; the options are :meth:`fnrt.client.Client.invoke`'s."""
        call = invoke_call(
            name,
            {**arrays, **(inputs or {})},
            priority=priority,
            deadline_s=deadline_s,
            version=version,
            sticky=sticky,
            timeout_s=timeout_s,
            idempotent=idempotent,
            fmt=format,
            headers=headers,
        )
        return result_of(await self._send(call))

    async def ready(self) -> bool:
        """Whether the server is ready to serve (``/readyz``)."""
        try:
            return (await self._http.get("/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    async def list(self) -> list[dict[str, Any]]:
        """Every deployed function (a page at a time, as many pages as there are)."""
        found, cursor = [], None
        while True:
            page = await self.list_page(cursor=cursor)
            found += page["functions"]
            cursor = page.get("next_cursor")
            if not cursor:
                return found

    async def list_page(self, limit: int = LIST_PAGE, cursor: str | None = None) -> dict[str, Any]:
        """Up to ``limit`` functions after ``cursor`` (the last page's ``next_cursor``)."""
        return await self._json(list_call(limit, cursor))

    async def describe(self, name: str) -> dict[str, Any]:
        return await self._json(Call("GET", f"/v1/functions/{name}", True))

    async def versions(self, name: str) -> dict[str, Any]:
        return await self._json(Call("GET", f"/v1/functions/{name}/versions", True))

    async def _json(self, call: Call) -> dict[str, Any]:
        return dict((await self._send(call)).json())

    async def _send(self, call: Call) -> httpx.Response:
        attempts = Attempts(self.retry, call.idempotent, self._rng)
        while True:
            sent: httpx.Response | httpx.TransportError
            try:
                sent = await self._http.send(call.request(self._http))
            except httpx.TransportError as exc:
                sent = exc
            step = settle(attempts, self.url, sent)
            if isinstance(step, httpx.Response):
                return step
            await self._sleep(step)
