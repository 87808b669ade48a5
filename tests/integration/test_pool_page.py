"""`/debug/pool` in a real headless Chromium, against a running gateway (Envoy, `epp sim` pods, EPP).

Traffic is sent through Envoy, then a few long streamed completions are held open while nothing
else is sent, so the pool stands still: the JSON read before and after the page agrees, and the
page's DOM (read after its script fetched and rendered the JSON) must show exactly that: the same
pods, slots, adapters per GPU slot and host tier, and requests in flight. The held requests are
then let go and the page shows them gone. A screenshot of the page is kept in pytest's tmp dir.

Chromium is Debian's `chromium` package (CI installs it); without it the browser test skips.
"""

from __future__ import annotations

import collections
import dataclasses
import http.client
import json
import pathlib
import shutil
import struct
import subprocess
import urllib.request
import zlib
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import aiohttp
import pytest

from epp.tools.localstack import LocalStack, StackOptions
from testkit.waiting import eventually_value, wait_until
from tests.integration.conftest import SIM, _started, completion, models_yaml
from tests.integration.test_serve_grpc import FakePods, finish, settings, start, write_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium not installed: apt-get install -y chromium chromium-driver"
)
# Chromium as root in a container: no sandbox, no GPU, and nothing that reaches off the machine.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
VIRTUAL_TIME_MS = 5000  # lets the page's script fetch and render (twice: it refreshes every 2 s)
WINDOW = (1400, 1000)

# Two pods with two LoRA slots each and eight adapters: the warm-up moves adapters out of the GPU
# slots into the host tier. Each token takes 50 ms, so a held completion of HELD_TOKENS streams
# for a minute: long past the checks, which close it.
ADAPTERS = tuple(f"adapter-{i}" for i in range(8))
STACK = StackOptions(
    pods=2,
    sim=dataclasses.replace(SIM, adapters=ADAPTERS, inter_token_latency_s=0.05),
    extra_pool_yaml=models_yaml(("base", *ADAPTERS)),
)
HELD_TOKENS = 1200
HELD = ("adapter-0", "adapter-1", "adapter-0")
WARM_UP = 2 * len(ADAPTERS)


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    yield from _started(STACK)


