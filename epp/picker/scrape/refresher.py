"""Scrape every endpoint's `/metrics` on its own schedule and keep the datastore's metrics current.

One task per endpoint, started and stopped as the endpoint set changes, all sharing one
keep-alive `aiohttp` session with at most one connection per endpoint. A slow, hung or
broken endpoint only ever costs its own task: each fetch has a deadline and a body cap, and
a failing endpoint backs off (exponentially, jittered) and is recorded in the datastore as
failing, so the scheduler treats it as stale. Nothing a model server sends can stop the loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import aiohttp

from epp.clock import Clock
from epp.errors import ConfigError
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import Endpoint, Metrics, format_address
from epp.picker.logs import TRACE
from epp.picker.scrape.backoff import Backoff
from epp.picker.scrape.parse import DEFAULT_NAMES, MetricNames, MetricsParseError, parse_metrics

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # a busy vLLM page is ≈ 58 KB
DEFAULT_BACKOFF_CAP_S = 5.0
_READ_CHUNK_BYTES = 64 * 1024
# Ask for the classic text format: prometheus_client would otherwise be free to negotiate OpenMetrics.
_ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"


@dataclass(frozen=True, slots=True)
class ScrapeStats:
    """Scrape counters of one endpoint since its task started, for operators' metrics."""

    endpoint_name: str
    url: str
    scrapes_ok: int = 0
    scrapes_failed: int = 0
    consecutive_failures: int = 0
    last_scrape_duration_s: float | None = None  # fetch + parse of the latest attempt
    last_success_at: float | None = None  # Clock time
    last_error: str = ""  # "" after a success
    last_body_bytes: int = 0


class ScrapeFailed(Exception):
    """One scrape did not produce metrics; the message says why, for logs and the datastore."""


@dataclass(slots=True)
class _EndpointScraper:
    """Mutable per-endpoint state, owned by that endpoint's task."""

    endpoint: Endpoint
    url: str
    stats: ScrapeStats
    metrics: Metrics | None = None
    reachable: bool | None = None  # None until the first attempt finishes


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """Where an endpoint's metrics page is: `scheme://ip:port/path`, IPv6 in brackets.

    `port` overrides the endpoint's own (a metrics port apart from the serving one).
    """

    scheme: str = "http"
    port: int | None = None
    path: str = "/metrics"
    insecure_skip_verify: bool = True  # https without certificate verification

    def __post_init__(self) -> None:
        if self.scheme not in ("http", "https"):
            raise ConfigError(f"metrics scheme must be http or https, got {self.scheme!r}")
        if self.port is not None and not 0 < self.port < 65536:
            raise ConfigError(f"metrics port must be in 1..65535, got {self.port!r}")
        if not self.path.startswith("/"):
            raise ConfigError(f"metrics path must start with '/', got {self.path!r}")

    def url(self, endpoint: Endpoint) -> str:
        port = self.port if self.port is not None else endpoint.port
        return f"{self.scheme}://{format_address(endpoint.ip, port)}{self.path}"


@dataclass(frozen=True, slots=True)
class ScrapePacing:
    """How often and how patiently: one scrape per `interval_s`, each bounded by `timeout_s`
    (connect, headers, body) and `max_body_bytes`; a failing endpoint backs off up to `backoff_cap_s`."""

    interval_s: float
    timeout_s: float = 5.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    backoff_cap_s: float = DEFAULT_BACKOFF_CAP_S

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ConfigError(f"metrics scrape interval must be positive, got {self.interval_s!r} s")
        if not self.timeout_s > 0:
            raise ConfigError(f"metrics scrape timeout must be positive, got {self.timeout_s!r} s")
        if self.max_body_bytes < 1:
            raise ConfigError(f"metrics body limit must be positive, got {self.max_body_bytes!r} bytes")


@dataclass(frozen=True, slots=True)
class PageReading:
    """How a page is read: which sample names mean what, and the base model's served name."""

    names: MetricNames = DEFAULT_NAMES
    served_model_name: str | None = None


