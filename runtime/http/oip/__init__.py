"""The Open Inference Protocol v2 (KServe, Triton) over HTTP, binary tensor extension included."""
