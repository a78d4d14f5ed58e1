from __future__ import annotations

from pathlib import Path

import pytest

from fnrt.functions.errors import HandlerError
from fnrt.functions.handler import Device, Handler, check_contract, per_request


def test_per_request_wraps_a_function_of_one_request() -> None:
    @per_request
    def double(request):  # type: ignore[no-untyped-def]
        return {"y": request["x"] * 2}

    check_contract(double, "double")
    assert double([{"x": 1}, {"x": 2}]) == [{"y": 2}, {"y": 4}]
    assert double.__name__ == "double"


def test_handler_subclass_must_override_call() -> None:
    class Nothing(Handler):
        pass

    class Something(Handler):
        def __call__(self, batch):  # type: ignore[no-untyped-def]
            return batch

    with pytest.raises(HandlerError, match="must define __call__"):
        check_contract(Nothing, "Nothing")
    check_contract(Something, "Something")
    with pytest.raises(HandlerError, match="not a handler"):
        check_contract(42, "answer")


def test_a_handler_class_must_construct_with_no_arguments_however_it_constructs() -> None:
    class Call:
        def __call__(self, batch):  # type: ignore[no-untyped-def]
            return batch

    class Init(Call):
        def __init__(self, size: int) -> None:
            self.size = size

    class New(Call):
        def __new__(cls, size: int) -> New:
            return super().__new__(cls)

    class Meta(type):
        def __call__(cls, size: int) -> object:  # type: ignore[override]
            return super().__call__()

    class Metaclassed(Call, metaclass=Meta):
        pass

    class Defaults(Call):
        def __init__(self, size: int = 4) -> None:
            self.size = size

    check_contract(Call, "Call")  # object's own construction: known without a signature
    check_contract(Defaults, "Defaults")
    for cls in (Init, New, Metaclassed):
        with pytest.raises(HandlerError, match="constructible with no arguments"):
            check_contract(cls, cls.__name__)


def test_device_strings() -> None:
    assert Device().torch == "cpu"
    assert Device().onnx_providers == ["CPUExecutionProvider"]
    assert Device("cuda", 1).torch == "cuda:1"
    assert Device("cuda", 1).onnx_providers[0] == ("CUDAExecutionProvider", {"device_id": 1})


def test_a_handler_class_with_forward_needs_no_call() -> None:
    class Staged(Handler):
        def forward(self, inputs):  # type: ignore[no-untyped-def]
            return inputs

    class AsyncForward:
        async def forward(self, inputs):  # type: ignore[no-untyped-def]
            return inputs

    class TwoArguments:
        def forward(self, inputs, extra):  # type: ignore[no-untyped-def]
            return inputs

    check_contract(Staged, "Staged")
    with pytest.raises(HandlerError, match="forward must be a plain function"):
        check_contract(AsyncForward, "AsyncForward")
    with pytest.raises(HandlerError, match="forward must take one argument: the batched inputs"):
        check_contract(TwoArguments, "TwoArguments")


def test_a_forward_handler_with_inputs_without_rows_is_refused_at_import(tmp_path: Path) -> None:
    from fnrt.functions.handler import import_handler
    from fnrt.functions.manifest import load_manifest
    from support import write_function

    handler = "class Staged:\n    def forward(self, inputs):\n        return inputs\n"
    manifest = """
name = "{name}"
handler = "handler:Staged"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}
image = {{ dtype = "float32", shape = [3, 8, 8] }}
"""
    folder = write_function(tmp_path, "staged", handler, manifest)
    with pytest.raises(HandlerError, match=r"forward\(inputs\).*not so: image"):
        import_handler(folder, load_manifest(folder), "fnrt_test_staged_refused")
