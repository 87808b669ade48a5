"""The sidecar's state board: a watcher gets every event since the State it last read."""

from __future__ import annotations

from epp._proto import adapterstate_pb2 as pb
from epp.operator.sidecar.server import MAX_EVENTS, PodAdapters, StateBoard


def loaded(adapter: str) -> pb.AdapterEvent:
    return pb.AdapterEvent(kind=pb.AdapterEvent.LOADED, adapter=adapter)


async def test_two_publishes_before_a_read_lose_no_event() -> None:
    board = StateBoard()
    await board.publish(PodAdapters(frozenset({"a"})))
    first = await board.next_after(0)
    await board.publish(PodAdapters(frozenset({"a", "b"})), [loaded("b")])
    await board.publish(PodAdapters(frozenset({"a", "b", "c"})))  # a poll right after, before any read
    state = await board.next_after(first.version)
    assert state.registered == ["a", "b", "c"]
    assert [(e.kind, e.adapter) for e in state.events] == [(pb.AdapterEvent.LOADED, "b")]
    assert list((await board.next_after(0)).events) == []  # a new watcher: the newest State's events only


async def test_the_event_log_is_bounded() -> None:
    board = StateBoard()
    for n in range(MAX_EVENTS + 10):
        await board.publish(PodAdapters(frozenset({f"a{n}"})), [loaded(f"a{n}")])
    assert len(board.events) == MAX_EVENTS
    state = await board.next_after(1)
    assert len(state.events) == MAX_EVENTS and state.events[-1].adapter == f"a{MAX_EVENTS + 9}"
