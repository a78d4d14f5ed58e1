"""The wide-mlp example served by LitServe (max_batch_size=16, batch_timeout=0.005).

Runs in the peer venv that ``bench/batching.py`` makes:
``python litserve_app.py EXAMPLE WEIGHTS PORT``.
"""

import sys

import litserve as ls
import numpy as np
import torch
from safetensors.torch import load_file


class WideAPI(ls.LitAPI):
    def setup(self, device):
        sys.path.insert(0, sys.argv[1])
        from model import build

        self.model = build().eval()
        self.model.load_state_dict(load_file(sys.argv[2]))

    def decode_request(self, request):
        return np.asarray(request["x"], dtype=np.float32)

    def batch(self, inputs):
        return np.concatenate(inputs)

    def predict(self, x):
        with torch.inference_mode():
            return self.model(torch.from_numpy(x)).numpy()

    def unbatch(self, output):
        return [output[i : i + 1] for i in range(len(output))]

    def encode_response(self, output):
        return {"y": output.tolist()}


if __name__ == "__main__":
    torch.set_num_threads(1)
    server = ls.LitServer(
        WideAPI(), accelerator="cpu", max_batch_size=16, batch_timeout=0.005, api_path="/invoke"
    )
    server.run(port=int(sys.argv[3]), generate_client_file=False)
