"""What a function is: the handler contract, the manifest, versions and bundles.

This is what a handler imports. It pulls in numpy and msgpack, never torch,
onnxruntime or boto3::

    from fnrt.functions import Handler, per_request
    from fnrt.functions import Chunk, Generator, Sequence   # generative handlers
"""

from fnrt.functions.errors import FnrtError, HandlerError, ManifestError
from fnrt.functions.generation import Chunk, Generator, Sequence
from fnrt.functions.handler import Artifact, Device, Handler, Request, Result, per_request
from fnrt.functions.manifest import (
    BatchingConfig,
    Manifest,
    ScalingConfig,
    TensorSpec,
    load_manifest,
    parse_manifest,
)
from fnrt.functions.version import ArtifactRef, FileRef, VersionManifest

__all__ = [
    "Artifact",
    "ArtifactRef",
    "BatchingConfig",
    "Chunk",
    "Device",
    "FileRef",
    "FnrtError",
    "Generator",
    "Handler",
    "HandlerError",
    "Manifest",
    "ManifestError",
    "Request",
    "Result",
    "ScalingConfig",
    "Sequence",
    "TensorSpec",
    "VersionManifest",
    "load_manifest",
    "parse_manifest",
    "per_request",
]
