"""KServe's own v2 REST client (``kserve.InferenceRESTClient``) against a real fnrt server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput

from support import LiveServer, live_server, write_function


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp: Path = tmp_path_factory.mktemp("kserve")
    with live_server(tmp) as srv:
        echo = write_function(tmp / "src", "echo")
        srv.deploy(echo)
        yield srv


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def _with_client(server: LiveServer, work):  # type: ignore[no-untyped-def]
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    try:
        return await work(client)
    finally:
        await client.close()


def test_health(server: LiveServer) -> None:
    async def work(client: InferenceRESTClient) -> tuple[bool, bool, bool, bool]:
        return (
            await client.is_server_live(server.url),
            await client.is_server_ready(server.url),
            await client.is_model_ready(server.url, "echo"),
            await client.is_model_ready(server.url, "nope"),
        )

    assert run(_with_client(server, work)) == (True, True, True, False)


@pytest.mark.parametrize("binary", [False, True])
def test_infer(server: LiveServer, binary: bool) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = InferInput("x", [3, 4], "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    outputs = [RequestedOutput("y", parameters={"binary_data": binary})]
    request = InferRequest("echo", [tensor], request_id="k-1", request_outputs=outputs)

    async def work(client: InferenceRESTClient):  # type: ignore[no-untyped-def]
        return await client.infer(server.url, request, model_name="echo")

    response = run(_with_client(server, work))
    assert response.id == "k-1"
    assert response.model_name == "echo"
    (output,) = response.outputs
    assert output.name == "y"
    np.testing.assert_array_equal(output.as_numpy(), x * 2)


def test_errors_carry_the_servers_message(server: LiveServer) -> None:
    tensor = InferInput("x", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), np.float32), binary_data=False)

    async def work(client: InferenceRESTClient):  # type: ignore[no-untyped-def]
        return await client.infer(server.url, InferRequest("echo", [tensor]), model_name="echo")

    with pytest.raises(httpx.HTTPStatusError) as raised:
        run(_with_client(server, work))
    assert raised.value.response.status_code == 422
    assert "input 'x': expected shape [-1, 4], got [1, 3]" in str(raised.value)
