"""Which pods the adapter survey asks, and what it reads from a real vLLM `/v1/models`."""

from __future__ import annotations

import asyncio
import pathlib
import socket
from typing import Any

import pytest
from aiohttp import web

from epp.operator.controller.adapter_survey import (
    MODELS_PATH,
    AdapterSurvey,
    PodAddress,
    ready_model_servers,
    registered_adapters,
)

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "vllm-0.32.0"


@pytest.mark.parametrize(
    ("capture", "expected"),
    [
        ("models_startup.json", frozenset({"lora-0", "lora-1", "lora-2"})),
        ("models_after_load.json", frozenset({"lora-0", "lora-1", "lora-2", "lora-3", "lora-4"})),
    ],
    ids=["registered-at-start", "after-runtime-loads"],
)
def test_registered_adapters_are_the_entries_with_a_parent(capture: str, expected: frozenset[str]) -> None:
    assert registered_adapters((FIXTURES / capture).read_bytes()) == expected


@pytest.mark.parametrize(
    "body",
    [b"<html>busy</html>", b"[]", b'{"object": "list"}', b'{"data": "x"}'],
    ids=["not-json", "not-an-object", "no-data", "data-not-a-list"],
)
def test_anything_but_a_model_list_is_no_answer(body: bytes) -> None:
    assert registered_adapters(body) is None


def _pod(name: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 8123}]}]},
        "status": status,
    }


READY = [{"type": "Ready", "status": "True"}]


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (_pod("a", podIP="10.0.0.1", conditions=READY), [PodAddress("a", "10.0.0.1", 8123)]),
        (_pod("b", podIP="10.0.0.2", conditions=[{"type": "Ready", "status": "False"}]), []),
        (_pod("c", conditions=READY), []),
        (
            {"metadata": {"name": "d"}, "status": {"podIP": "10.0.0.4", "conditions": READY}},
            [PodAddress("d", "10.0.0.4", 8000)],
        ),
        (
            _pod("e", podIP="10.0.0.5", conditions=READY)
            | {"metadata": {"name": "e", "deletionTimestamp": "2026-01-01T00:00:00Z"}},
            [],
        ),
    ],
    ids=["ready", "not-ready", "no-ip-yet", "no-named-port-uses-default", "terminating"],
)
def test_only_ready_pods_with_an_address_are_asked(pod: dict[str, Any], expected: list[PodAddress]) -> None:
    assert ready_model_servers([pod], default_port=8000) == expected


def test_ipv6_pod_addresses_are_bracketed() -> None:
    assert PodAddress("a", "fd00::1", 8000).models_url == "http://[fd00::1]:8000/v1/models"


async def test_survey_reads_each_pod_and_a_failing_pod_holds_nothing() -> None:
    body = (FIXTURES / "models_startup.json").read_bytes()

    async def models(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    async def busy(request: web.Request) -> web.Response:
        return web.Response(status=503)

    test_over = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await test_over.wait()  # no answer while the survey waits: its timeout must end the probe
        return web.Response(status=504)

    runners: dict[str, web.AppRunner] = {}
    try:
        for name, handler in (("answers", models), ("busy", busy), ("hung", hang)):
            app = web.Application()
            app.router.add_get(MODELS_PATH, handler)
            runners[name] = web.AppRunner(app)
            await runners[name].setup()
            await web.TCPSite(runners[name], "127.0.0.1", 0).start()
        pods = [PodAddress(name, "127.0.0.1", runner.addresses[0][1]) for name, runner in runners.items()]
        with socket.socket() as nobody_listening:
            nobody_listening.bind(("127.0.0.1", 0))
            pods.append(PodAddress("refused", "127.0.0.1", nobody_listening.getsockname()[1]))
            async with asyncio.timeout(10):
                answers = await AdapterSurvey(timeout_s=0.3, max_concurrent=2).survey(pods)
    finally:
        test_over.set()
        for runner in runners.values():
            await runner.cleanup()
    assert answers == {
        "answers": frozenset({"lora-0", "lora-1", "lora-2"}),
        "busy": None,
        "hung": None,
        "refused": None,
    }
