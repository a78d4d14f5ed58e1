"""The store-wide change feed: what a node learns from it, and what it costs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from s3support import MotoEndpoint

from fnrt.functions.routing import Routing
from fnrt.loader.changes import FEED_LENGTH, Feed
from fnrt.loader.repository import Repository
from fnrt.loader.stores import FileStore


def _feed(*names: str) -> Feed:
    feed = Feed()
    for name in names:
        feed = feed.appended(name, "t")
    return feed


def test_since_names_each_change_once_in_order() -> None:
    feed = _feed("a", "b", "a", "c")
    assert feed.generation == 4
    assert feed.since(4) == []
    assert feed.since(1) == ["b", "a", "c"]
    assert feed.since(0) == ["a", "b", "c"]


def test_a_node_too_far_behind_is_told_so() -> None:
    feed = _feed(*(f"f{i}" for i in range(FEED_LENGTH + 10)))
    assert len(feed.changes) == FEED_LENGTH
    oldest = feed.changes[0].generation
    assert feed.since(oldest - 1) is not None  # every change after it is still there
    assert feed.since(oldest - 2) is None  # one is gone: re-read everything
    assert _feed("a").since(5) is None  # a feed younger than what was seen: it was reset


def test_the_feed_round_trips_as_json() -> None:
    feed = _feed("a", "b")
    assert Feed.from_json(feed.to_json()) == feed


def _route(repository: Repository, name: str, version: str) -> None:
    repository.update_routing(name, lambda _: Routing({version: 100}))


def test_routing_writes_and_deletes_append_to_the_feed(tmp_path: Path) -> None:
    repository = Repository(FileStore(tmp_path))
    assert repository.read_feed() == (Feed(), "-")  # no feed yet: an empty one
    assert repository.read_feed("-") is None  # and it has not moved
    _route(repository, "a", "v-1")
    _route(repository, "b", "v-1")
    feed, etag = repository.read_feed("-") or (Feed(), "")
    assert feed.since(0) == ["a", "b"]
    assert repository.read_feed(etag) is None  # unchanged: nothing to read
    repository.delete_function("a")
    moved = repository.read_feed(etag)
    assert moved is not None and moved[0].since(feed.generation) == ["a"]


def test_concurrent_writers_lose_no_change(tmp_path: Path) -> None:
    repository = Repository(FileStore(tmp_path))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _route(repository, f"f{i % 4}", f"v-{i}"), range(64)))
    feed, _ = repository.read_feed() or (Feed(), "")
    assert feed.generation == 64
    assert sorted(feed.since(0) or []) == ["f0", "f1", "f2", "f3"]


@pytest.mark.parametrize("functions", [10, 100])
def test_an_idle_poll_is_one_request_whatever_the_number_of_functions(
    s3: MotoEndpoint, functions: int
) -> None:
    store = s3.store("fnrt", "feed")
    repository = Repository(store)
    for i in range(functions):
        _route(repository, f"f{i}", "v-1")
    _, etag = repository.read_feed() or (Feed(), "")
    before = store.requests.copy()
    assert repository.read_feed(etag) is None  # S3 answered 304
    assert store.requests - before == {"GetObject": 1}
    _route(repository, "f3", "v-2")
    moved = repository.read_feed(etag)
    assert moved is not None and moved[0].since(functions) == ["f3"]