class MetricsRefresher:
    """Keeps each endpoint's `Metrics` in the datastore fresh by scraping it at the pacing's
    interval. `run()` scrapes until cancelled and leaves no task behind."""

    def __init__(
        self,
        datastore: Datastore,
        clock: Clock,
        pacing: ScrapePacing,
        *,
        target: ScrapeTarget = ScrapeTarget(),
        reading: PageReading = PageReading(),
        rng: random.Random | None = None,
    ) -> None:
        self._datastore = datastore
        self._clock = clock
        self._pacing = pacing
        self._target = target
        self._reading = reading
        # aiohttp: ssl=False skips certificate verification, True verifies with the default context.
        self._ssl = not target.insecure_skip_verify
        interval_s = pacing.interval_s
        self._backoff = Backoff(
            base_s=interval_s, cap_s=max(pacing.backoff_cap_s, interval_s), floor_s=interval_s
        )
        self._rng = rng if rng is not None else random.Random()
        self._session: aiohttp.ClientSession | None = None
        self._group: asyncio.TaskGroup | None = None
        self._scrapers: dict[str, tuple[_EndpointScraper, asyncio.Task[None]]] = {}
        datastore.on_endpoints_changed(self._sync_tasks)

    # -- public ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Scrape until cancelled; endpoint tasks follow `datastore.on_endpoints_changed`."""
        if self._group is not None:
            raise RuntimeError("MetricsRefresher.run is already running")
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=1)
        timeout = aiohttp.ClientTimeout(total=self._pacing.timeout_s)
        try:
            async with (
                aiohttp.ClientSession(
                    connector=connector, timeout=timeout, headers={"Accept": _ACCEPT}
                ) as session,
                asyncio.TaskGroup() as group,
            ):
                self._session = session
                self._group = group
                try:
                    self._sync_tasks()
                    await asyncio.Event().wait()  # the endpoint tasks do the work
                finally:
                    # From here on endpoint changes start nothing; the group cancels what runs.
                    self._group = None
        finally:
            self._session = None
            self._scrapers.clear()

    def stats(self) -> Mapping[str, ScrapeStats]:
        """Scrape stats by endpoint name, for the endpoints being scraped now."""
        return MappingProxyType({name: scraper.stats for name, (scraper, _) in self._scrapers.items()})

    def url_for(self, endpoint: Endpoint) -> str:
        return self._target.url(endpoint)

    # -- endpoint tasks --------------------------------------------------------------------

    def _sync_tasks(self) -> None:
        """Start a task per new endpoint, stop those of removed or re-addressed ones."""
        group = self._group
        if group is None:
            return
        wanted = {endpoint.name: endpoint for endpoint in self._datastore.endpoints()}
        for name, (scraper, task) in list(self._scrapers.items()):
            if wanted.get(name) != scraper.endpoint:
                task.cancel()
                del self._scrapers[name]
                log.debug("metrics scraping stopped", extra={"endpoint": name, "url": scraper.url})
        for name, endpoint in wanted.items():
            if name in self._scrapers:
                continue
            url = self.url_for(endpoint)
            scraper = _EndpointScraper(endpoint=endpoint, url=url, stats=ScrapeStats(name, url))
            task = group.create_task(self._scrape_loop(scraper), name=f"metrics-refresh:{name}")
            self._scrapers[name] = (scraper, task)
            log.debug("metrics scraping started", extra={"endpoint": name, "url": url})

    async def _scrape_loop(self, scraper: _EndpointScraper) -> None:
        # After the first scrape each endpoint is shifted by a random phase, so a large pool's
        # scrapes (and their parse CPU) spread over the interval instead of arriving together.
        phase_s = self._rng.uniform(0.0, self._pacing.interval_s)
        while True:
            started = self._clock.now()
            ok = await self._scrape_once(scraper)
            if ok:
                delay_s = started + self._pacing.interval_s + phase_s - self._clock.now()
                phase_s = 0.0
            else:
                delay_s = self._backoff.delay_s(scraper.stats.consecutive_failures, self._rng)
            await self._clock.sleep(max(0.0, delay_s))

    async def _scrape_once(self, scraper: _EndpointScraper) -> bool:
        """Fetch and parse once, record the outcome in the datastore and stats; True on success."""
        started = self._clock.now()
        body_bytes = 0
        try:
            body = await self._fetch(scraper.url)
            body_bytes = len(body)
            metrics = parse_metrics(
                body.decode("utf-8"),
                self._clock.now(),
                served_model_name=self._reading.served_model_name,
                names=self._reading.names,
                previous=scraper.metrics,
            )
        except (ScrapeFailed, MetricsParseError) as err:
            self._record_failure(scraper, str(err), self._clock.now() - started, body_bytes)
            return False
        except UnicodeDecodeError as err:
            self._record_failure(
                scraper, f"body is not UTF-8: {err}", self._clock.now() - started, body_bytes
            )
            return False
        self._record_success(scraper, metrics, self._clock.now() - started, body_bytes)
        return True

    async def _fetch(self, url: str) -> bytes:
        session = self._session
        if session is None:
            raise ScrapeFailed("refresher is not running")
        try:
            async with session.get(url, ssl=self._ssl, allow_redirects=False) as response:
                if response.status != 200:
                    raise ScrapeFailed(f"HTTP {response.status} from {url}")
                if (
                    response.content_length is not None
                    and response.content_length > self._pacing.max_body_bytes
                ):
                    raise ScrapeFailed(self._too_large_message(response.content_length))
                chunks: list[bytes] = []
                received = 0
                async for chunk in response.content.iter_chunked(_READ_CHUNK_BYTES):
                    received += len(chunk)
                    if received > self._pacing.max_body_bytes:
                        raise ScrapeFailed(self._too_large_message(received))
                    chunks.append(chunk)
                return b"".join(chunks)
        except TimeoutError as err:
            raise ScrapeFailed(
                f"no complete response from {url} within {self._pacing.timeout_s:g} s"
            ) from err
        except aiohttp.ClientError as err:
            raise ScrapeFailed(f"{type(err).__name__} from {url}: {err}") from err

    def _too_large_message(self, size_bytes: int) -> str:
        limit = self._pacing.max_body_bytes
        return f"metrics body of at least {size_bytes} bytes exceeds the {limit}-byte limit"

    # -- outcomes --------------------------------------------------------------------------

    def _record_success(
        self, scraper: _EndpointScraper, metrics: Metrics, duration_s: float, body_bytes: int
    ) -> None:
        previous_stats = scraper.stats
        scraper.metrics = metrics
        scraper.stats = replace(
            previous_stats,
            scrapes_ok=previous_stats.scrapes_ok + 1,
            consecutive_failures=0,
            last_scrape_duration_s=duration_s,
            last_success_at=metrics.updated_at,
            last_error="",
            last_body_bytes=body_bytes,
        )
        self._datastore.update_metrics(scraper.endpoint.name, metrics)
        if scraper.reachable is False:
            log.info(
                "endpoint metrics recovered",
                extra={
                    "endpoint": scraper.endpoint.name,
                    "url": scraper.url,
                    "failed_scrapes": previous_stats.consecutive_failures,
                },
            )
        scraper.reachable = True
        if log.isEnabledFor(TRACE):
            log.log(
                TRACE,
                "metrics scraped",
                extra={
                    "endpoint": scraper.endpoint.name,
                    "duration_s": duration_s,
                    "waiting": metrics.waiting_requests,
                    "running": metrics.running_requests,
                    "kv_cache_usage": metrics.kv_cache_usage,
                    "active_adapters": sorted(metrics.active_adapters),
                },
            )

    def _record_failure(
        self, scraper: _EndpointScraper, error: str, duration_s: float, body_bytes: int
    ) -> None:
        previous_stats = scraper.stats
        scraper.stats = replace(
            previous_stats,
            scrapes_failed=previous_stats.scrapes_failed + 1,
            consecutive_failures=previous_stats.consecutive_failures + 1,
            last_scrape_duration_s=duration_s,
            last_error=error,
            last_body_bytes=body_bytes,
        )
        self._datastore.record_scrape_failure(scraper.endpoint.name, error)
        if scraper.reachable is not False:
            log.warning(
                "endpoint metrics unavailable",
                extra={"endpoint": scraper.endpoint.name, "url": scraper.url, "error": error},
            )
        scraper.reachable = False
        if log.isEnabledFor(TRACE):
            log.log(
                TRACE,
                "metrics scrape failed",
                extra={"endpoint": scraper.endpoint.name, "duration_s": duration_s, "error": error},
            )
