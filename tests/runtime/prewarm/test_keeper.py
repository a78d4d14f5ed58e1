"""Pre-warming in a real server: the next call of a periodic function finds it loaded."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fnrt.runtime.clock import ManualClock
from fnrt.runtime.prewarm import keeper as keeper_module
from fnrt.runtime.prewarm.keeper import Keeper
from fnrt.runtime.prewarm.policies import Policy
from support import ECHO_MANIFEST, live_server, make_node, publish, wait_until, write_function

X = [[1.0, 2.0, 3.0, 4.0]]
BASE_UNIX = 1_800_000_000.0  # a minute boundary
#: a cold start worth 10 minutes of the instance: waiting 29 idle minutes loaded is
#: dearer than unloading at once and loading again just before the next call
PRICED = ECHO_MANIFEST + "cold_start_price_s = 600\n"


def capped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int
) -> tuple[Keeper, list[float], Callable[[int, str], None]]:
    """A keeper of at most ``cap`` histories, its wall clock, and a call at a minute."""
    monkeypatch.setattr(keeper_module, "MAX_FUNCTIONS", cap)
    wall = [BASE_UNIX]
    keeper = Keeper(tmp_path / "h.json", wall=lambda: wall[0])

    def call_at(minute: int, name: str) -> None:
        wall[0] = BASE_UNIX + minute * 60
        keeper.invoked(name)

    return keeper, wall, call_at


def server_parts(tmp_path: Path) -> tuple[ManualClock, Keeper]:
    clock = ManualClock(start=0.0)
    keeper = Keeper(tmp_path / "history.json", wall=lambda: BASE_UNIX + clock.now())
    return clock, keeper


def test_a_periodic_function_is_prewarmed_before_its_next_call(tmp_path: Path) -> None:
    clock, keeper = server_parts(tmp_path)
    node = make_node(tmp_path, clock, keeper=keeper)
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        folder = write_function(tmp_path, "job", manifest=PRICED)
        srv.call(node.deployer.deploy(publish(node.repository, folder)))
        scheduler = srv.call(node.registry.get("job"))

        def call() -> dict[str, str]:
            r = c.post("/v1/functions/job/invoke", json={"x": X})
            assert r.status_code == 200
            return dict(r.headers)

        for _ in range(8):  # every 30 minutes: idle 29 minutes each time
            call()
            clock.advance(30 * 60)
            srv.call(node.sweeper.sweep())
        # the plan is learned: unloaded right after a call, loaded again before the next
        call()
        clock.advance(5 * 60)
        srv.call(node.sweeper.sweep())
        assert scheduler.pool.state.value == "cold"
        clock.advance(24 * 60 + 30)  # 30 s before the predicted minute: not yet, the
        srv.call(node.sweeper.sweep())  # lead is the load's time and 5 s (it takes ~0)
        assert scheduler.pool.state.value == "cold"
        clock.advance(27)
        srv.call(node.sweeper.sweep())
        wait_until(lambda: scheduler.pool.state.value == "warm")
        clock.advance(30)
        headers = call()
        assert "x-fnrt-cold-start" not in headers
        described = c.get("/v1/functions/job").json()
        starts = described["instance"]["starts"]
        assert starts["prewarmed"] == 1 and starts["cold"] >= 1
        assert described["instance"]["prewarms"]["hit"] == 1
        assert described["instance"]["last_prewarm_lead_s"] >= 29
        assert described["keep_alive"]["policy"] == "auto"
        assert described["keep_alive"]["idle_samples"] >= 8
        metrics = c.get("/metrics").text
        assert 'fnrt_invocation_starts_total{function="job",kind="prewarmed"} 1.0' in metrics
        assert 'fnrt_prewarms_total{function="job",outcome="hit"} 1.0' in metrics


def test_prewarming_never_takes_memory_from_a_warm_function(tmp_path: Path) -> None:
    clock, keeper = server_parts(tmp_path)
    node = make_node(tmp_path, clock, keeper=keeper)
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        kept = ECHO_MANIFEST + "cold_start_price_gb_s = 5000\n"  # tiny and dear: kept hours
        for name, manifest in (("job", PRICED), ("busy", kept)):
            folder = write_function(tmp_path, name, manifest=manifest)
            srv.call(node.deployer.deploy(publish(node.repository, folder)))
        job, busy = srv.call(node.registry.get("job")), srv.call(node.registry.get("busy"))
        for _ in range(8):
            c.post("/v1/functions/job/invoke", json={"x": X})
            clock.advance(30 * 60)
            srv.call(node.sweeper.sweep())
        c.post("/v1/functions/job/invoke", json={"x": X})
        c.post("/v1/functions/busy/invoke", json={"x": X})
        node.memory.budget_bytes = busy.pool.instance_bytes + 1  # no room for both
        clock.advance(5 * 60)
        srv.call(node.sweeper.sweep())
        c.post("/v1/functions/busy/invoke", json={"x": X})  # busy stays in use
        clock.advance(24 * 60 + 57)
        srv.call(node.sweeper.sweep())
        srv.call(node.sweeper.sweep())
        assert busy.pool.state.value == "warm"  # not evicted for a pre-warm
        assert job.pool.state.value == "cold"  # only its files were fetched (L2)


def test_the_history_survives_a_restart(tmp_path: Path) -> None:
    wall = [BASE_UNIX]
    keeper = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    for _ in range(10):
        keeper.invoked("job")
        wall[0] += 30 * 60
    before = keeper.plan("job", Policy.AUTO, memory_gb=4.0)
    keeper.save()
    again = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    assert again.plan("job", Policy.AUTO, memory_gb=4.0) == before and before is not None
    assert before.prewarm_after_min > 0
    (tmp_path / "bad.json").write_text("{not json")
    assert Keeper(tmp_path / "bad.json").histories == {}  # unreadable: start afresh


def test_a_snapshot_is_what_a_save_writes_whatever_is_recorded_after_it(
    tmp_path: Path,
) -> None:
    """The sweep takes the snapshot on the event loop, which records calls, and writes it
    on a thread: calls recorded meanwhile change nothing it writes."""
    wall = [BASE_UNIX]
    keeper = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    keeper.invoked("old")
    wall[0] += 5 * 60
    keeper.invoked("old")  # its first minute committed, this one live
    keeper.invoked("new")  # live only: no history in memory yet
    taken = keeper.snapshot()
    for _ in range(3):  # after it: more calls, a first minute committed, a new function
        wall[0] += 7 * 60
        for name in ("old", "new", "later"):
            keeper.invoked(name)
    keeper.write(taken)
    saved = Keeper(tmp_path / "h.json").histories
    assert sorted(saved) == ["new", "old"]
    assert (saved["old"].invocations, saved["new"].invocations) == (2, 1)
    assert list(saved["old"].recent_idle) == [4]  # idle 4 minutes between its calls
    assert keeper.histories["old"].invocations == 4  # the keeper's own went on (and its
    # fifth call's minute is live)


def test_a_function_dropped_for_room_leaves_no_plan_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node keeps the histories of at most MAX_FUNCTIONS functions (the least recently
    called goes); the plan of one that goes, goes with it: before, its planned pre-warm
    stayed, and the sweep looked at a function it no longer knew, every second."""
    monkeypatch.setattr(keeper_module, "MAX_FUNCTIONS", 2)
    wall = [BASE_UNIX]
    keeper = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    for _ in range(10):  # every half hour: a pre-warm is planned after each call
        keeper.invoked("job")
        wall[0] += 30 * 60
    assert keeper.act("job", Policy.AUTO, keep_alive_s=600, idle_since_unix=0, loaded=False)
    assert keeper.pending("job") and "prewarm_at_unix_s" in keeper.planned("job")
    for name in ("a", "b"):  # two functions called since, each in two minutes (the
        keeper.invoked(name)  # second commits the first to a history of its own)
        wall[0] += 60
        keeper.invoked(name)
    assert not keeper.knows("job") and not keeper.pending("job")
    assert keeper.planned("job") == {}


