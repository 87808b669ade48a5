"""The one load generator: OpenAI completions sent through a gateway (or straight to pods), timed
and checked, for `epp demo`, `epp bench --live`, the soak benchmark and the integration tests.

`send` posts one completion and reads the answer to its end: its status, first-byte and total
time, and whether it was whole (every token asked for; for a stream, the usage chunk when asked
and `data: [DONE]`). Three drivers, each bounded in count and time:

- `open_loop`: each request at its scheduled offset, whatever the earlier answers did (a trace
  replayed, a soak at a fixed rate); at most `max_in_flight` outstanding, the rest counted as
  not sent;
- `closed_loop`: a fixed number of clients, each sending its next request when its previous
  answer is in (throughput at a given concurrency);
- `BackgroundLoad`: an open loop on a thread of its own until stopped, for a caller that breaks
  the stack meanwhile and then reads every answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import aiohttp

Body = Mapping[str, object]
COMPLETIONS_PATH = "/v1/completions"
NOT_SENT = "not sent: too many requests in flight"


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One completion to send, and the headers to send it with."""

    body: Body
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def completion(
        cls,
        model: str,
        max_tokens: int,
        *,
        stream: bool = False,
        prompt: str = "Say hello.",
        headers: Mapping[str, str] | None = None,
    ) -> Request:
        """A completion of `max_tokens`; streamed ones ask for the usage chunk, so a whole answer
        can be told from a cut one."""
        body: dict[str, object] = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return cls(body, dict(headers or {}))

    @property
    def streamed(self) -> bool:
        return bool(self.body.get("stream"))


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """One request as the client saw it."""

    started_at: float  # time.monotonic() when it was sent
    status: int  # 0: no response (connection error, timeout, not sent)
    streamed: bool
    whole: bool  # 200 and complete: every token asked for, the usage when asked, [DONE] for a stream
    ttft_s: float = math.nan  # to the first body chunk
    e2e_s: float = math.nan  # to the end of the body
    completion_tokens: int = 0  # as the answer's usage says (0 without one)
    content_type: str = ""
    body: bytes = b""  # kept for answers other than 200
    error: str = ""

    @property
    def served(self) -> bool:
        """Answered 200 and read to its end, whatever the body holds."""
        return self.status == 200 and not self.error


def _wanted_tokens(body: Body) -> int | None:
    wanted = body.get("max_tokens")
    return wanted if isinstance(wanted, int) else None


def _usage_tokens(payload: object) -> int | None:
    if not isinstance(payload, dict) or not isinstance(payload.get("usage"), dict):
        return None
    tokens = payload["usage"].get("completion_tokens")
    return tokens if isinstance(tokens, int) else None


def _stream_check(data: bytes, body: Body) -> tuple[bool, int]:
    """Whether an SSE completion is whole, and the usage chunk's token count.

    Whole: one chunk with text per token asked for, the usage chunk (when `stream_options` asked
    for it) with the same count, then `data: [DONE]` and nothing after.
    """
    events = [e for e in data.split(b"\n\n") if e.strip()]
    if not events or events[-1].strip() != b"data: [DONE]":
        return False, 0
    chunks = 0
    usage: int | None = None
    try:
        for event in events[:-1]:
            payload = json.loads(event.removeprefix(b"data: "))
            chunks += sum(1 for choice in payload.get("choices", []) if choice.get("text"))
            usage = _usage_tokens(payload) if payload.get("usage") else usage
    except (ValueError, AttributeError):
        return False, 0
    wanted = _wanted_tokens(body)
    options = body.get("stream_options")
    usage_asked = isinstance(options, dict) and bool(options.get("include_usage"))
    whole = (wanted is None or chunks == wanted) and (
        usage == chunks if usage_asked else usage in (None, chunks)
    )
    return whole, usage or 0


def _json_check(data: bytes, body: Body) -> tuple[bool, int]:
    """Whether a JSON completion is whole (its usage counts every token asked for), and that count."""
    try:
        usage = _usage_tokens(json.loads(data))
    except ValueError:
        return False, 0
    wanted = _wanted_tokens(body)
    return usage is not None and (wanted is None or usage == wanted), usage or 0


@contextlib.asynccontextmanager
async def client(*, timeout_s: float, keep_alive: bool = True) -> AsyncIterator[aiohttp.ClientSession]:
    """A client session, every request bounded by `timeout_s`.

    `keep_alive=False` opens a connection per request, as a fresh client would: a test that kills
    processes behind the gateway then never sees a pooled connection's failure as the request's.
    """
    connector = aiohttp.TCPConnector(limit=0, force_close=not keep_alive)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        yield session


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    request: Request,
    *,
    on_first_chunk: Callable[[], None] | None = None,
) -> Answer:
    """POST `request` to `base_url`'s completions path and read the answer to its end."""
    started = time.monotonic()
    streamed = request.streamed
    headers = {"content-type": "application/json", **request.headers}
    first: float | None = None
    data = b""
    try:
        async with session.post(
            base_url + COMPLETIONS_PATH, data=json.dumps(dict(request.body)), headers=headers
        ) as response:
            status, content_type = response.status, response.headers.get("content-type", "")
            try:
                async for chunk in response.content.iter_any():
                    if first is None:
                        first = time.monotonic()
                        if on_first_chunk is not None:
                            on_first_chunk()
                    data += chunk
            except (aiohttp.ClientError, TimeoutError) as err:
                end = time.monotonic()
                return Answer(
                    started, status, streamed, False, (first or end) - started, end - started,
                    content_type=content_type, body=data, error=repr(err),
                )  # fmt: skip
    except (aiohttp.ClientError, TimeoutError) as err:
        return Answer(started, 0, streamed, False, error=repr(err))
    end = time.monotonic()
    ttft_s, e2e_s = (first or end) - started, end - started
    if status != 200:
        return Answer(started, status, streamed, False, ttft_s, e2e_s, 0, content_type, data)
    whole, tokens = _stream_check(data, request.body) if streamed else _json_check(data, request.body)
    return Answer(started, status, streamed, whole, ttft_s, e2e_s, tokens, content_type)


