"""Client traffic for the fault tests, sent by the project's load generator (`epp.tools.loadgen`).

`completion_request` sends one completion through a stack's gateway and reads it to its end;
`open_load` sends a fixed rate of mixed streamed and non-streamed requests in the background,
bounded in count and time, while a test breaks the stack; `streams_through_an_epp_kill` kills the
EPP while streams are mid-response. Every request opens its own connection, so a process killed
behind the gateway never fails a request through a pooled connection.
"""

from __future__ import annotations

import asyncio

from epp.tools.loadgen import Answer, BackgroundLoad, Request, client, send, send_one
from epp.tools.localstack import LocalStack
from testkit import faults

REQUEST_TIMEOUT_S = 60.0


def completion_request(stack: LocalStack, model: str, max_tokens: int, *, stream: bool) -> Answer:
    """One completion through the gateway, read to its end."""
    request = Request.completion(model, max_tokens, stream=stream)
    return send_one(stack.gateway_url, request, timeout_s=REQUEST_TIMEOUT_S)


def open_load(
    stack: LocalStack,
    models: tuple[str, ...],
    *,
    rate: float = 30.0,
    max_tokens: int = 20,
    max_requests: int = 3000,
    max_in_flight: int = 64,
) -> BackgroundLoad:
    """`rate` requests/s through the gateway (every other one streamed, the models in turn) until
    stopped, at most `max_requests`."""

    def request_at(index: int) -> Request:
        return Request.completion(models[index % len(models)], max_tokens, stream=index % 2 == 0)

    return BackgroundLoad(
        stack.gateway_url,
        request_at,
        rate=rate,
        max_requests=max_requests,
        max_in_flight=max_in_flight,
        timeout_s=REQUEST_TIMEOUT_S,
    )


def streams_through_an_epp_kill(
    stack: LocalStack, adapters: tuple[str, ...], max_tokens: int, *, streams: int = 6
) -> list[Answer]:
    """`streams` streamed completions, the EPP SIGKILLed once every one has its first chunk, each
    read to its end."""

    async def run() -> list[Answer]:
        started = [asyncio.Event() for _ in range(streams)]
        async with client(timeout_s=REQUEST_TIMEOUT_S, keep_alive=False) as session:
            answers = [
                asyncio.create_task(
                    send(
                        session,
                        stack.gateway_url,
                        Request.completion(adapters[index % len(adapters)], max_tokens, stream=True),
                        on_first_chunk=event.set,
                    )
                )
                for index, event in enumerate(started)
            ]
            try:
                async with asyncio.timeout(30):
                    await asyncio.gather(*(event.wait() for event in started))
            except TimeoutError:
                raise AssertionError("a stream did not start") from None
            await asyncio.to_thread(faults.stop_epp, stack)  # SIGKILL while every stream is mid-response
            return list(await asyncio.gather(*answers))

    return asyncio.run(run())
