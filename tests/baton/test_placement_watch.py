"""The placement watch (baton/placement_watch.py): why no node takes an actor's demand, and an actor
waiting for a node reported once, after ``report_after_s``, until it is placed. Over stand-ins for
Ray's actor table and node list; tests/e2e/test_supervisor_faults.py runs it against a real Ray."""

from __future__ import annotations

from baton.placement_watch import NodeResources, PlacementWatch, WatchedActor, why_unplaced

NODE = NodeResources(
    "10.0.0.1", {"CPU": 2, "baton_router": 1, "baton_decode": 1}, {"CPU": 0, "baton_router": 1, "baton_decode": 0}
)


def test_a_resource_no_node_offers_is_named():
    assert why_unplaced({"CPU": 1, "GPU": 0, "baton_prefill": 1}, [NODE]) == "no node offers baton_prefill: 1"
    assert why_unplaced({"CPU": 4}, [NODE]) == "no node offers CPU: 4"


def test_resources_offered_but_held_by_other_actors_are_shown_free_of_total():
    # The case: two workers took the node's 2 CPUs; the router replica wants one of them.
    why = why_unplaced({"CPU": 1, "baton_router": 1}, [NODE])
    assert why == (
        "the nodes that offer it have too little free (10.0.0.1 has CPU 0 of 2 free, baton_router 1 of 1 free)"
    )


def test_resources_split_over_nodes_are_no_fit():
    a = NodeResources("a", {"CPU": 1, "baton_router": 1}, {"CPU": 1, "baton_router": 1})
    b = NodeResources("b", {"CPU": 8}, {"CPU": 8})
    assert (
        why_unplaced({"CPU": 2, "baton_router": 1}, [a, b]) == "no single node offers all of {CPU: 2, baton_router: 1}"
    )


def test_a_waiting_actor_is_reported_once_after_the_delay_and_cleared_when_placed():
    said: list[str] = []
    waiting = {"c-router-0"}
    watch = PlacementWatch(said.append, report_after_s=20, waiting=lambda: waiting, nodes=lambda: [NODE])
    watch.watch(WatchedActor("router-0", "c-router-0", {"CPU": 1, "baton_router": 1}))
    watch.watch(WatchedActor("decode-0", "c-decode-0", {"CPU": 1, "baton_decode": 1}))
    watch.check(now=100)
    watch.check(now=119)
    assert said == [] and watch.unplaced == {}
    watch.check(now=121)
    assert len(said) == 1 and said[0].startswith("router-0 (c-router-0) is still waiting for a node after 21s")
    assert "needs {CPU: 1, baton_router: 1}" in said[0] and "CPU 0 of 2 free" in said[0]
    assert list(watch.unplaced) == ["router-0"]
    watch.check(now=200)
    assert len(said) == 1  # said once
    waiting.clear()
    watch.check(now=201)
    assert said[-1] == "router-0 is placed now" and watch.unplaced == {}


def test_a_replacement_takes_its_labels_place():
    said: list[str] = []
    waiting = {"c-decode-0", "c-decode-0-r1"}
    watch = PlacementWatch(said.append, report_after_s=1, waiting=lambda: waiting, nodes=lambda: [NODE])
    watch.watch(WatchedActor("decode-0", "c-decode-0", {"CPU": 1}))
    watch.watch(WatchedActor("decode-0", "c-decode-0-r1", {"CPU": 1, "baton_decode": 1}))
    watch.check(now=0)
    watch.check(now=2)
    assert len(said) == 1 and "(c-decode-0-r1)" in said[0]