def test_a_deleted_function_is_forgotten_with_its_plan_its_calls_and_its_saved_history(
    tmp_path: Path,
) -> None:
    """``forget`` (the registry's, at a delete): nothing of it is kept, planned or
    written, a call of this minute included, and a node started again from the file
    does not know it; the others keep theirs."""
    wall = [BASE_UNIX]
    keeper = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    for _ in range(10):
        keeper.invoked("job")
        keeper.invoked("kept")
        wall[0] += 30 * 60
    assert keeper.act("job", Policy.AUTO, keep_alive_s=600, idle_since_unix=0, loaded=False)
    keeper.save()
    keeper.invoked("job")  # a call this minute, not yet committed
    keeper.forget("job")
    assert not keeper.knows("job") and not keeper.pending("job")
    assert "job" not in keeper.pending_names() and keeper.planned("job") == {}
    wall[0] += 60
    keeper.plan("kept", Policy.AUTO)  # the minute over: nothing of "job" comes back
    assert not keeper.knows("job")
    keeper.save()
    assert set(json.loads((tmp_path / "h.json").read_text())["functions"]) == {"kept"}
    again = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    assert not again.knows("job") and again.knows("kept")


def test_a_node_forgets_what_it_learned_of_a_function_deleted(tmp_path: Path) -> None:
    clock, keeper = server_parts(tmp_path)
    node = make_node(tmp_path, clock, keeper=keeper)
    with live_server(tmp_path, node=node) as srv, srv.client() as c:
        for name in ("job", "kept"):
            folder = write_function(tmp_path / name, name, manifest=PRICED)
            srv.call(node.deployer.deploy(publish(node.repository, folder)))
        for _ in range(3):
            for name in ("job", "kept"):
                assert c.post(f"/v1/functions/{name}/invoke", json={"x": X}).status_code == 200
            clock.advance(30 * 60)
            srv.call(node.sweeper.sweep())
        assert keeper.knows("job") and keeper.knows("kept")
        assert c.delete("/v1/functions/job").status_code == 200
        assert not keeper.knows("job") and keeper.knows("kept")


