"""The wide-mlp example served by Ray Serve with ``@serve.batch`` (16, 5 ms).

Runs in the peer venv that ``bench/batching.py`` makes:
``python ray_app.py EXAMPLE WEIGHTS PORT``.
"""

import sys
import time

import numpy as np
import ray
import torch
from ray import serve
from safetensors.torch import load_file
from starlette.requests import Request

EXAMPLE, WEIGHTS, PORT = sys.argv[1], sys.argv[2], int(sys.argv[3])


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=64)
class Wide:
    def __init__(self) -> None:
        torch.set_num_threads(1)
        sys.path.insert(0, EXAMPLE)
        from model import build

        self.model = build().eval()
        self.model.load_state_dict(load_file(WEIGHTS))

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.005)
    async def run(self, xs: list[np.ndarray]) -> list[list]:
        x = np.concatenate(xs)
        with torch.inference_mode():
            y = self.model(torch.from_numpy(x)).numpy()
        return [y[i : i + 1].tolist() for i in range(len(xs))]

    async def __call__(self, request: Request) -> dict:
        data = await request.json()
        return {"y": await self.run(np.asarray(data["x"], dtype=np.float32))}


if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    serve.run(Wide.bind(), route_prefix="/invoke")
    print("ready", flush=True)
    while True:
        time.sleep(3600)
