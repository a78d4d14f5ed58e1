"""Edge split inference (run a model's head on the device, its tail on fnrt).

Reserved for the edge issue; it may import only ``fnrt.functions`` and
``fnrt.tracing``, so a device installs numpy, msgpack and onnxruntime alone.
"""