def test_an_earlier_snapshot_never_overwrites_a_later_one(tmp_path: Path) -> None:
    """A save still running when the node stops, and the stop's own: the later one
    stays, whichever thread ends last."""
    wall = [BASE_UNIX]
    keeper = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    keeper.invoked("a")
    first = keeper.snapshot()
    keeper.invoked("b")
    second = keeper.snapshot()
    keeper.write(second)
    keeper.write(first)
    assert sorted(Keeper(tmp_path / "h.json").histories) == ["a", "b"]


def test_a_snapshot_copies_only_the_histories_changed_since_the_last(tmp_path: Path) -> None:
    """Once a minute the event loop takes a snapshot: its cost follows the functions
    called since the last one, not the thousands a node may know (copying all 10,000
    took the loop 0.12 s). What is written is still every history."""
    wall = [BASE_UNIX]
    keeper = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    names = [f"f{i}" for i in range(50)]
    for name in names:
        keeper.invoked(name)
    wall[0] += 60
    for name in names:
        keeper.invoked(name)  # each first minute committed, this one live
    keeper.write(keeper.snapshot())
    wall[0] += 5 * 60
    for name in names:
        keeper.act(name, Policy.AUTO, keep_alive_s=600, idle_since_unix=0, loaded=False)
    keeper.write(keeper.snapshot())  # the sweep settled them all: every one changed
    keeper.invoked("f3")
    quiet = keeper.snapshot()
    assert set(quiet.histories) == {"f3"}  # live now; nothing else changed
    keeper.write(quiet)
    wall[0] += 60
    keeper.invoked("f3")  # its last minute committed, a new one live
    keeper.invoked("f7")
    assert set(keeper.snapshot().histories) == {"f3", "f7"}
    assert keeper.snapshot().histories.keys() == {"f3", "f7"}  # still live: still copied
    keeper.write(keeper.snapshot())
    saved = Keeper(tmp_path / "h.json")
    assert sorted(saved.histories) == sorted(names)
    for name in names:
        expected = keeper.histories[name].copy()
        if name in ("f3", "f7"):  # the minute so far is in what was written
            expected.record(int(wall[0] // 60))
        assert saved.histories[name].to_dict() == expected.to_dict(), name


def test_a_call_the_sweep_never_settles_is_copied_once(tmp_path: Path) -> None:
    """A function the sweep does not plan for (a fixed keep-alive, a busy one) keeps its
    last minute's calls uncommitted: the snapshot commits a minute that is over
    itself, so that it is copied once, not in every snapshot after."""
    wall = [BASE_UNIX]
    keeper = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    keeper.invoked("fixed")
    wall[0] += 120
    assert set(keeper.snapshot().histories) == {"fixed"}
    assert keeper.snapshot().histories == {}
    assert keeper.histories["fixed"].invocations == 1  # its minute committed


def test_a_function_dropped_with_a_call_still_to_commit_keeps_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropped for room while its last minute's call waits to be committed, and back
    when it is: its place in the order of last calls is that call's, not the end."""
    keeper, wall, call_at = capped(tmp_path, monkeypatch, 2)
    for minute, name in ((0, "x"), (1, "x"), (2, "y"), (3, "y"), (4, "z"), (5, "z")):
        call_at(minute, name)  # z's first minute: x goes (its minute 1 still to commit)
    assert sorted(keeper.histories) == ["y", "z"]
    wall[0] = BASE_UNIX + 6 * 60
    keeper.plan("x", Policy.AUTO)  # x's minute 1 committed: back, and y goes
    assert sorted(keeper.histories) == ["x", "z"]
    call_at(7, "q")
    call_at(8, "q")  # q's first minute: x goes again (last called at 1), not z (at 5)
    assert sorted(keeper.histories) == ["q", "z"]


def test_after_a_restart_a_save_keeps_what_it_read_and_what_changed(tmp_path: Path) -> None:
    """A restarted node's first save writes the histories it read as they were (made
    into JSON on the writer's thread, not at its start) and those that changed since."""
    wall = [BASE_UNIX]
    first = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    for name in ("a", "b", "c"):
        first.invoked(name)
    first.save()
    wall[0] += 10 * 60
    again = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    before = {name: h.to_dict() for name, h in again.histories.items()}
    again.invoked("b")
    wall[0] += 60
    again.save()  # b's new minute committed first (a minute that is over)
    saved = Keeper(tmp_path / "h.json").histories
    assert sorted(saved) == ["a", "b", "c"]
    assert saved["a"].to_dict() == before["a"] and saved["c"].to_dict() == before["c"]
    assert saved["b"].invocations == 2 and saved["b"].to_dict() != before["b"]


def test_a_late_earlier_snapshot_still_writes_what_only_it_changed(tmp_path: Path) -> None:
    """Two writes out of order (a save still running when the node stops): each
    function keeps its latest copy, and one changed only in the earlier snapshot is
    not lost with it; one forgotten later does not come back."""
    wall = [BASE_UNIX]
    keeper = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    keeper.invoked("a")
    keeper.invoked("gone")
    wall[0] += 60
    keeper.invoked("a")
    keeper.invoked("gone")
    wall[0] += 60
    keeper.act("a", Policy.AUTO, keep_alive_s=600, idle_since_unix=0, loaded=False)
    keeper.act("gone", Policy.AUTO, keep_alive_s=600, idle_since_unix=0, loaded=False)
    first = keeper.snapshot()  # a and gone, both settled
    assert set(first.histories) == {"a", "gone"}
    keeper.invoked("b")
    keeper._forget("gone")
    second = keeper.snapshot()  # b live, gone forgotten
    assert second.histories == {"b": second.histories["b"], "gone": None}
    keeper.write(second)
    keeper.write(first)
    saved = Keeper(tmp_path / "h.json").histories
    assert sorted(saved) == ["a", "b"]
    assert saved["a"].invocations == 2 and saved["b"].invocations == 1


def test_the_history_dropped_for_room_is_the_least_recently_called_counting_this_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keeper, _, call_at = capped(tmp_path, monkeypatch, 2)
    for minute, name in ((0, "old"), (1, "old"), (50, "mid"), (51, "mid"), (100, "old")):
        call_at(minute, name)  # old: a history to minute 1, and called again now
    call_at(101, "new")
    call_at(102, "new")  # its first minute committed: one history must go
    assert sorted(keeper.histories) == ["new", "old"]  # mid, last called at 51


def test_after_a_restart_the_history_dropped_for_room_is_the_least_recently_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order of last calls comes back with the histories (the keeper keeps it as
    it goes: no scan of every history for the one to drop)."""
    monkeypatch.setattr(keeper_module, "MAX_FUNCTIONS", 3)
    wall = [BASE_UNIX]
    keeper = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    for minute, name in ((0, "b"), (1, "b"), (10, "a"), (11, "a"), (20, "c"), (21, "c")):
        wall[0] = BASE_UNIX + minute * 60
        keeper.invoked(name)  # histories: b to minute 0, a to 10, c to 20
    keeper.save()
    saved = json.loads((tmp_path / "h.json").read_text())  # the file's order: most recent
    by_last = sorted(saved["functions"].items(), key=lambda f: -f[1]["last_minute"])  # first
    saved["functions"] = dict(by_last)
    (tmp_path / "h.json").write_text(json.dumps(saved))
    again = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    for minute in (30, 31):
        wall[0] = BASE_UNIX + minute * 60
        again.invoked("new")
    assert sorted(again.histories) == ["a", "c", "new"]  # b, last called at minute 0


def test_an_idle_function_leaves_nothing_pending_once_its_minute_is_over(
    tmp_path: Path,
) -> None:
    """The sweep passes by a cold function with nothing pending: after its last call's
    minute, one look files the calls into its history, for a fixed keep-alive (no
    plan to make) as for a planned one."""
    for policy in (Policy.FIXED, Policy.AUTO):
        clock, keeper = server_parts(tmp_path / policy.value)
        keeper.invoked("f")
        keeper.invoked("f")
        assert keeper.pending("f")  # called this minute
        looks = (0.0, 61.0)  # within the minute, then past it
        for advance_s in looks:
            clock.advance(advance_s)
            action = keeper.act("f", policy, keep_alive_s=60.0, idle_since_unix=0.0, loaded=False)
            assert not action.unload and not action.prewarm
            assert keeper.pending("f") == (advance_s == 0.0), policy
        assert keeper.histories["f"].invocations == 2


def test_the_pending_names_are_those_pending_says() -> None:
    """The sweep reads every pending function at once (sets of names), not one by one."""
    wall = [BASE_UNIX]
    keeper = Keeper(None, wall=lambda: wall[0])
    names = ("live", "planned", "unplanned", "fixed", "prewarm")
    for name in names:
        keeper.invoked(name)
    for _ in range(6):  # every half hour: a pre-warm is planned after each call
        wall[0] += 30 * 60
        keeper.invoked("prewarm")
    wall[0] += 2 * 60
    keeper.invoked("live")  # called this minute
    keeper.plan("planned", Policy.AUTO)
    keeper.act("fixed", Policy.FIXED, keep_alive_s=600, idle_since_unix=0, loaded=False)
    keeper.act("prewarm", Policy.AUTO, keep_alive_s=600, idle_since_unix=0, loaded=False)
    keeper._settle("unplanned")  # (as the sweep's first look does: a history, no plan)
    expected = {n for n in names if keeper.pending(n)}
    assert keeper.pending_names() == expected
    assert {"live", "unplanned", "prewarm"} <= expected and "fixed" not in expected


def test_the_price_is_in_seconds_of_the_nodes_mean_instance() -> None:
    wall = [BASE_UNIX]
    keeper = Keeper(None, wall=lambda: wall[0])
    for _ in range(6):
        for name in ("small", "large"):
            keeper.invoked(name)
        wall[0] += 30 * 60
    assert keeper.mean_instance_gb() == 1.0  # nothing planned yet: 1 GB
    keeper.plan("small", Policy.AUTO, memory_gb=0.5)
    keeper.plan("large", Policy.AUTO, memory_gb=3.5)
    assert keeper.mean_instance_gb() == 2.0
    assert keeper.at_mean(keeper.config).mean_instance_gb == 2.0


def test_a_plan_is_made_once_after_a_call_at_the_mean_then() -> None:
    """A function joining moves the node's mean instance, but a plan made stays until its
    function is called again, as ``fnrt simulate`` plans once after each call: a plan
    made again at a later sweep would see a later working set, and the node would part
    from the simulator by when it happened to look."""
    wall = [BASE_UNIX]
    keeper = Keeper(None, wall=lambda: wall[0])
    for _ in range(6):
        keeper.invoked("small")
        wall[0] += 30 * 60
    made = keeper.plan("small", Policy.AUTO, memory_gb=0.5)
    assert made is not None and keeper.mean_instance_gb() == 0.5
    keeper.invoked("large")
    wall[0] += 60
    keeper.plan("large", Policy.AUTO, memory_gb=3.5)
    assert keeper.mean_instance_gb() == 2.0
    assert keeper.plan("small", Policy.AUTO, memory_gb=0.5) is made  # not made again
    keeper.invoked("small")
    wall[0] += 60
    again = keeper.plan("small", Policy.AUTO, memory_gb=0.5)
    assert again is not made  # a call: a new plan, at the mean now


def test_a_plan_fills_the_budget_by_the_working_set_the_simulator_counts() -> None:
    # three functions of 1, 2 and 0.5 GB on their own rhythms; after each minute the
    # keeper plans the ones called in it, as the sweep does: its working set (what a
    # fixed 10-minute keep-alive would hold) is the simulator's, minute by minute, and
    # so is each plan's choice to fill a budget of 2.5 GB (at 4x the price) or not (at
    # the share of the working set the budget holds), and what its instance is worth
    from fnrt.runtime.prewarm.node import _working_set
    from fnrt.runtime.prewarm.policies import PolicyConfig, decide, filling, scarce, weigh, worth
    from fnrt.runtime.prewarm.trace import Trace

    minutes, gb = 90, [1.0, 2.0, 0.5]
    counts = np.zeros((3, minutes), dtype=np.int32)
    counts[0, ::7] = counts[1, 3::40] = counts[2, 1::13] = 1
    trace = Trace(["a", "b", "c"], ["a", "b", "c"], ["http"] * 3, counts)
    expected = _working_set(trace, [int(g * 2**30) for g in gb], 10)
    now = [BASE_UNIX]
    keeper = Keeper(None, PolicyConfig(mean_instance_gb=1.0), wall=lambda: now[0], fill_memory=None)
    budget = int(2.5 * 2**30)
    chosen = []
    for minute in range(minutes):
        now[0] = BASE_UNIX + minute * 60
        called = np.flatnonzero(counts[:, minute]).tolist()
        for f in called:
            keeper.invoked(trace.functions[f])
        now[0] += 60
        for f in called:
            name = trace.functions[f]
            plan = keeper.plan(name, Policy.AUTO, memory_gb=gb[f], budget_bytes=budget)
            history = keeper.histories[name]
            fill = expected[minute] <= budget
            config = keeper.at_mean(keeper.config)
            priced = filling(config) if fill else scarce(config, expected[minute], budget)
            want = decide(Policy.AUTO, priced, history, minute, gb[f])
            assert keeper.filling(name) is fill and plan == want, (minute, name)
            assert fill or priced.price_factor == pytest.approx(budget / expected[minute])
            weighed = keeper.weigh(name, Policy.AUTO, memory_gb=gb[f], budget_bytes=budget)
            kept = worth(priced, history, want, gb[f], cached=True) if fill else None
            assert weighed == weigh(worth(priced, history, want, gb[f]), 1, kept), (minute, name)
            chosen.append(fill)
        if called:
            at = int(BASE_UNIX // 60) + minute
            assert keeper.working_set_bytes(at) == expected[minute], minute
    assert True in chosen and False in chosen  # the budget decides both ways here
    never = Keeper(None, wall=lambda: now[0], fill_memory=False)
    always = Keeper(None, wall=lambda: now[0], fill_memory=True)
    for k in (never, always):
        k.invoked("a")
    now[0] += 60
    for k in (never, always):
        k.plan("a", Policy.AUTO, memory_gb=1.0, budget_bytes=budget)
    assert not never.filling("a") and always.filling("a")


def test_the_working_set_is_the_simulators_on_a_random_day() -> None:
    """The keeper counts the working set as calls come (bytes by last call minute):
    on 40 functions of random sizes (one of 0 bytes) and rhythms, it is the
    simulator's after every minute."""
    from fnrt.runtime.prewarm.node import _working_set
    from fnrt.runtime.prewarm.trace import Trace

    rng = np.random.default_rng(7)
    functions, minutes = 40, 240
    gb = [0.0, *rng.choice([0.25, 0.5, 1.0, 1.5, 3.0], functions - 1).tolist()]
    counts = (rng.random((functions, minutes)) < rng.uniform(0.01, 0.3, (functions, 1))).astype(
        np.int32
    )
    names = [f"f{i}" for i in range(functions)]
    trace = Trace(names, names, ["http"] * functions, counts)
    expected = _working_set(trace, [int(g * 2**30) for g in gb], 10)
    now = [BASE_UNIX]
    keeper = Keeper(None, wall=lambda: now[0], fill_memory=None)
    for minute in range(minutes):
        now[0] = BASE_UNIX + minute * 60
        called = np.flatnonzero(counts[:, minute]).tolist()
        for f in called:
            keeper.invoked(names[f])
        now[0] += 60
        for f in called:
            keeper.plan(names[f], Policy.AUTO, memory_gb=gb[f], budget_bytes=2**33)
        if called:
            at = int(BASE_UNIX // 60) + minute
            assert keeper.working_set_bytes(at) == expected[minute], minute


def test_the_working_set_follows_a_new_size_and_forgets_a_dropped_function() -> None:
    now = [BASE_UNIX]
    keeper = Keeper(None, wall=lambda: now[0], fill_memory=None)
    minute = int(BASE_UNIX // 60)
    for name in ("a", "b"):
        keeper.invoked(name)
    now[0] += 60
    keeper.plan("a", Policy.AUTO, memory_gb=1.0)
    keeper.plan("b", Policy.AUTO, memory_gb=2.0)
    assert keeper.working_set_bytes(minute) == 3 * 2**30
    keeper.invoked("a")  # a again: sized at 0.5 GB now
    now[0] += 60
    keeper.plan("a", Policy.AUTO, memory_gb=0.5)
    assert keeper.working_set_bytes(minute + 1) == 2.5 * 2**30
    assert keeper.working_set_bytes(minute + 11) == 0.5 * 2**30  # b's last call too old
    keeper._forget("a")
    assert keeper.working_set_bytes(minute + 1) == 2 * 2**30


def _periodic(keeper: Keeper, wall: list[float], calls: int = 8) -> int:
    """``calls`` calls of "job" 30 minutes apart, each minute over; the next one's minute."""
    for _ in range(calls):
        keeper.invoked("job")
        wall[0] += 30 * 60
    keeper.plan("job", Policy.AUTO)  # the minutes so far, committed
    return int(wall[0] // 60)


def test_a_minute_is_committed_to_the_history_only_once_it_is_over() -> None:
    """Weighing an instance (the memory budget asks at any time) or saving the histories
    within a minute leaves that minute's calls out of the history until it ends: they
    go in once, with every call of the minute (one at its last instant included), as a
    keeper nobody asked meanwhile has them (before, a weigh committed the minute so
    far, and its later calls went in as a second record of the same minute)."""
    wall, quiet_wall = [BASE_UNIX], [BASE_UNIX]
    keeper = Keeper(None, wall=lambda: wall[0])
    quiet = Keeper(None, wall=lambda: quiet_wall[0])  # asked nothing within the minute
    minute = _periodic(keeper, wall)
    assert _periodic(quiet, quiet_wall) == minute
    history = keeper.histories["job"]
    before = history.to_dict()
    keeper.invoked("job")  # at the minute's first instant
    wall[0] += 30
    value, _ = keeper.weigh("job", Policy.AUTO)
    keeper.plan("job", Policy.AUTO)
    assert history.to_dict() == before and history.last_minute == minute - 30
    wall[0] += 29.999  # the minute's last instant: still this minute
    keeper.invoked("job")
    assert keeper.weigh("job", Policy.AUTO) == (value, False)  # idle 0 both times
    quiet.invoked("job")
    quiet.invoked("job")
    wall[0] = quiet_wall[0] = (minute + 1) * 60.0  # the minute is over
    assert keeper.weigh("job", Policy.AUTO) == quiet.weigh("job", Policy.AUTO)
    assert history.last_minute == minute and history.to_dict() == quiet.histories["job"].to_dict()
    assert history.invocations == 9 + 1


def test_saving_within_a_minute_commits_nothing_early(tmp_path: Path) -> None:
    """The periodic save writes the minute's calls so far, and leaves the live count
    alone: the minute goes into the history once, whole, when it ends."""
    wall, quiet_wall = [BASE_UNIX], [BASE_UNIX]
    keeper = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    quiet = Keeper(None, wall=lambda: quiet_wall[0])
    minute = _periodic(keeper, wall)
    _periodic(quiet, quiet_wall)
    for k in (keeper, quiet):
        k.invoked("job")
    keeper.save()
    saved = Keeper(tmp_path / "h.json", wall=lambda: wall[0])
    assert saved.histories["job"].last_minute == minute  # a restart knows the call
    assert keeper.histories["job"].last_minute == minute - 30  # not in memory yet
    for k in (keeper, quiet):
        k.invoked("job")
    wall[0] = quiet_wall[0] = (minute + 1) * 60.0
    keeper.plan("job", Policy.AUTO)
    quiet.plan("job", Policy.AUTO)
    assert keeper.histories["job"].to_dict() == quiet.histories["job"].to_dict()