def send_one(base_url: str, request: Request, *, timeout_s: float = 60.0) -> Answer:
    """`send` from synchronous code, on a connection of its own."""

    async def one() -> Answer:
        async with client(timeout_s=timeout_s, keep_alive=False) as session:
            return await send(session, base_url, request)

    return asyncio.run(one())


async def open_loop(
    base_urls: tuple[str, ...],
    schedule: Sequence[tuple[float, Request]],
    *,
    timeout_s: float,
    lead_s: float = 0.2,
    max_in_flight: int = 2000,
    keep_alive: bool = True,
) -> list[Answer]:
    """Send each request `offset` seconds after a common start (the i-th to `base_urls[i % n]`),
    whatever the earlier answers did; one that finds `max_in_flight` outstanding is not sent."""
    in_flight = 0

    async def one(session: aiohttp.ClientSession, index: int, offset: float, request: Request) -> Answer:
        nonlocal in_flight
        await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
        if in_flight >= max_in_flight:
            return Answer(time.monotonic(), 0, request.streamed, False, error=NOT_SENT)
        in_flight += 1
        try:
            return await send(session, base_urls[index % len(base_urls)], request)
        finally:
            in_flight -= 1

    async with client(timeout_s=timeout_s, keep_alive=keep_alive) as session:
        start = time.monotonic() + lead_s
        return list(
            await asyncio.gather(
                *(one(session, index, offset, request) for index, (offset, request) in enumerate(schedule))
            )
        )


def at_rate(rate: float, requests: Sequence[Request]) -> list[tuple[float, Request]]:
    """`requests` evenly spaced at `rate` per second: an open loop's schedule."""
    return [(index / rate, request) for index, request in enumerate(requests)]


async def closed_loop(
    base_urls: tuple[str, ...],
    requests: Sequence[Request],
    *,
    concurrency: int,
    timeout_s: float,
    on_done: Callable[[int], None] | None = None,
    keep_alive: bool = True,
) -> list[Answer]:
    """Send `requests` in order from `concurrency` clients (the i-th to `base_urls[i % n]`);
    `on_done(n)` after each answer."""
    answers: list[Answer | None] = [None] * len(requests)
    next_index = 0
    done = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal next_index, done
        while next_index < len(requests):
            index = next_index
            next_index += 1
            answers[index] = await send(session, base_urls[index % len(base_urls)], requests[index])
            done += 1
            if on_done is not None:
                on_done(done)

    async with client(timeout_s=timeout_s, keep_alive=keep_alive) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return [answer for answer in answers if answer is not None]


class BackgroundLoad:
    """`rate` requests/s on a thread of its own until `stop()`, at most `max_requests` and
    `max_duration_s`; the i-th request is `request_at(i)`.

    Requests go out on schedule whatever the answers' pace (up to `max_in_flight` outstanding),
    so a slow phase shows up as errors or latency, not as fewer requests. Every request opens its
    own connection, as a fresh client would.
    """

    def __init__(
        self,
        base_url: str,
        request_at: Callable[[int], Request],
        *,
        rate: float,
        max_requests: int,
        max_duration_s: float = 120.0,
        max_in_flight: int = 64,
        timeout_s: float = 60.0,
    ) -> None:
        self._base_url = base_url
        self._request_at = request_at
        self._interval_s = 1.0 / rate
        self._max_requests = max_requests
        self._max_duration_s = max_duration_s
        self._max_in_flight = max_in_flight
        self._timeout_s = timeout_s
        self._answers: list[asyncio.Task[Answer]] = []
        self._results: list[Answer] = []
        self._progress = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="background-load", daemon=True)

    def __enter__(self) -> BackgroundLoad:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(10.0):
            raise RuntimeError("the load's event loop did not start")

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._started.set()
        in_flight = asyncio.Semaphore(self._max_in_flight)
        async with client(timeout_s=self._timeout_s, keep_alive=False) as session:

            async def one(request: Request) -> Answer:
                async with in_flight:
                    return await send(session, self._base_url, request)

            start = time.monotonic()
            for index in range(self._max_requests):
                due = start + index * self._interval_s
                if due - start > self._max_duration_s:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), max(0.0, due - time.monotonic()))
                if self._stopping.is_set():
                    break
                task = asyncio.create_task(one(self._request_at(index)))
                with self._progress:
                    self._answers.append(task)
                    self._progress.notify_all()
            results = list(await asyncio.gather(*self._answers))
        with self._progress:
            self._results = results
            self._progress.notify_all()

    def sent(self) -> int:
        with self._progress:
            return len(self._answers)

    def wait_sent(self, count: int, timeout_s: float = 60.0) -> None:
        """Block until `count` requests have gone out (bounded)."""
        with self._progress:
            if not self._progress.wait_for(lambda: len(self._answers) >= count, timeout=timeout_s):
                raise AssertionError(f"only {len(self._answers)} of {count} requests sent")

    def stop(self) -> list[Answer]:
        """Stop sending, wait for every request sent, and return their answers in sending order."""
        if self._loop is not None and self._stopping is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop ended on its own (count or time)
                self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=self._timeout_s + 10.0)
        if self._thread.is_alive():
            raise AssertionError(f"the load did not finish within {self._timeout_s + 10.0:g}s")
        with self._progress:
            return list(self._results)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..1): a latency some request really had; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
