"""Client traffic for the fault tests: streamed completions read to the end, and bounded open-loop load.

`stream_completion` reads an SSE completion to its end and says whether it was whole: status 200,
every token's chunk, the usage chunk's count and `data: [DONE]`. `OpenLoad` sends a fixed rate of
mixed streamed and non-streamed requests from a thread pool, bounded in count and time, and keeps
every result with the time it started.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import http.client
import json
import threading
import time
from collections.abc import Callable

from epp.tools.localstack import LocalStack
from testkit import faults

REQUEST_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """One request as the client saw it."""

    started_at: float  # time.monotonic() when it was sent
    status: int  # 0: no response (connection error)
    streamed: bool
    whole: bool  # the complete answer: JSON with usage, or every SSE chunk, usage and [DONE]
    content_type: str = ""
    body: bytes = b""  # kept for non-200 answers
    error: str = ""


def _gateway(stack: LocalStack) -> tuple[str, int]:
    host, port = stack.gateway_url.removeprefix("http://").split(":")
    return host, int(port)


def _sse_whole(data: bytes, max_tokens: int) -> bool:
    """Every token's chunk, the usage chunk with the same count, then [DONE], and nothing after."""
    events = [e for e in data.split(b"\n\n") if e.strip()]
    if not events or events[-1].strip() != b"data: [DONE]":
        return False
    tokens = 0
    usage_tokens = None
    for event in events[:-1]:
        payload = json.loads(event.removeprefix(b"data: "))
        for choice in payload.get("choices", []):
            if choice.get("text"):
                tokens += 1
        if payload.get("usage"):
            usage_tokens = payload["usage"]["completion_tokens"]
    return tokens == max_tokens and usage_tokens == max_tokens


def streams_through_an_epp_kill(
    stack: LocalStack, adapters: tuple[str, ...], max_tokens: int, *, streams: int = 6
) -> list[Result]:
    """`streams` streamed completions, the EPP SIGKILLed once every one has its first chunk, each
    read to its end."""
    started = [threading.Event() for _ in range(streams)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=streams) as pool:
        futures = [
            pool.submit(
                completion_request,
                stack,
                adapters[index % len(adapters)],
                max_tokens,
                stream=True,
                on_first_chunk=event.set,
            )
            for index, event in enumerate(started)
        ]
        for event in started:
            assert event.wait(30), "a stream did not start"
        faults.stop_epp(stack)  # SIGKILL while every stream is mid-response
        return [future.result(timeout=60) for future in futures]


def completion_request(
    stack: LocalStack,
    model: str,
    max_tokens: int,
    *,
    stream: bool,
    on_first_chunk: Callable[[], None] | None = None,
) -> Result:
    """One completion through the gateway, read to its end."""
    started = time.monotonic()
    body: dict[str, object] = {"model": model, "prompt": "Say hello.", "max_tokens": max_tokens}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    connection = http.client.HTTPConnection(*_gateway(stack), timeout=REQUEST_TIMEOUT_S)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
        response = connection.getresponse()
        content_type = response.getheader("content-type", "")
        data = b""
        try:
            while chunk := response.read1(65536):
                if not data and on_first_chunk is not None:
                    on_first_chunk()
                data += chunk
        except (http.client.HTTPException, OSError) as err:
            return Result(started, response.status, stream, False, content_type, data, repr(err))
        if response.status != 200:
            return Result(started, response.status, stream, False, content_type, data)
        if stream:
            whole = _sse_whole(data, max_tokens)
        else:
            whole = json.loads(data)["usage"]["completion_tokens"] == max_tokens
        return Result(started, 200, stream, whole, content_type)
    except (http.client.HTTPException, OSError) as err:
        return Result(started, 0, stream, False, error=repr(err))
    finally:
        connection.close()


class OpenLoad:
    """`rate` requests/s (every other one streamed) until `stop()`, at most `max_requests`.

    Requests go out on schedule whatever the replies' pace (up to `workers` in flight), so a slow
    phase shows up as errors or latency, not as fewer requests.
    """

    def __init__(
        self,
        stack: LocalStack,
        models: tuple[str, ...],
        *,
        rate: float = 30.0,
        max_tokens: int = 20,
        max_requests: int = 3000,
        workers: int = 64,
    ) -> None:
        self._stack = stack
        self._models = models
        self._interval_s = 1.0 / rate
        self._max_tokens = max_tokens
        self._max_requests = max_requests
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
        self._futures: list[concurrent.futures.Future[Result]] = []
        self._stopping = threading.Event()
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OpenLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        start = time.monotonic()
        for index in range(self._max_requests):
            delay = start + index * self._interval_s - time.monotonic()
            if self._stopping.wait(max(0.0, delay)):
                return
            model = self._models[index % len(self._models)]
            future = self._pool.submit(
                completion_request, self._stack, model, self._max_tokens, stream=index % 2 == 0
            )
            with self._progress:
                self._futures.append(future)
                self._progress.notify_all()

    def sent(self) -> int:
        return len(self._futures)

    def wait_sent(self, count: int, timeout_s: float = 60.0) -> None:
        """Block until `count` requests have gone out (bounded)."""
        with self._progress:
            if not self._progress.wait_for(lambda: len(self._futures) >= count, timeout=timeout_s):
                raise AssertionError(f"only {len(self._futures)} of {count} requests sent")

    def stop(self) -> list[Result]:
        """Stop sending, wait for every request sent, and return their results in sending order."""
        self._stopping.set()
        self._thread.join(timeout=REQUEST_TIMEOUT_S)
        results = [future.result(timeout=REQUEST_TIMEOUT_S) for future in self._futures]
        with contextlib.suppress(RuntimeError):
            self._pool.shutdown(wait=True)
        return results
