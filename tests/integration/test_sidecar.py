"""`epp sidecar` next to a real `epp sim`: it pushes the pod's adapter state, loads and
unloads on request, and the EPP-side watcher re-dials when the sidecar restarts."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator

import grpc
import pytest

from epp._proto import adapterstate_pb2 as pb
from epp._proto import adapterstate_pb2_grpc as pb_grpc
from epp.clock import SystemClock
from epp.picker.adapters.sidecar_client import SidecarWatcher
from epp.tools.localstack import free_port
from testkit.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

WITHIN_S = 10.0


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except OSError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    host, port = "127.0.0.1", free_port()
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "epp", "sim", "--host", host, "--port", str(port)),
            *("--lora-modules", "static-one=/static", "--check-lora-paths", "--lora-load-latency", "0.01"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://{host}:{port}"
        wait_until(lambda: _http_ok(f"{url}/health"), "sim healthy", within_s=WITHIN_S)
        yield url
    finally:
        _stop(process)


def start_sidecar(sim_url: str, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "epp", "sidecar", "--model-server", sim_url]
    command += ["--host", "127.0.0.1", "--port", str(port), "--poll-interval", "50ms"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
async def sidecar(sim_url: str) -> AsyncIterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    port = free_port()
    processes = [start_sidecar(sim_url, port)]
    try:
        yield f"127.0.0.1:{port}", processes
    finally:
        for process in processes:
            _stop(process)


class States:
    def __init__(self) -> None:
        self.received: list[pb.State] = []
        self.lost = asyncio.Event()

    def on_state(self, address: str, state: pb.State) -> None:
        self.received.append(state)

    def on_lost(self, address: str) -> None:
        self.lost.set()

    async def until(self, predicate: Callable[[pb.State], bool], what: str) -> pb.State:
        async with asyncio.timeout(WITHIN_S):
            while True:
                for state in reversed(self.received):
                    if predicate(state):
                        return state
                await asyncio.sleep(0.02)
        raise AssertionError(what)  # pragma: no cover


@contextlib.asynccontextmanager
async def watching(address: str, states: States) -> AsyncIterator[SidecarWatcher]:
    watcher = SidecarWatcher(
        address, clock=SystemClock(), on_state=states.on_state, on_lost=states.on_lost, backoff_max_s=0.2
    )
    task = asyncio.create_task(watcher.run())
    try:
        yield watcher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_state_is_pushed_and_loads_run_on_the_pod(
    sidecar: tuple[str, list[subprocess.Popen[bytes]]], tmp_path: pathlib.Path
) -> None:
    address, _ = sidecar
    (tmp_path / "adapter_config.json").write_text("{}")
    adapter_dir = str(tmp_path)
    states = States()
    async with watching(address, states):
        first = await states.until(lambda s: "static-one" in s.registered, "initial state")
        assert first.version >= 1 and "pushed" not in first.registered
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.AdapterStateStub(channel)
            reply = await stub.Load(pb.LoadRequest(adapter="pushed", path=adapter_dir))
            assert reply.loaded_now
            # The State that carries the LOADED event (a poll may show the adapter one State earlier).
            loaded = await states.until(
                lambda s: any(e.kind == pb.AdapterEvent.LOADED for e in s.events), "the LOADED event"
            )
            assert [(e.kind, e.adapter) for e in loaded.events] == [(pb.AdapterEvent.LOADED, "pushed")]
            assert "pushed" in loaded.registered
            again = await stub.Load(pb.LoadRequest(adapter="pushed", path=adapter_dir))
            assert not again.loaded_now
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.Load(pb.LoadRequest(adapter="nowhere", path="/no/such/dir"))
            assert caught.value.code() is grpc.StatusCode.NOT_FOUND
            assert "No adapter found" in (caught.value.details() or "")
            assert (await stub.Unload(pb.UnloadRequest(adapter="pushed"))).unloaded
            await states.until(lambda s: "pushed" not in s.registered, "state after unload")
            assert not (await stub.Unload(pb.UnloadRequest(adapter="pushed"))).unloaded
    # A new watcher (an EPP that restarted) starts from a full state at once.
    fresh = States()
    async with watching(address, fresh):
        await fresh.until(lambda s: "static-one" in s.registered, "full state for a new watcher")


async def test_the_watcher_reconnects_after_a_sidecar_restart(
    sidecar: tuple[str, list[subprocess.Popen[bytes]]], sim_url: str
) -> None:
    address, processes = sidecar
    states = States()
    async with watching(address, states) as watcher:
        await states.until(lambda s: "static-one" in s.registered, "initial state")
        _stop(processes[0])
        async with asyncio.timeout(WITHIN_S):
            await states.lost.wait()
        states.received.clear()
        processes.append(start_sidecar(sim_url, int(address.rpartition(":")[2])))
        restarted = await states.until(lambda s: "static-one" in s.registered, "state after restart")
        assert restarted.version >= 1
        assert watcher.streams_opened >= 2
