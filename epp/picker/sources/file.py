"""The standalone source: a pool described by a YAML file instead of a cluster.

The file holds the very objects a user would `kubectl apply` (multi-document YAML, or a
`kind: List`): one InferencePool (v1 or x-k8s v1alpha2), InferenceModels,
InferenceObjectives and `v1` Pods with labels, `status.podIP` and, optionally, a Ready
condition. Every object is checked as the API server would check it, plus unknown fields
(which a cluster would prune) are rejected as typos.

Pods: a pod with a `status.podIP` and no `status.conditions` counts as Ready, so short
files stay short; an explicit `Ready` condition that is not `"True"` is not Ready, and a
`metadata.deletionTimestamp` marks the pod as leaving.

InferenceModels without a `creationTimestamp` are ordered by their place in the file
(earlier = older, and older than any object that has a timestamp) when two claim one
`modelName`.

A file is applied whole or not at all. While running, a change of content is applied
without dropping traffic (endpoints that stay keep their metrics); a bad or missing file
is logged once and the last good state is kept.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from epp.clock import Clock
from epp.errors import ConfigError
from epp.picker.datastore.store import Datastore
from epp.picker.datastore.types import InferenceModel, InferenceObjective, PodInfo, Pool
from epp.picker.sources.objects import ObjectError, iter_list_items, parse_object

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class PoolFile:
    """The validated content of a pool file, ready to apply."""

    pool: Pool
    pods: tuple[PodInfo, ...]
    models: tuple[InferenceModel, ...]
    objectives: tuple[InferenceObjective, ...]


def parse_pool_file(text: str, *, source: str, pool_name: str, pool_namespace: str) -> PoolFile:
    """Validate a whole pool file; a `ConfigError` names the file, document, object and field.

    `pool_name` empty: the file must hold exactly one InferencePool. `pool_namespace` empty:
    objects without a namespace are in `default` and the pool is matched by name alone.
    """
    default_namespace = pool_namespace or "default"
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: {_yaml_problem(err)}") from None

    pools: list[Pool] = []
    pods: list[PodInfo] = []
    models: list[InferenceModel] = []
    objectives: list[InferenceObjective] = []
    seen: dict[tuple[str, str, str], int] = {}
    order = 0
    for index, document in enumerate(documents, start=1):
        if document is None:  # an empty document, e.g. a trailing `---`
            continue
        where = f"{source}: document {index}"
        if not isinstance(document, Mapping):
            raise ConfigError(
                f"{where}: must be a Kubernetes object (a mapping), got {type(document).__name__}"
            )
        try:
            for item in iter_list_items(document):
                parsed = parse_object(
                    item, default_namespace=default_namespace, strict=True, ready_without_conditions=True
                )
                key = (type(parsed).__name__, parsed.namespace, parsed.name)
                if key in seen:
                    raise ConfigError(
                        f"{where}: {_kind_of(item)} {parsed.namespace}/{parsed.name} "
                        f"is already defined in document {seen[key]}"
                    )
                seen[key] = index
                if isinstance(parsed, Pool):
                    pools.append(parsed)
                elif isinstance(parsed, PodInfo):
                    pods.append(parsed)
                elif isinstance(parsed, InferenceModel):
                    if not _has_creation_timestamp(item):
                        parsed = dataclasses.replace(parsed, creation_timestamp=float(order))
                    models.append(parsed)
                else:
                    objectives.append(parsed)
                order += 1
        except ObjectError as err:
            raise ConfigError(f"{where}: {err}") from None

    pool = _select_pool(pools, source=source, pool_name=pool_name, pool_namespace=pool_namespace)
    referrers: list[InferenceModel | InferenceObjective] = [*models, *objectives]
    for referrer in referrers:
        if (referrer.namespace, referrer.pool_name) != (pool.namespace, pool.name):
            log.warning(
                "pool file object references another pool; it is ignored",
                extra={
                    "path": source,
                    "object": f"{referrer.namespace}/{referrer.name}",
                    "pool_ref": f"{referrer.namespace}/{referrer.pool_name}",
                    "pool": f"{pool.namespace}/{pool.name}",
                },
            )
    return PoolFile(pool=pool, pods=tuple(pods), models=tuple(models), objectives=tuple(objectives))


def _kind_of(obj: Mapping[str, Any]) -> str:
    kind = obj.get("kind")
    return kind if isinstance(kind, str) else "object"


def _has_creation_timestamp(obj: Mapping[str, Any]) -> bool:
    metadata = obj.get("metadata")
    return isinstance(metadata, Mapping) and metadata.get("creationTimestamp") is not None


def _yaml_problem(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    if mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}: invalid YAML: {problem}"
    return f"invalid YAML: {problem}"


def _select_pool(pools: Sequence[Pool], *, source: str, pool_name: str, pool_namespace: str) -> Pool:
    found = ", ".join(f"{p.namespace}/{p.name}" for p in pools) or "none"
    if not pool_name:
        if len(pools) == 1:
            return pools[0]
        if not pools:
            raise ConfigError(f"{source}: the file holds no InferencePool")
        raise ConfigError(
            f"{source}: the file holds several InferencePools ({found}); choose one with --pool-name"
        )
    for pool in pools:
        if pool.name == pool_name and (not pool_namespace or pool.namespace == pool_namespace):
            return pool
    wanted = f"{pool_namespace}/{pool_name}" if pool_namespace else pool_name
    raise ConfigError(f"{source}: InferencePool {wanted} is not in the file (found: {found})")


class FileSource:
    """Keeps the datastore in step with a pool file."""

    def __init__(
        self,
        path: pathlib.Path,
        datastore: Datastore,
        *,
        pool_name: str,
        pool_namespace: str,
        clock: Clock,
        poll_interval_s: float = 1.0,
    ) -> None:
        if poll_interval_s <= 0:
            raise ConfigError(f"pool file poll interval must be positive, got {poll_interval_s}")
        self._path = path
        self._datastore = datastore
        self._pool_name = pool_name
        self._pool_namespace = pool_namespace
        self._clock = clock
        self._poll_interval_s = poll_interval_s
        # Digest of the content last applied, and of the last content that failed (logged once).
        self._applied_digest: bytes | None = None
        self._failed_digest: bytes | None = None
        self._missing_logged = False

    @property
    def path(self) -> pathlib.Path:
        return self._path

    def load(self) -> None:
        """Read, validate and apply the file; a `ConfigError` (nothing applied) if it is bad or missing."""
        content = self._read()
        self._apply(content, hashlib.sha256(content).digest())

    def poll(self) -> bool:
        """Apply the file if its content changed since the last good one; True when applied.

        The content is hashed on every poll rather than trusting mtime: a same-size edit
        within the mtime resolution, or a ConfigMap symlink swap, still shows. Errors are
        logged (once per distinct content) and the last good state stays.
        """
        try:
            content = self._read()
        except ConfigError as err:
            if not self._missing_logged:
                log.error(
                    "pool file unreadable; keeping the last good state",
                    extra={"path": str(self._path), "error": str(err)},
                )
                self._missing_logged = True
            # A bad file that comes back is reported again.
            self._failed_digest = None
            return False
        self._missing_logged = False
        digest = hashlib.sha256(content).digest()
        if digest in (self._applied_digest, self._failed_digest):
            return False
        try:
            self._apply(content, digest)
        except ConfigError as err:
            self._failed_digest = digest
            log.error(
                "pool file rejected; keeping the last good state",
                extra={"path": str(self._path), "error": str(err)},
            )
            return False
        return True

    async def run(self) -> None:
        """Poll the file every `poll_interval_s` (on the injected clock) until cancelled."""
        while True:
            await self._clock.sleep(self._poll_interval_s)
            self.poll()

    def _read(self) -> bytes:
        # A small local file: reading it on the loop costs less than a thread hop.
        try:
            return self._path.read_bytes()
        except OSError as err:
            raise ConfigError(f"cannot read pool file {self._path}: {err.strerror or err}") from None

    def _apply(self, content: bytes, digest: bytes) -> None:
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"{self._path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        parsed = parse_pool_file(
            text, source=str(self._path), pool_name=self._pool_name, pool_namespace=self._pool_namespace
        )
        if self._datastore.pool != parsed.pool:
            self._datastore.set_pool(parsed.pool)
        self._datastore.replace_pods(parsed.pods)
        self._datastore.replace_models(parsed.models)
        self._datastore.replace_objectives(parsed.objectives)
        self._applied_digest = digest
        self._failed_digest = None
        log.info(
            "pool file applied",
            extra={
                "path": str(self._path),
                "pool": f"{parsed.pool.namespace}/{parsed.pool.name}",
                "pods": len(parsed.pods),
                "models": len(parsed.models),
                "objectives": len(parsed.objectives),
            },
        )
