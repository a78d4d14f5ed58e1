"""The ``x-fnrt-*`` HTTP headers, named once for the server and its clients
(``fnrt.client``, the edge client)."""

from __future__ import annotations

# --- on a request ---------------------------------------------------------------------
#: The request's class in its function's queue: high, normal or low.
PRIORITY_HEADER = "x-fnrt-priority"
#: Drop the request (504) if it has not started computing within this many ms.
TIMEOUT_HEADER = "x-fnrt-timeout-ms"
#: A sticky key: during a traffic split, one key is always served by one version.
STICKY_HEADER = "x-fnrt-sticky"

# --- on a request (a pin) and on an answer (who served) ---------------------------------
VERSION_HEADER = "x-fnrt-version"

# --- on an answer ---------------------------------------------------------------------
FUNCTION_HEADER = "x-fnrt-function"
#: On a request that waited for a load: the tier the load came from (l2 disk, l3 store).
COLD_START_HEADER = "x-fnrt-cold-start"
#: "hit" when the answer came from the function's result cache.
CACHE_HEADER = "x-fnrt-cache"
#: "cache" or "function:NAME" when the version's circuit breaker was open.
FALLBACK_HEADER = "x-fnrt-fallback"
#: A split's tail: this node's time for it, in ms.
SERVER_MS_HEADER = "x-fnrt-server-ms"
#: A split's head: the sha256 of its ONNX bytes.
DIGEST_HEADER = "x-fnrt-digest"
#: A generative function's whole answer: why its sequence ended (stop, length, deadline).
FINISH_HEADER = "x-fnrt-finish-reason"
