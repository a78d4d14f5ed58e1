"""Reads of functions not served yet (``runtime/lookups.py``): no server, a manual clock."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import pytest

from fnrt.functions.errors import FunctionNotFound, Overloaded, VersionNotFound
from fnrt.runtime.clock import ManualClock
from fnrt.runtime.lookups import MISSING_FOR_S, READS_AT_ONCE, Lookups


class Store:
    """A store holding ``names``; counts the reads of each name, each read waiting on
    ``gate`` when one is given."""

    def __init__(self, *names: str) -> None:
        self.names = set(names)
        self.reads: dict[str, int] = {}
        self.table: dict[str, str] = {}
        self.gate: asyncio.Event | None = None
        self.at_once = 0
        self.most_at_once = 0

    def reader(self, name: str) -> Callable[[], Awaitable[str]]:
        async def read() -> str:
            self.reads[name] = self.reads.get(name, 0) + 1
            self.at_once += 1
            self.most_at_once = max(self.most_at_once, self.at_once)
            try:
                if self.gate is not None:
                    await self.gate.wait()
                await asyncio.sleep(0)
                if name not in self.names:
                    raise FunctionNotFound(name)
                self.table[name] = f"served {name}"
                return self.table[name]
            finally:
                self.at_once -= 1

        return read


def lookups(store: Store, clock: ManualClock, **options: Any) -> Lookups[str]:
    return Lookups(store.table, clock, **options)


def test_a_missing_name_is_answered_without_a_read_until_its_note_runs_out() -> None:
    async def run() -> None:
        clock, store = ManualClock(), Store("f")
        found = lookups(store, clock)
        for _ in range(3):
            with pytest.raises(FunctionNotFound):
                await found.find("nope", store.reader("nope"), fresh=False)
        assert store.reads == {"nope": 1}
        # a deploy through this node reads it again, whatever was noted
        with pytest.raises(FunctionNotFound):
            await found.find("nope", store.reader("nope"), fresh=True)
        assert store.reads == {"nope": 2}
        clock.advance(MISSING_FOR_S)
        with pytest.raises(FunctionNotFound):
            await found.find("nope", store.reader("nope"), fresh=False)
        assert store.reads == {"nope": 3}
        assert await found.find("f", store.reader("f"), fresh=False) == "served f"
        assert found.names_locked() == 0  # each name's lock goes with its last user
        # a read that finds it (a deploy through this node) drops the note at once
        with pytest.raises(FunctionNotFound):
            await found.find("later", store.reader("later"), fresh=False)
        store.names.add("later")
        assert await found.find("later", store.reader("later"), fresh=True) == "served later"
        assert not found.missing("later")

    asyncio.run(run())


def test_the_change_feed_drops_the_notes_of_the_names_it_names() -> None:
    async def run() -> None:
        clock, store = ManualClock(), Store()
        found = lookups(store, clock)
        for name in ("a", "b", "c"):
            with pytest.raises(FunctionNotFound):
                await found.find(name, store.reader(name), fresh=False)
        store.names |= {"a", "b", "c"}  # deployed by another node
        found.stored(["a"])
        assert await found.find("a", store.reader("a"), fresh=False) == "served a"
        with pytest.raises(FunctionNotFound):  # still noted: the feed named only a
            await found.find("b", store.reader("b"), fresh=False)
        found.stored(None)  # the feed could not say which: every note goes
        assert await found.find("b", store.reader("b"), fresh=False) == "served b"
        assert await found.find("c", store.reader("c"), fresh=False) == "served c"
        assert store.reads == {"a": 2, "b": 2, "c": 2}

    asyncio.run(run())


def test_a_read_that_began_before_the_feed_named_the_name_notes_nothing() -> None:
    async def run() -> None:
        clock, store = ManualClock(), Store()
        found = lookups(store, clock)
        store.gate = asyncio.Event()
        first = asyncio.ensure_future(found.find("f", store.reader("f"), fresh=False))
        await asyncio.sleep(0.01)
        found.stored(["f"])  # deployed while its read was on its way
        store.gate.set()
        with pytest.raises(FunctionNotFound):
            await first
        store.names.add("f")
        assert await found.find("f", store.reader("f"), fresh=False) == "served f"

    asyncio.run(run())


def test_requests_for_one_name_share_its_read() -> None:
    async def run() -> None:
        clock, store = ManualClock(), Store("f")
        found = lookups(store, clock)
        store.gate = asyncio.Event()
        calls = [
            asyncio.ensure_future(found.find(n, store.reader(n), fresh=False))
            for n in ["f"] * 10 + ["nope"] * 10
        ]
        await asyncio.sleep(0.01)
        store.gate.set()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert results[:10] == ["served f"] * 10
        assert all(isinstance(r, FunctionNotFound) for r in results[10:])
        assert store.reads == {"f": 1, "nope": 1}
        assert found.names_locked() == 0

    asyncio.run(run())


def test_a_few_names_are_read_at_once_and_a_slow_one_holds_up_no_other() -> None:
    async def run() -> None:
        clock, store = ManualClock(), Store("f")
        found = lookups(store, clock)
        store.gate = asyncio.Event()  # the store hangs for every name but f
        names = [f"nope-{i}" for i in range(READS_AT_ONCE - 1)]
        hanging = [
            asyncio.ensure_future(found.find(n, store.reader(n), fresh=False)) for n in names
        ]
        await asyncio.sleep(0.01)

        async def read_f() -> str:  # f's read does not wait on the gate
            store.reads["f"] = 1
            store.table["f"] = "served f"
            return "served f"

        # one read's room is left: another function's first request goes through
        assert await asyncio.wait_for(found.find("f", read_f, fresh=False), 1) == "served f"
        more = [
            asyncio.ensure_future(found.find(f"more-{i}", store.reader(f"more-{i}"), fresh=False))
            for i in range(5)
        ]
        await asyncio.sleep(0.01)
        assert store.most_at_once == READS_AT_ONCE  # the rest wait for room
        store.gate.set()
        results = await asyncio.gather(*hanging, *more, return_exceptions=True)
        assert all(isinstance(r, FunctionNotFound) for r in results)
        assert store.most_at_once == READS_AT_ONCE

    asyncio.run(run())


def test_the_notes_are_bounded() -> None:
    async def run() -> None:
        clock, store = ManualClock(), Store()
        found = lookups(store, clock, most_missing=3)
        for i in range(4):  # the fourth forgets the first three
            with pytest.raises(FunctionNotFound):
                await found.find(f"n{i}", store.reader(f"n{i}"), fresh=False)
        assert found.missing("n3") and not any(found.missing(f"n{i}") for i in range(3))

    asyncio.run(run())


def test_a_version_the_store_did_not_hold_is_noted_until_the_feed_names_its_function() -> None:
    async def run() -> None:
        clock, reads = ManualClock(), []
        found = Lookups[str]({}, clock)
        stored = {"v1"}

        def reader(version: str) -> Callable[[], Awaitable[str]]:
            async def read() -> str:
                reads.append(version)
                if version not in stored:
                    raise VersionNotFound("f", version)
                return version

            return read

        def none() -> str | None:
            return None

        for _ in range(3):
            with pytest.raises(VersionNotFound):
                await found.find_version("f", "v2", none, reader("v2"))
        assert await found.find_version("f", "v1", none, reader("v1")) == "v1"
        assert reads == ["v2", "v1"]
        stored.add("v2")
        found.stored(["g"])  # another function's change: v2 of f stays noted
        with pytest.raises(VersionNotFound):
            await found.find_version("f", "v2", none, reader("v2"))
        found.stored(["f"])
        assert await found.find_version("f", "v2", none, reader("v2")) == "v2"
        with pytest.raises(VersionNotFound):
            await found.find_version("f", "v3", none, reader("v3"))
        clock.advance(MISSING_FOR_S)  # or its note runs out
        stored.add("v3")
        assert await found.find_version("f", "v3", none, reader("v3")) == "v3"
        assert reads == ["v2", "v1", "v2", "v3", "v3"]
        # noted, but held here now (deployed through this node): held wins, no read
        with pytest.raises(VersionNotFound):
            await found.find_version("f", "v4", none, reader("v4"))
        assert await found.find_version("f", "v4", lambda: "held v4", reader("v4")) == "held v4"
        assert reads[-1] == "v4" and reads.count("v4") == 1

    asyncio.run(run())


def test_made_up_names_wait_in_a_lane_of_their_own_and_past_its_bound_are_not_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A flood of distinct made-up names cost a read each and queued before the first
    # calls of real functions. The names the store listed, or the feed named since,
    # are read in a lane of their own; the others wait in a second, bounded lane.
    async def run() -> None:
        clock, store = ManualClock(), Store("f", "g")
        found = lookups(store, clock, reads_at_once=2, unlisted_waiting=3)
        found.listed(["f"])
        found.stored(["g"])  # deployed elsewhere since: the feed named it
        store.gate = asyncio.Event()  # the store hangs for every name read through it
        made_up = [f"made-up-{i}" for i in range(3)]
        hanging = [
            asyncio.ensure_future(found.find(n, store.reader(n), fresh=False)) for n in made_up
        ]
        await asyncio.sleep(0.01)
        assert store.most_at_once == 2  # two reading, one waiting: the lane is full
        for name in ("made-up-x", "made-up-z"):  # past the bound: 429, no read, no note
            with pytest.raises(Overloaded) as refused:
                await asyncio.wait_for(found.find(name, store.reader(name), fresh=False), 1)
            assert refused.value.retry_after_s == 1.0
            assert name not in store.reads and not found.missing(name)
        assert found.refused == 2
        assert caplog.text.count("refused unread (429)") == 1  # a line a minute at most

        async def read(name: str) -> str:  # a read that does not wait on the gate
            store.reads[name] = store.reads.get(name, 0) + 1
            store.table[name] = f"served {name}"
            return store.table[name]

        # a listed name, a name the feed named, and a deploy through this node (fresh)
        # go through the first lane at once
        assert await asyncio.wait_for(found.find("f", lambda: read("f"), fresh=False), 1)
        assert await asyncio.wait_for(found.find("g", lambda: read("g"), fresh=False), 1)
        assert await asyncio.wait_for(found.find("h", lambda: read("h"), fresh=True), 1)
        # requests for a name already waiting share its read, whatever the bound
        again = asyncio.ensure_future(
            found.find("made-up-0", store.reader("made-up-0"), fresh=False)
        )
        await asyncio.sleep(0.01)
        assert not again.done()
        store.gate.set()
        results = await asyncio.gather(*hanging, again, return_exceptions=True)
        assert all(isinstance(r, FunctionNotFound) for r in results)
        assert store.reads == {
            "made-up-0": 1,
            "made-up-1": 1,
            "made-up-2": 1,
            "f": 1,
            "g": 1,
            "h": 1,
        }
        # the lane emptied: a made-up name is read (and noted) again
        with pytest.raises(FunctionNotFound):
            await found.find("made-up-y", store.reader("made-up-y"), fresh=False)
        assert store.reads["made-up-y"] == 1 and found.missing("made-up-y")

    with caplog.at_level(logging.WARNING, "fnrt.registry"):
        asyncio.run(run())


def test_before_the_store_is_listed_every_name_is_read_as_before() -> None:
    async def run() -> None:
        clock, store = ManualClock(), Store("f")
        found = lookups(store, clock, unlisted_waiting=0)  # the second lane takes no one
        for name in ("a", "b", "f"):  # not listed yet (a registry that has not started)
            with contextlib.suppress(FunctionNotFound):
                await found.find(name, store.reader(name), fresh=False)
        assert store.reads == {"a": 1, "b": 1, "f": 1} and found.refused == 0

    asyncio.run(run())


def test_version_ids_not_held_here_wait_in_the_second_lane() -> None:
    async def run() -> None:
        clock, reads = ManualClock(), []
        found = Lookups[str]({}, clock, reads_at_once=1, unlisted_waiting=2)
        gate = asyncio.Event()

        def reader(version: str) -> Callable[[], Awaitable[str]]:
            async def read() -> str:
                reads.append(version)
                await gate.wait()
                raise VersionNotFound("f", version)

            return read

        def none() -> str | None:
            return None

        hanging = [asyncio.ensure_future(found.find_version("f", v, none, reader(v))) for v in "ab"]
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded):
            await asyncio.wait_for(found.find_version("f", "c", none, reader("c")), 1)
        assert reads == ["a"]
        gate.set()
        await asyncio.gather(*hanging, return_exceptions=True)
        assert reads == ["a", "b"]

    asyncio.run(run())


def test_when_the_feed_cannot_say_what_changed_the_names_are_listed_again() -> None:
    async def run() -> None:
        clock, store = ManualClock(), Store("a", "b", "c", "d")
        listing = asyncio.Event()
        lists: list[int] = []

        async def relist() -> Iterable[str]:
            lists.append(len(lists))
            await listing.wait()
            return ["a", "b"]

        # unlisted_waiting=0: a name outside the listed ones is refused at once
        found = lookups(store, clock, unlisted_waiting=0, relist=relist)
        found.stored(None)  # the feed's first read, before the start's listing: no listing
        assert lists == []
        found.listed(["a"])
        with pytest.raises(Overloaded):
            await found.find("b", store.reader("b"), fresh=False)
        assert "b" not in store.reads
        found.stored(None)  # too far behind: listed again, every name read meanwhile
        await asyncio.sleep(0)
        assert lists == [0]
        assert await found.find("b", store.reader("b"), fresh=False) == "served b"
        found.stored(["c"])  # named while the listing runs: kept beside it
        listing.set()
        await asyncio.sleep(0.01)
        assert await found.find("c", store.reader("c"), fresh=False) == "served c"
        with pytest.raises(Overloaded):  # neither listed nor named
            await found.find("d", store.reader("d"), fresh=False)
        assert "d" not in store.reads and found.refused == 2
        found.close()

    asyncio.run(run())


def test_one_listing_runs_at_a_time_however_often_the_feed_cannot_say() -> None:
    async def run() -> None:
        clock, store = ManualClock(), Store("a", "b")
        listing = asyncio.Event()
        lists: list[int] = []

        async def relist() -> Iterable[str]:
            lists.append(len(lists))
            await listing.wait()
            return ["a"]

        found = lookups(store, clock, unlisted_waiting=0, relist=relist)
        found.listed(["a"])
        for _ in range(5):  # polls that each could not say (each a feed gap)
            found.stored(None)
            await asyncio.sleep(0)
        assert lists == [0]  # one listing; one more once it ends (it may miss a gap's)
        listing.set()
        await asyncio.sleep(0.01)
        assert lists == [0, 1]
        with pytest.raises(Overloaded):  # listed: b is outside
            await found.find("b", store.reader("b"), fresh=False)
        found.close()

    asyncio.run(run())


def test_a_listing_that_fails_is_tried_again_every_name_read_meanwhile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def run() -> None:
        clock, store = ManualClock(), Store("a", "b")
        failing = [True]
        lists: list[int] = []

        async def relist() -> Iterable[str]:
            lists.append(len(lists))
            if failing[0]:
                raise OSError("the store is down")
            return ["a"]

        found = lookups(store, clock, unlisted_waiting=0, relist=relist, relist_retry_s=0.05)
        found.listed(["a"])
        found.stored(None)
        await asyncio.sleep(0.01)
        assert "listing the store's functions again failed" in caplog.text
        assert await found.find("b", store.reader("b"), fresh=False) == "served b"
        failing[0] = False
        for _ in range(100):  # tried again after relist_retry_s
            if len(lists) == 2:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)
        assert lists == [0, 1]
        store.table.pop("b")
        with pytest.raises(Overloaded):  # listed again: b is outside
            await found.find("b", store.reader("b"), fresh=False)
        assert store.reads["b"] == 1
        found.close()

    with caplog.at_level(logging.WARNING, "fnrt.registry"):
        asyncio.run(run())


def test_a_functions_version_list_is_kept_a_moment_and_dropped_when_the_feed_names_it() -> None:
    async def run() -> None:
        clock, lists = ManualClock(), []
        found = Lookups[str]({}, clock)
        gate = asyncio.Event()

        async def listing() -> list[str]:
            lists.append(1)
            await gate.wait()
            return ["v1", "v2"]

        # requests at once share one listing
        calls = [asyncio.ensure_future(found.versions("f", listing)) for _ in range(5)]
        await asyncio.sleep(0.01)
        gate.set()
        assert await asyncio.gather(*calls) == [["v1", "v2"]] * 5
        assert await found.versions("f", listing) == ["v1", "v2"] and len(lists) == 1
        clock.advance(MISSING_FOR_S)  # kept MISSING_FOR_S
        await found.versions("f", listing)
        assert len(lists) == 2
        found.stored(["g"])  # another function's change: kept
        await found.versions("f", listing)
        assert len(lists) == 2
        found.stored(["f"])  # its own (a deploy, here or elsewhere): listed again
        await found.versions("f", listing)
        assert len(lists) == 3
        found.stored(None)
        await found.versions("f", listing)
        assert len(lists) == 4
        # a listing under way when the feed names the function is answered, not kept
        gate.clear()
        clock.advance(MISSING_FOR_S)
        during = asyncio.ensure_future(found.versions("f", listing))
        await asyncio.sleep(0.01)
        found.stored(["f"])
        gate.set()
        assert await during == ["v1", "v2"]
        await found.versions("f", listing)
        assert len(lists) == 6

    asyncio.run(run())


def test_whoever_keeps_what_was_read_of_a_function_is_told_when_it_is_written() -> None:
    told: list[set[str] | None] = []
    found = Lookups[str]({}, ManualClock(), written=told.append)
    found.stored(["f", "g"])
    found.stored(None)
    assert told == [{"f", "g"}, None]
