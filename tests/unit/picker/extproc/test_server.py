"""The ext_proc server: certificate reload on file change, binding errors, and the Process
stream around a request that waits in flow control's queue."""

from __future__ import annotations

import asyncio
import os
import pathlib
import socket
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
import pytest

from epp import tls
from epp._proto.envoy.config.core.v3 import base_pb2
from epp._proto.envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from epp._proto.envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from epp.clock import FakeClock
from epp.picker.admission import build_admission
from epp.picker.datastore.types import Metrics
from epp.picker.director import Director
from epp.picker.extproc.server import SERVER_OPTIONS, CertReloader, ExternalProcessor
from epp.picker.extproc.stream import StreamOptions
from epp.picker.flowcontrol import FlowControlSettings, build_flow_control
from epp.picker.lifecycle import Ending
from epp.picker.listen import ListenError, bind
from tests.support.fake_scheduler import pool_datastore
from tests.unit.picker.extproc.support import LedgerScheduler, RecordingObserver

Mode = processing_mode_pb2.ProcessingMode


def write_pair(directory: pathlib.Path, mtime: float) -> tls.KeyPair:
    pair = tls.self_signed()
    for name, content in (("tls.crt", pair.cert_pem), ("tls.key", pair.key_pem)):
        path = directory / name
        path.write_bytes(content)
        os.utime(path, (mtime, mtime))
    return pair


def test_reloader_returns_new_config_only_when_files_change(tmp_path: pathlib.Path) -> None:
    write_pair(tmp_path, 1_000_000)
    reloader = CertReloader(tmp_path)
    assert reloader.initial() is not None
    assert reloader() is None
    write_pair(tmp_path, 2_000_000)
    assert reloader() is not None
    assert reloader() is None


def test_reloader_keeps_current_cert_when_new_files_are_bad(tmp_path: pathlib.Path) -> None:
    write_pair(tmp_path, 1_000_000)
    reloader = CertReloader(tmp_path)
    (tmp_path / "tls.crt").write_bytes(b"half-written")
    assert reloader() is None


async def test_bind_refuses_a_port_in_use() -> None:
    assert ("grpc.so_reuseport", 0) in SERVER_OPTIONS
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        server = grpc.aio.server(options=SERVER_OPTIONS)
        with pytest.raises(ListenError, match="cannot listen"):
            bind(server, f"127.0.0.1:{holder.getsockname()[1]}", None)


# -- the Process stream around a request that waits --------------------------------------------

GATEWAY = "ipv4:10.0.0.9:41234"
BODY = b'{"model":"m","prompt":"hello"}'


class FakeContext:
    """The servicer context as Process uses it for a well-formed stream."""

    def peer(self) -> str:
        return GATEWAY

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


class QueueingServer:
    """ExternalProcessor over a one-pod pool whose pod is full, with flow control: requests queue."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.scheduler = LedgerScheduler()
        self.observer = RecordingObserver()
        self.datastore = pool_datastore(("10.0.0.1",), clock=self.clock)
        self.flow = build_flow_control(
            FlowControlSettings(enabled=True), self.scheduler.state, build_admission().detector
        )
        assert self.flow is not None
        self.director = Director(
            self.datastore, self.scheduler, flow=self.flow, clock=self.clock, observer=self.observer
        )
        self.processor = ExternalProcessor(StreamOptions(self.director, self.clock))
        self.scrape(waiting_requests=10)  # over the queue-depth threshold (5): nothing dispatches
        self.stream_open = asyncio.Event()  # set: the data plane ends its side of the stream

    def scrape(self, **fields: int) -> None:
        self.datastore.update_metrics("pod-0-rank-0", Metrics(updated_at=self.clock.now(), **fields))  # type: ignore[arg-type]

    def process(self, mode: int) -> AsyncIterator[pb.ProcessingResponse]:
        return self.processor.Process(self._inbound(mode), cast(Any, FakeContext()))

    async def _inbound(self, mode: int) -> AsyncIterator[pb.ProcessingRequest]:
        headers = pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(
                headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":method", raw_value=b"POST")])
            )
        )
        headers.protocol_config.request_body_mode = mode
        headers.protocol_config.response_body_mode = Mode.NONE  # request-only: done once routed
        yield headers
        yield pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True))
        await self.stream_open.wait()


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


class Call:
    """One Process stream, its replies read in one task as grpc.aio reads them."""

    def __init__(self, replies: AsyncIterator[pb.ProcessingResponse]) -> None:
        self.replies: list[pb.ProcessingResponse] = []
        self.task = asyncio.create_task(self._read(replies))

    async def _read(self, replies: AsyncIterator[pb.ProcessingResponse]) -> None:
        async for reply in replies:
            self.replies.append(reply)

    def kinds(self) -> list[str | None]:
        return [reply.WhichOneof("response") for reply in self.replies]


async def test_a_queued_request_is_answered_on_its_stream_once_dispatched() -> None:
    server = QueueingServer()
    call = Call(server.process(Mode.FULL_DUPLEX_STREAMED))
    await settle()
    assert call.replies == [] and not call.task.done()  # its replies wait for the queue
    [(what, key, _)] = server.observer.events
    assert what == "queued"
    server.scrape(waiting_requests=0)
    server.director.pump()
    await asyncio.wait_for(call.task, 1)  # no response follows: the server ends the stream
    assert call.kinds() == ["request_headers", "request_body"]
    assert call.replies[1].request_body.response.body_mutation.streamed_response.body == BODY
    [life] = server.observer.finished_lives
    assert (life.key, life.ending) == (key, Ending.STREAM_END)
    assert server.scheduler.in_flight() == {}


async def test_a_queued_buffered_request_gets_keep_waiting_then_its_reply() -> None:
    server = QueueingServer()
    call = Call(server.process(Mode.BUFFERED))
    await settle()
    assert call.kinds() == ["request_headers", None]  # the headers reply, then: keep waiting
    assert call.replies[1].override_message_timeout.ToMilliseconds() == 90_000
    assert not call.task.done()
    server.scrape(waiting_requests=0)
    server.director.pump()
    await asyncio.wait_for(call.task, 1)
    assert call.kinds() == ["request_headers", None, "request_body"]
    assert call.replies[2].request_body.response.body_mutation.body == BODY


async def test_a_stream_reset_while_queued_takes_its_request_out_of_the_queue() -> None:
    server = QueueingServer()
    call = Call(server.process(Mode.FULL_DUPLEX_STREAMED))
    await settle()
    assert server.flow is not None and len(server.flow.queues) == 1
    call.task.cancel()  # grpc cancels the call's task when the data plane resets the stream
    with pytest.raises(asyncio.CancelledError):
        await call.task
    assert call.replies == []
    [life] = server.observer.finished_lives
    assert life.ending is Ending.CLIENT_GONE and life.outcome.status is None
    assert len(server.flow.queues) == 0
    assert ("left_queue", life.key, "EvictedContextCancelled") in server.observer.events
    server.scrape(waiting_requests=0)
    server.director.pump()
    assert server.scheduler.scheduled == [] and server.scheduler.in_flight() == {}
