from __future__ import annotations

from pathlib import Path

import pytest

from fnrt.functions.errors import ManifestError
from fnrt.functions.manifest import BatchingConfig, TensorSpec, load_manifest, parse_manifest

BASE = {"name": "mlp", "handler": "handler:Model"}


def test_defaults_and_round_trip() -> None:
    m = parse_manifest({**BASE, "inputs": {"x": {"dtype": "float32", "shape": [-1, 64]}}})
    assert m.batching == BatchingConfig(max_batch_size=8, max_wait_ms=0.0)
    assert m.scaling.keep_alive_s == 300
    assert m.inputs["x"] == TensorSpec("float32", (-1, 64))
    assert parse_manifest(m.to_dict()) == m
    assert (m.module, m.attribute) == ("handler", "Model")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "Bad Name"}, "name"),
        ({"name": None}, "name"),
        ({"handler": "handler"}, "handler"),
        ({"handler": "handler:1x"}, "handler"),
        ({"handlr": "x"}, "handlr"),
        ({"artifacts": {"w": "../outside.bin"}}, "artifacts.w"),
        ({"artifacts": {"w": "/abs.bin"}}, "artifacts.w"),
        ({"artifacts": {"w": 3}}, "artifacts.w"),
        ({"inputs": {"x": {"dtype": "float31", "shape": [1]}}}, "inputs.x.dtype"),
        ({"inputs": {"x": {"dtype": "float32", "shape": [-2]}}}, "inputs.x.shape"),
        ({"inputs": {"x": {"dtype": "float32", "shape": "1,2"}}}, "inputs.x.shape"),
        ({"inputs": {"x": {"dtype": "float32"}}}, "inputs.x.shape"),
        ({"outputs": {"y": 3}}, "outputs.y"),
        ({"batching": {"max_batch_size": 0}}, "batching.max_batch_size"),
        ({"batching": {"max_wait_ms": -1}}, "batching.max_wait_ms"),
        ({"batching": {"max_wait": 1}}, "batching.max_wait"),
        ({"batching": []}, "batching"),
        ({"scaling": {"keep_alive_s": -5}}, "scaling.keep_alive_s"),
        ({"scaling": {"max_queue": 0}}, "scaling.max_queue"),
        ({"scaling": {"load_at_start": "yes"}}, "scaling.load_at_start"),
        ({"exclude": "*.txt"}, "exclude"),
        ({"rollout": {"policy": "yolo"}}, "rollout.policy"),
        ({"rollout": {"steps_percent": [50, 10, 100]}}, "rollout.steps_percent"),
        ({"rollout": {"steps_percent": [10, 50]}}, "rollout.steps_percent"),
        ({"rollout": {"max_error_rate": 2}}, "rollout.max_error_rate"),
        ({"rollout": {"max_p99_ratio": 0.5}}, "rollout.max_p99_ratio"),
        ({"rollout": {"probe_file": "../probe.json"}}, "rollout.probe_file"),
        ({"rollout": {"dwell_s": -1}}, "rollout.dwell_s"),
        ({"breaker": {"fallback": "function:Bad Name"}}, "breaker.fallback"),
        ({"breaker": {"fallback": "retry"}}, "breaker.fallback"),
        ({"breaker": {"open_error_rate": 0}}, "breaker.open_error_rate"),
        ({"breaker": {"half_open_probes": 0}}, "breaker.half_open_probes"),
        ({"breaker": {"window_s": 0}}, "breaker.window_s"),
        ({"split": {"model": "model", "points": "a"}}, "split.points"),
        ({"split": {"model": "model", "points": ["a", "a"]}}, "split.points"),
        ({"split": {"model": "model", "points": ["a b"]}}, "split.points"),
        ({"split": {"points": ["a"]}}, "split.model"),
        ({"split": {"model": "model", "points": ["a"]}}, "split.model"),  # not an artifact
        ({"split": {"model": "model", "points": ["a"], "cut": 1}}, "split.cut"),
        ({"environment": {"requirements": "humanize"}}, "environment.requirements"),
        ({"environment": {"requirements": ["-r other.txt"]}}, "environment.requirements"),
        ({"environment": {"requirements": [""]}}, "environment.requirements"),
        ({"environment": {"requirements_file": "../reqs.txt"}}, "environment.requirements_file"),
        ({"environment": {"python": "3.12"}}, "environment.python"),
        (
            {"environment": {"requirements": ["x"]}, "isolation": {"mode": "thread"}},
            "environment",
        ),
    ],
)
def test_errors_name_the_field(change: dict, field: str) -> None:
    data = {**BASE, **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ManifestError) as info:
        parse_manifest(data)
    assert info.value.field == field
    assert f"manifest field '{field}'" in str(info.value)


