"""Edge split inference: run a model's head on the device, its tail on fnrt (docs/edge.md).

- :mod:`fnrt.edge.client`: the device side (plan data, verified heads, profile, calls)
- :mod:`fnrt.edge.planner`: the split decision, a pure function
- :mod:`fnrt.edge.link`: the moving estimate of RTT and bandwidth
- :mod:`fnrt.edge.transport`: stdlib HTTP, and an emulated slower link
- :mod:`fnrt.edge.activation`: the activation body (float32, float16, int8)
- :mod:`fnrt.edge.cut` and :mod:`fnrt.edge.export`: cutting and exporting models
  (server and development side: they need ``onnx``, and ``torch`` to export)

It imports only ``fnrt.functions`` and ``fnrt.tracing``, so a device installs
numpy, msgpack and onnxruntime alone; the tail endpoint lives in
``fnrt.runtime`` (``runtime/split.py``, ``runtime/http/split.py``).
"""
