"""HTTP helpers for the real-vLLM tier and a second, independent reading of `/metrics` text.

`RawPage` reads the Prometheus text format line by line with a small regex of its own (no
`prometheus_client`, no code shared with `epp.picker.scrape.parse`), so comparing the two catches a
scraper that drops, misreads or mixes up series.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence

BASE_MODEL = "tiny-llama"
ADAPTERS = ("lora-0", "lora-1", "lora-2", "lora-3")
REQUEST_TIMEOUT_S = 120.0
PROMPT = "router gateway envoy endpoint picker pool pod model adapter lora slot cache "


@dataclasses.dataclass(frozen=True, slots=True)
class RealPod:
    name: str
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes
    elapsed_s: float

    def json(self) -> dict[str, object]:
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value


def post_json(url: str, body: Mapping[str, object], *, timeout_s: float = REQUEST_TIMEOUT_S) -> Reply:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"content-type": "application/json"}
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            data = response.read()
            return Reply(
                response.status,
                {k.lower(): v for k, v in response.headers.items()},
                data,
                time.monotonic() - started,
            )
    except urllib.error.HTTPError as err:
        return Reply(
            err.code, {k.lower(): v for k, v in err.headers.items()}, err.read(), time.monotonic() - started
        )


def completion(base_url: str, model: str, max_tokens: int, *, prompt: str = PROMPT, **extra: object) -> Reply:
    body: dict[str, object] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # every request generates exactly max_tokens: the load is what we asked
        **extra,
    }
    return post_json(f"{base_url}/v1/completions", body)


def concurrent_completions(
    base_url: str, models: Sequence[str], max_tokens: int, *, workers: int | None = None
) -> list[Reply]:
    """One completion per entry of `models`, all in flight at once; replies in the same order."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers or len(models)) as pool:
        return list(pool.map(lambda model: completion(base_url, model, max_tokens), models))


def get_text(url: str, *, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        data: bytes = response.read()
    return data.decode()


def scrape(pod: RealPod) -> str:
    return get_text(f"{pod.url}/metrics")


# ----- an independent reading of the exposition text --------------------------------------

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)\s*$")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"\s*,?\s*')


@dataclasses.dataclass(frozen=True, slots=True)
class RawSample:
    name: str
    labels: Mapping[str, str]
    value: float


@dataclasses.dataclass(frozen=True, slots=True)
class RawPage:
    samples: tuple[RawSample, ...]
    types: Mapping[str, str]  # family name (as on the TYPE line) → type

    @classmethod
    def parse(cls, text: str) -> RawPage:
        samples: list[RawSample] = []
        types: dict[str, str] = {}
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                types[name] = kind.strip()
                continue
            if not line or line.startswith("#"):
                continue
            match = _SAMPLE.match(line)
            assert match is not None, f"unreadable sample line: {line!r}"
            labels: dict[str, str] = {}
            raw_labels = match["labels"] or ""
            position = 0
            while position < len(raw_labels):
                label = _LABEL.match(raw_labels, position)
                assert label is not None, f"unreadable labels in {line!r}"
                labels[label["key"]] = label["value"].replace('\\"', '"').replace("\\\\", "\\")
                position = label.end()
            samples.append(RawSample(match["name"], labels, float(match["value"])))
        return cls(tuple(samples), types)

    def series(self, name: str, **labels: str) -> list[RawSample]:
        return [
            s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float:
        found = self.series(name, **labels)
        assert len(found) == 1, f"expected one {name}{labels} sample, found {len(found)}"
        return found[0].value

    def counter_total(self, name: str) -> float:
        return sum(s.value for s in self.series(name))

    def newest_lora(self) -> RawSample | None:
        samples = self.series("vllm:lora_requests_info")
        return max(samples, key=lambda s: s.value) if samples else None

    def lora_combinations_since(self, since_unix_s: float) -> list[frozenset[str]]:
        """Every adapter combination vLLM reported at or after `since_unix_s` (its wall clock)."""
        return [
            adapters(s.labels["running_lora_adapters"]) | adapters(s.labels["waiting_lora_adapters"])
            for s in self.series("vllm:lora_requests_info")
            if s.value >= since_unix_s
        ]


def adapters(joined: str) -> frozenset[str]:
    return frozenset(part.strip() for part in joined.split(",") if part.strip())


def successes(pod: RealPod) -> float:
    """All finished requests the server counted (`vllm:request_success_total`, every reason)."""
    return RawPage.parse(scrape(pod)).counter_total("vllm:request_success_total")


def idle(pods: Iterable[RealPod]) -> bool:
    for pod in pods:
        page = RawPage.parse(scrape(pod))
        if page.value("vllm:num_requests_running", model_name=BASE_MODEL) or page.value(
            "vllm:num_requests_waiting", model_name=BASE_MODEL
        ):
            return False
    return True