def pool_json(stack: LocalStack) -> Any:
    url = f"http://127.0.0.1:{stack.epp_metrics_port}/debug/pool.json"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def chromium(tmp_path: pathlib.Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """One headless Chromium run with a fresh profile; fails the test on a non-zero exit."""
    assert CHROMIUM is not None
    profile = tmp_path / f"profile-{name}"
    result = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def page_dom(stack: LocalStack, tmp_path: pathlib.Path, name: str) -> str:
    url = f"http://127.0.0.1:{stack.epp_metrics_port}/debug/pool"
    return chromium(tmp_path, name, f"--virtual-time-budget={VIRTUAL_TIME_MS}", "--dump-dom", url).stdout


@dataclasses.dataclass
class Row:
    pod: str
    slots: int
    in_flight: int
    gpu: dict[int, tuple[str, int]] = dataclasses.field(default_factory=dict)  # slot -> (adapter, in flight)
    host: list[str] = dataclasses.field(default_factory=list)


class PoolDom(HTMLParser):
    """What the rendered page shows, read from its elements' `data-*` attributes."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.view: dict[str, str] = {}
        self.rows: dict[str, Row] = {}
        self.adapters: dict[str, int] = {}
        self.decision_keys: list[str] = []
        self._row: Row | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        data = {key: value or "" for key, value in attrs}
        if tag == "main" and data.get("id") == "view":
            self.view = data
        if tag == "tr":
            self._row = None
            if "data-endpoint" in data:
                self._row = self.rows[data["data-endpoint"]] = Row(
                    data["data-pod"], int(data["data-slots"]), int(data["data-in-flight"])
                )
            elif "data-adapter" in data:
                self.adapters[data["data-adapter"]] = int(data["data-in-flight"])
            elif "data-key" in data:
                self.decision_keys.append(data["data-key"])
        row = self._row
        if row is None:
            return
        if tag == "td" and data.get("data-tier") == "gpu":
            row.gpu[int(data["data-slot"])] = (data["data-adapter"], int(data["data-in-flight"]))
        if tag == "span" and data.get("data-tier") == "host":
            row.host.append(data["data-adapter"])


def expected_rows(view: Any) -> dict[str, Row]:
    """What the page must show for `view`: GPU entries in slot order, free slots up to `slots`."""
    rows = {}
    for pod in view["pods"]:
        for endpoint in pod["endpoints"]:
            gpu = {i: (entry["adapter"], entry["in_flight"]) for i, entry in enumerate(endpoint["gpu"])}
            for free in range(len(gpu), endpoint["slots"]):
                gpu[free] = ("", 0)
            rows[endpoint["name"]] = Row(
                pod["name"], endpoint["slots"], endpoint["in_flight"], gpu, endpoint["host"]
            )
    return rows


def shown(view: Any) -> object:
    """The part of the view the comparison covers (scrape ages and the like move on their own)."""
    return (
        expected_rows(view),
        {row["name"]: row["in_flight"] for row in view["adapters"]},
        [entry["key"] for entry in view["decisions"]],
    )


@dataclasses.dataclass
class Held:
    """A streamed completion kept open: in flight on its pod until closed."""

    connection: http.client.HTTPConnection
    response: http.client.HTTPResponse
    adapter: str

    @property
    def pod(self) -> str:
        return self.response.getheader("x-inference-pod") or ""


def hold(stack: LocalStack, adapter: str) -> Held:
    host, port = stack.gateway_url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    body = {"model": adapter, "prompt": "Tell a long story.", "max_tokens": HELD_TOKENS, "stream": True}
    connection.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    response = connection.getresponse()  # the headers: routed, and streaming
    assert response.status == 200, response.read()
    return Held(connection, response, adapter)


def assert_png(path: pathlib.Path, size: tuple[int, int]) -> None:
    """A real PNG of `size` whose pixels are not all alike (a rendered page, not a blank one)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    chunks: dict[bytes, bytes] = collections.defaultdict(bytes)
    offset = 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        chunks[kind] += data[offset + 8 : offset + 8 + length]
        offset += 12 + length
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    assert (width, height) == size
    pixels = zlib.decompress(chunks[b"IDAT"])
    assert len(set(pixels)) > 64, "the screenshot is (nearly) one colour"


@needs_chromium
def test_the_page_shows_what_the_json_says(stack: LocalStack, tmp_path: pathlib.Path) -> None:
    for i in range(WARM_UP):
        assert completion(stack, ADAPTERS[i % len(ADAPTERS)]).status == 200
    held: list[Held] = []
    try:
        held = [hold(stack, adapter) for adapter in HELD]
        # Once the warm-up's access-log entries are in, only the held requests are in flight.
        wait_until(
            lambda: sum(row["in_flight"] for row in pool_json(stack)["adapters"]) == len(HELD),
            "only the held requests in flight",
        )
        before = pool_json(stack)
        on_pod: collections.Counter[tuple[str, str]] = collections.Counter((h.pod, h.adapter) for h in held)
        for pod in before["pods"]:
            [endpoint] = pod["endpoints"]
            assert endpoint["in_flight"] == sum(n for (p, _), n in on_pod.items() if p == pod["name"])
            for adapter in ADAPTERS:
                assert endpoint["in_flight_by_adapter"].get(adapter, 0) == on_pod[(pod["name"], adapter)]
        # An adapter that sits nowhere and has nothing in flight has no row.
        adapter_rows = {row["name"]: row["in_flight"] for row in before["adapters"]}
        assert set(adapter_rows) >= set(HELD)
        assert {adapter: adapter_rows.get(adapter, 0) for adapter in ADAPTERS} == {
            adapter: HELD.count(adapter) for adapter in ADAPTERS
        }

        assert any(endpoint["host"] for pod in before["pods"] for endpoint in pod["endpoints"])
        dom = PoolDom(page_dom(stack, tmp_path, "held"))
        after = pool_json(stack)
        assert shown(after) == shown(before), "the pool moved while nothing was sent"
        assert dom.view["data-version"] == str(before["version"])
        assert int(dom.view["data-renders"]) >= 1
        assert dom.rows == expected_rows(before)
        assert dom.adapters == {row["name"]: row["in_flight"] for row in before["adapters"]}
        assert dom.decision_keys == [entry["key"] for entry in before["decisions"]]

        screenshot = tmp_path / "pool.png"
        chromium(
            tmp_path,
            "screenshot",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            f"--virtual-time-budget={VIRTUAL_TIME_MS}",
            f"--screenshot={screenshot}",
            f"http://127.0.0.1:{stack.epp_metrics_port}/debug/pool",
        )
        assert_png(screenshot, WINDOW)
    finally:
        for request in held:
            request.connection.close()

    def idle_view() -> Any:
        view = pool_json(stack)
        return None if any(row["in_flight"] for row in view["adapters"]) else view

    idle = eventually_value(
        idle_view,
        within_s=30,
        what="the held requests to finish once their clients left",
    )
    dom = PoolDom(page_dom(stack, tmp_path, "idle"))
    assert all(row.in_flight == 0 for row in dom.rows.values())
    assert set(dom.rows) == set(expected_rows(idle))


async def test_the_page_and_its_json_need_the_metrics_token(tmp_path: pathlib.Path) -> None:
    token = "pool-page-token-0123456789"
    token_file = tmp_path / "token"
    token_file.write_text(token)
    pods = FakePods()
    await pods.start()
    try:
        running = await start(
            settings(write_pool(tmp_path, pods.port), observability={"metrics_auth_token_file": token_file})
        )
        try:
            base = f"http://127.0.0.1:{running.ports.metrics}/debug"
            auth = {"Authorization": f"Bearer {token}"}
            async with aiohttp.ClientSession() as session:
                for path in ("/pool", "/pool.json"):
                    async with session.get(base + path) as response:
                        assert response.status == 401, path
                    async with session.get(
                        base + path, headers={"Authorization": "Bearer wrong"}
                    ) as response:
                        assert response.status == 401, path
                async with session.get(f"{base}/pool", headers=auth) as response:
                    assert response.status == 200 and response.content_type == "text/html"
                async with session.get(f"{base}/pool.json", headers=auth) as response:
                    view = await response.json()
            assert view["version"] == 1 and view["scheduler"] == "round-robin"
            assert len(view["pods"]) == len(pods.scrapes)
        finally:
            await finish(running)
    finally:
        await pods.stop()
