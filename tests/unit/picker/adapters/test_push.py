"""`AdapterStatePush` against a scripted sidecar on loopback: a State lands on the endpoint it
describes, an implausible one is dropped, and a lost stream leaves the scrape alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from epp._proto import adapterstate_pb2 as pb
from epp._proto import adapterstate_pb2_grpc as pb_grpc
from epp.clock import SystemClock
from epp.picker.adapters.push import MAX_ADAPTERS_PER_STATE, AdapterStatePush
from epp.picker.datastore.store import Datastore
from tests.support.fake_scheduler import pool_datastore

NAME = "pod-0-rank-0"


class ScriptedSidecar(pb_grpc.AdapterStateServicer):  # type: ignore[misc]  # generated, untyped
    """Sends the States put on `outbox`, one Watch stream at a time."""

    def __init__(self) -> None:
        self.outbox: asyncio.Queue[pb.State] = asyncio.Queue()

    async def Watch(self, request: pb.WatchRequest, context: Any) -> AsyncIterator[pb.State]:
        while True:
            yield await self.outbox.get()


async def until(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(500):  # 5 s at most
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what}: not within 5 s")


@contextlib.asynccontextmanager
async def running(store: Datastore, port: int) -> AsyncIterator[AdapterStatePush]:
    push = AdapterStatePush(store, SystemClock(), port=port, backoff_initial_s=0.05, backoff_max_s=0.1)
    task = asyncio.create_task(push.run())
    try:
        yield push
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_states_are_applied_checked_and_dropped_when_the_stream_goes() -> None:
    sidecar = ScriptedSidecar()
    server = grpc.aio.server()
    pb_grpc.add_AdapterStateServicer_to_server(sidecar, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    store = pool_datastore(("127.0.0.1",), target_ports=(8000,))
    try:
        async with running(store, port) as push:
            await sidecar.outbox.put(
                pb.State(registered=["a"], running=["a"], max_slots=2, version=1, model_server_port=8000)
            )
            await until(lambda: push.state("127.0.0.1:8000") is not None, "first state applied")
            state = store.snapshot().endpoints[0].adapter_state
            assert state is not None and state.registered == {"a"} and state.max_lora == 2
            junk = [f"x{i}" for i in range(MAX_ADAPTERS_PER_STATE + 1)]
            await sidecar.outbox.put(pb.State(registered=junk, version=2))
            await until(lambda: push.states_dropped == 1, "implausible state dropped")
            assert push.state("127.0.0.1:8000") == state  # the last good one stands
            await server.stop(0)
            await until(lambda: push.state("127.0.0.1:8000") is None, "lost stream clears push state")
            assert store.snapshot().endpoints[0].adapter_state is None
    finally:
        await server.stop(0)


def test_a_port_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="port"):
        AdapterStatePush(pool_datastore(), SystemClock(), port=0)
