"""The load generator against a scripted server on loopback: what it calls whole, cut and failed,
and how its drivers pace and bound what they send."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp import web

from epp.tools import loadgen
from epp.tools.loadgen import Request
from testkit.waiting import eventually


def _sse(payloads: list[dict[str, object]], *, done: bool = True) -> bytes:
    events = [b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads]
    return b"".join(events) + (b"data: [DONE]\n\n" if done else b"")


def _tokens(count: int) -> list[dict[str, object]]:
    return [{"choices": [{"text": f"t{i}"}]} for i in range(count)]


def _usage(count: int) -> dict[str, object]:
    return {"choices": [], "usage": {"completion_tokens": count}}


class Scripted:
    """Answers by model name: `whole`, `short` (one token fewer), `no-done`, `no-usage`,
    `busy` (503), `drop` (the connection closed mid-stream), `slow` (waits for `release`)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []
        self.headers: list[dict[str, str]] = []
        self.running = 0
        self.most_running = 0
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        model, tokens, stream = body["model"], int(body["max_tokens"]), bool(body.get("stream"))
        if model == "busy":
            return web.json_response({"error": "busy"}, status=503)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            if model == "slow":
                await self.release.wait()
            if not stream:
                count = tokens - 1 if model == "short" else tokens
                return web.json_response({"choices": [{"text": "x"}], "usage": {"completion_tokens": count}})
            response = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await response.prepare(request)
            count = tokens - 1 if model == "short" else tokens
            await response.write(_sse(_tokens(count)[:1], done=False))
            if model == "drop":
                assert request.transport is not None
                request.transport.close()
                return response
            payloads = _tokens(count)[1:]
            if model != "no-usage":
                payloads.append(_usage(count))
            await response.write(_sse(payloads, done=model != "no-done"))
            await response.write_eof()
            return response
        finally:
            self.running -= 1


@pytest.fixture
async def server() -> AsyncIterator[tuple[Scripted, str]]:
    scripted = Scripted()
    app = web.Application()
    app.router.add_post(loadgen.COMPLETIONS_PATH, scripted.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield scripted, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _one(base_url: str, request: Request) -> loadgen.Answer:
    async with loadgen.client(timeout_s=10) as session:
        return await loadgen.send(session, base_url, request)


@pytest.mark.parametrize(
    ("model", "stream", "status", "whole", "error"),
    [
        ("whole", False, 200, True, False),
        ("whole", True, 200, True, False),
        ("short", False, 200, False, False),
        ("short", True, 200, False, False),
        ("no-done", True, 200, False, False),
        ("no-usage", True, 200, False, False),  # asked for, not sent
        ("busy", True, 503, False, False),
        ("drop", True, 200, False, True),
    ],
)
async def test_an_answer_is_whole_only_with_every_token_the_usage_and_done(
    server: tuple[Scripted, str], model: str, stream: bool, status: int, whole: bool, error: bool
) -> None:
    _, url = server
    answer = await _one(url, Request.completion(model, 5, stream=stream))
    assert (answer.status, answer.whole, bool(answer.error)) == (status, whole, error)
    assert answer.streamed is stream
    assert 0 <= answer.ttft_s <= answer.e2e_s
    assert answer.served is (status == 200 and not error)
    if status != 200:
        assert json.loads(answer.body) == {"error": "busy"}
    if whole:
        assert answer.completion_tokens == 5


async def test_a_stream_that_did_not_ask_for_usage_is_whole_without_it(server: tuple[Scripted, str]) -> None:
    _, url = server
    answer = await _one(url, Request({"model": "no-usage", "prompt": "p", "max_tokens": 3, "stream": True}))
    assert answer.whole


async def test_nothing_listening_is_status_0(server: tuple[Scripted, str]) -> None:
    answer = await _one("http://127.0.0.1:1", Request.completion("whole", 1))
    assert (answer.status, answer.whole) == (0, False) and answer.error


async def test_headers_go_with_their_request(server: tuple[Scripted, str]) -> None:
    scripted, url = server
    await _one(url, Request.completion("whole", 1, headers={"x-gateway-inference-objective": "batch"}))
    assert scripted.headers[0]["x-gateway-inference-objective"] == "batch"


async def test_closed_loop_keeps_concurrency_and_order(server: tuple[Scripted, str]) -> None:
    scripted, url = server
    requests = [Request.completion("whole", n % 3 + 1) for n in range(12)]
    done: list[int] = []
    answers = await loadgen.closed_loop((url,), requests, concurrency=3, timeout_s=10, on_done=done.append)
    assert [a.completion_tokens for a in answers] == [n % 3 + 1 for n in range(12)]
    assert done == list(range(1, 13))
    assert scripted.most_running <= 3


def test_at_rate_spaces_requests_evenly() -> None:
    schedule = loadgen.at_rate(200.0, [Request.completion("whole", 1) for _ in range(4)])
    assert [offset for offset, _ in schedule] == pytest.approx([0.0, 0.005, 0.010, 0.015])


async def test_open_loop_counts_what_finds_too_many_in_flight_as_not_sent(
    server: tuple[Scripted, str],
) -> None:
    scripted, url = server
    schedule = [(0.0, Request.completion("slow", 1)) for _ in range(4)]
    sending = asyncio.create_task(
        loadgen.open_loop((url,), schedule, timeout_s=10, lead_s=0.0, max_in_flight=2)
    )
    await eventually(lambda: scripted.running == 2, "the first two requests held by the server")
    scripted.release.set()
    answers = await sending
    assert [a.status for a in answers] == [200, 200, 0, 0]
    assert answers[2].error == loadgen.NOT_SENT
    assert len(scripted.bodies) == 2


@pytest.fixture
def threaded_server() -> Iterator[tuple[Scripted, str]]:
    """The scripted server on a loop of its own, for the load that runs on a thread."""
    ready = threading.Event()
    found: list[tuple[Scripted, str]] = []
    stop: list[asyncio.Event] = []
    loop = asyncio.new_event_loop()

    async def serve() -> None:
        scripted = Scripted()
        app = web.Application()
        app.router.add_post(loadgen.COMPLETIONS_PATH, scripted.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        found.append((scripted, f"http://127.0.0.1:{port}"))
        stop.append(asyncio.Event())
        ready.set()
        await stop[0].wait()
        await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield found[0]
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(10)
        loop.close()


def test_background_load_stops_when_asked_and_returns_every_answer(
    threaded_server: tuple[Scripted, str],
) -> None:
    scripted, url = threaded_server

    def request_at(index: int) -> Request:
        return Request.completion("whole", 2, stream=index % 2 == 0)

    with loadgen.BackgroundLoad(url, request_at, rate=200.0, max_requests=1000) as load:
        load.wait_sent(10)
        answers = load.stop()
    assert 10 <= len(answers) < 1000
    assert len(answers) == len(scripted.bodies) == load.sent()
    assert all(a.whole for a in answers)
    assert [a.streamed for a in answers[:4]] == [True, False, True, False]


def test_background_load_ends_on_its_own_at_its_count(threaded_server: tuple[Scripted, str]) -> None:
    _, url = threaded_server
    load = loadgen.BackgroundLoad(url, lambda _: Request.completion("whole", 1), rate=500.0, max_requests=5)
    with load:
        load.wait_sent(5)
    assert len(load.stop()) == 5