def test_split_section_round_trips_and_stays_out_of_older_version_ids() -> None:
    data = {**BASE, "artifacts": {"model": "m.onnx"}}
    plain = parse_manifest(data)
    assert not plain.split.enabled and "split" not in plain.to_dict()  # ids stay as they were
    m = parse_manifest({**data, "split": {"model": "model", "points": ["after.1", "after.5"]}})
    assert m.split.enabled and m.split.points == ("after.1", "after.5")
    assert parse_manifest(m.to_dict()) == m


def test_environment_round_trips_runs_in_a_process_and_stays_out_of_older_ids(
    tmp_path: Path,
) -> None:
    from fnrt.functions.manifest import IsolationMode

    assert "environment" not in parse_manifest(BASE).to_dict()  # ids stay as they were
    m = parse_manifest({**BASE, "environment": {"requirements": [" humanize==4.9.0 "]}})
    assert m.environment.requirements == ("humanize==4.9.0",)
    assert parse_manifest(m.to_dict()) == m
    assert m.isolation_kind(IsolationMode.THREAD) is IsolationMode.PROCESS
    assert parse_manifest(BASE).isolation_kind(IsolationMode.THREAD) is IsolationMode.THREAD
    # a requirements file's lines join the list when the folder is read
    (tmp_path / "fnrt.toml").write_text(
        'name = "f"\nhandler = "h:H"\n[environment]\nrequirements = ["a==1"]\n'
        'requirements_file = "requirements.txt"\n'
    )
    (tmp_path / "requirements.txt").write_text("# pinned\nb>=2  # why\n\nc\n")
    assert load_manifest(tmp_path).environment.requirements == ("a==1", "b>=2", "c")
    (tmp_path / "requirements.txt").unlink()
    with pytest.raises(ManifestError, match=r"environment\.requirements_file"):
        load_manifest(tmp_path)


def test_rollout_and_breaker_sections_round_trip() -> None:
    m = parse_manifest(
        {
            **BASE,
            "rollout": {"policy": "canary", "steps_percent": [5, 100], "sticky_header": "x-user"},
            "breaker": {"fallback": "function:small-model", "open_s": 2},
        }
    )
    assert m.rollout.steps_percent == (5, 100) and m.rollout.rollback_window_s == 600
    assert m.breaker.fallback_function == "small-model"
    assert parse_manifest(m.to_dict()) == m
    assert parse_manifest(BASE).breaker.fallback_function is None


def test_probe_and_warmup_files_must_exist(tmp_path: Path) -> None:
    (tmp_path / "fnrt.toml").write_text(
        'name = "m"\nhandler = "handler:M"\n[rollout]\nprobe_file = "probe.json"\n'
    )
    with pytest.raises(ManifestError, match=r"rollout\.probe_file"):
        load_manifest(tmp_path)
    (tmp_path / "probe.json").write_text("[]")
    assert load_manifest(tmp_path).rollout.probe_file == "probe.json"


def test_name_override() -> None:
    assert parse_manifest(BASE, name="other").name == "other"
    with pytest.raises(ManifestError):
        parse_manifest(BASE, name="NO")


def test_load_manifest_checks_file_and_artifacts(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"no fnrt\.toml"):
        load_manifest(tmp_path)
    (tmp_path / "fnrt.toml").write_text('name = "a"\nhandler = "h:H"\n[artifacts]\nw = "w.bin"\n')
    with pytest.raises(ManifestError, match=r"'w\.bin' does not exist"):
        load_manifest(tmp_path)
    (tmp_path / "w.bin").write_bytes(b"1")
    assert load_manifest(tmp_path).artifacts == {"w": "w.bin"}
    (tmp_path / "fnrt.toml").write_text("name = \n")
    with pytest.raises(ManifestError, match="not valid TOML"):
        load_manifest(tmp_path)


def test_shape_matching() -> None:
    spec = TensorSpec("float32", (-1, 4))
    assert spec.matches_shape((7, 4))
    assert not spec.matches_shape((7, 5))
    assert not spec.matches_shape((4,))


def test_shape_matching_answers_the_same_when_looked_up_and_stays_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``matches_shape`` keeps its answers for the shapes requests carry: the same
    answers the second time, per declared shape, and no more of them than its bound
    whatever shapes clients send."""
    from fnrt.functions import manifest

    monkeypatch.setattr(manifest, "_MATCHED", {})
    monkeypatch.setattr(manifest, "_MATCHED_MAX", 8)
    wide, narrow = TensorSpec("float32", (-1, 4)), TensorSpec("float32", (2, 4))
    for _ in range(2):
        assert wide.matches_shape((7, 4)) and not narrow.matches_shape((7, 4))
        assert narrow.matches_shape((2, 4)) and not wide.matches_shape((2, 5))
    for rows in range(100):
        assert wide.matches_shape((rows, 4)) and not wide.matches_shape((rows, 3))
    assert len(manifest._MATCHED) <= 8  # forgotten when full, then kept again
    assert wide.matches_shape((3, 4)) and not wide.matches_shape((3, 3))
