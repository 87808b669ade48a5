"""The pool file source: what a user's file turns into, how bad files are reported, and
reloads while serving (driven on a FakeClock)."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
from collections.abc import AsyncIterator, Callable

import pytest

from epp.clock import FakeClock
from epp.errors import ConfigError
from epp.picker.datastore import Datastore, Metrics
from epp.picker.sources.file import FileSource

POOL = """\
apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: vllm-pool
spec:
  selector:
    matchLabels:
      app: vllm
  targetPorts:
  - number: {port}
  endpointPickerRef:
    name: epp
    port:
      number: 9002
"""


def pod_doc(name: str, ip: str, *, ready: str | None = None, app: str = "vllm", namespace: str = "") -> str:
    conditions = f"\n  conditions:\n  - type: Ready\n    status: {ready!r}" if ready is not None else ""
    ns = f"\n  namespace: {namespace}" if namespace else ""
    return (
        f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}{ns}\n  labels:\n    app: {app}\n"
        f"status:\n  podIP: {ip}{conditions}\n"
    )


def model_doc(name: str, model_name: str, target: str, *, pool: str = "vllm-pool", created: str = "") -> str:
    stamp = f"\n  creationTimestamp: {created!r}" if created else ""
    return (
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModel\n"
        f"metadata:\n  name: {name}{stamp}\n"
        f"spec:\n  modelName: {model_name}\n  poolRef:\n    name: {pool}\n"
        f"  targetModels:\n  - name: {target}\n"
    )


OBJECTIVE = """\
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata:
  name: batch
spec:
  priority: -1
  poolRef:
    name: vllm-pool
"""


def pool_file(*docs: str, port: int = 8000) -> str:
    return "---\n".join([POOL.format(port=port), *docs])


GOOD = pool_file(
    pod_doc("vllm-0", "10.0.0.1"),
    pod_doc("vllm-1", "10.0.0.2", ready="True"),
    pod_doc("vllm-2", "10.0.0.3", ready="False"),
    model_doc("legal", "legal-assistant", "legal-lora"),
    OBJECTIVE,
)


def write_atomically(path: pathlib.Path, text: str) -> None:
    """As editors and config tools do: a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_in_place(path: pathlib.Path, text: str) -> None:
    path.write_text(text)


def remove(path: pathlib.Path) -> None:
    path.unlink()


def addresses(store: Datastore) -> list[str]:
    return sorted(state.address for state in store.snapshot().endpoints)


def source_for(path: pathlib.Path, store: Datastore, clock: FakeClock, **kw: str) -> FileSource:
    return FileSource(
        path,
        store,
        pool_name=kw.get("pool_name", "vllm-pool"),
        pool_namespace=kw.get("pool_namespace", ""),
        clock=clock,
        poll_interval_s=0.5,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> Datastore:
    return Datastore(clock)


@pytest.fixture
def path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "pool.yaml"


# -- load ------------------------------------------------------------------------------------


def test_load_applies_pool_pods_models_and_objectives(
    path: pathlib.Path, store: Datastore, clock: FakeClock
) -> None:
    path.write_text(GOOD)
    source_for(path, store, clock).load()
    snapshot = store.snapshot()
    assert snapshot.pool is not None
    assert (snapshot.pool.name, snapshot.pool.namespace, snapshot.pool.target_ports) == (
        "vllm-pool",
        "default",
        (8000,),
    )
    # vllm-0 has no conditions (Ready in a pool file); vllm-2 is explicitly not Ready.
    assert addresses(store) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert snapshot.models["legal-assistant"].target_models[0].name == "legal-lora"
    assert snapshot.objectives["batch"].priority == -1


@pytest.mark.parametrize(
    ("pool_name", "pool_namespace", "expected"),
    [
        ("", "", "default/vllm-pool"),
        ("vllm-pool", "", "default/vllm-pool"),
        ("vllm-pool", "default", "default/vllm-pool"),
    ],
    ids=["only-pool", "by-name", "by-name-and-namespace"],
)
def test_pool_selection(
    path: pathlib.Path, store: Datastore, clock: FakeClock, pool_name: str, pool_namespace: str, expected: str
) -> None:
    path.write_text(GOOD)
    source_for(path, store, clock, pool_name=pool_name, pool_namespace=pool_namespace).load()
    assert store.pool is not None and f"{store.pool.namespace}/{store.pool.name}" == expected


def test_pool_namespace_is_the_default_for_objects_without_one(
    path: pathlib.Path, store: Datastore, clock: FakeClock
) -> None:
    path.write_text(pool_file(pod_doc("a", "10.0.0.1"), pod_doc("b", "10.0.0.2", namespace="elsewhere")))
    source_for(path, store, clock, pool_namespace="team").load()
    assert store.pool is not None and store.pool.namespace == "team"
    assert addresses(store) == ["10.0.0.1:8000"]  # the pod in another namespace is not in the pool


SECOND_POOL = POOL.format(port=8000).replace("name: vllm-pool", "name: other-pool")

BAD_FILES = [
    (
        pool_file(pod_doc("a", "10.0.0.1"), port=0),
        "vllm-pool",
        ['document 1: InferencePool "vllm-pool": spec.targetPorts[0].number: must be 1-65535, got 0'],
    ),
    (
        pool_file(pod_doc("a", "10.0.0.999")),
        "vllm-pool",
        ['document 2: Pod "a": status.podIP: must be an IP address'],
    ),
    (
        pool_file(pod_doc("a", "10.0.0.1"), pod_doc("a", "10.0.0.2")),
        "vllm-pool",
        ["document 3: Pod default/a is already defined in document 2"],
    ),
    (pool_file("- just\n- a list\n"), "vllm-pool", ["document 2: must be a Kubernetes object"]),
    (
        pool_file("apiVersion: v1\nkind: Service\nmetadata:\n  name: svc\n"),
        "vllm-pool",
        ['document 2: Service "svc": kind: unsupported kind'],
    ),
    (pool_file("kind: [unclosed\n"), "vllm-pool", ["line 17", "invalid YAML"]),
    (pod_doc("a", "10.0.0.1"), "", ["the file holds no InferencePool"]),
    (
        pool_file(SECOND_POOL),
        "",
        ["several InferencePools (default/vllm-pool, default/other-pool)", "--pool-name"],
    ),
    (GOOD, "missing-pool", ["InferencePool missing-pool is not in the file (found: default/vllm-pool)"]),
    (
        POOL.format(port=8000).replace("  targetPorts:", "  targetPort: 1\n  targetPorts:"),
        "vllm-pool",
        ['InferencePool "vllm-pool": spec.targetPort: unknown field'],
    ),
]


@pytest.mark.parametrize(
    ("text", "pool_name", "fragments"),
    BAD_FILES,
    ids=[
        "bad-port",
        "bad-pod-ip",
        "duplicate-pod",
        "not-an-object",
        "unsupported-kind",
        "yaml-syntax",
        "no-pool",
        "two-pools-unnamed",
        "named-pool-missing",
        "unknown-field",
    ],
)
def test_bad_file_is_a_config_error_naming_file_document_object_and_field(
    path: pathlib.Path, store: Datastore, clock: FakeClock, text: str, pool_name: str, fragments: list[str]
) -> None:
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        source_for(path, store, clock, pool_name=pool_name).load()
    message = str(caught.value)
    assert message.startswith(str(path))
    for fragment in fragments:
        assert fragment in message
    assert store.pool is None and store.pods() == ()  # nothing applied


def test_file_is_applied_whole_or_not_at_all(path: pathlib.Path, store: Datastore, clock: FakeClock) -> None:
    # A valid pool and pods, then one bad InferenceModel at the end: nothing of it is applied.
    path.write_text(
        pool_file(
            pod_doc("a", "10.0.0.1"),
            model_doc("m", "m", "t").replace("- name: t", "- name: t\n    weight: 0"),
        )
    )
    with pytest.raises(ConfigError, match=r"document 3: InferenceModel \"m\": spec.targetModels\[0\].weight"):
        source_for(path, store, clock).load()
    assert store.pool is None and store.pods() == () and store.snapshot().models == {}


def test_missing_and_undecodable_files(path: pathlib.Path, store: Datastore, clock: FakeClock) -> None:
    with pytest.raises(ConfigError, match="cannot read pool file"):
        source_for(path, store, clock).load()
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not UTF-8"):
        source_for(path, store, clock).load()


def test_lists_are_read_like_separate_documents(
    path: pathlib.Path, store: Datastore, clock: FakeClock
) -> None:
    indented = "".join("  " + line + "\n" for line in pod_doc("a", "10.0.0.1").splitlines())
    path.write_text(pool_file("apiVersion: v1\nkind: List\nitems:\n-" + indented[1:]))
    source_for(path, store, clock).load()
    assert addresses(store) == ["10.0.0.1:8000"]


def test_models_without_timestamps_are_ordered_by_file_position(
    path: pathlib.Path, store: Datastore, clock: FakeClock
) -> None:
    # Both claim modelName "shared"; "z-first" comes first in the file and wins although
    # it sorts last by name; a model with a timestamp counts as younger than both.
    path.write_text(
        pool_file(
            model_doc("z-first", "shared", "first-adapter"),
            model_doc("a-second", "shared", "second-adapter"),
            model_doc("b-dated", "shared", "dated-adapter", created="2020-01-01T00:00:00Z"),
        )
    )
    source_for(path, store, clock).load()
    assert store.snapshot().models["shared"].name == "z-first"


def test_explicit_timestamps_decide_conflicts(path: pathlib.Path, store: Datastore, clock: FakeClock) -> None:
    path.write_text(
        pool_file(
            model_doc("first-in-file", "shared", "a", created="2026-02-01T00:00:00Z"),
            model_doc("older", "shared", "b", created="2026-01-01T00:00:00Z"),
        )
    )
    source_for(path, store, clock).load()
    assert store.snapshot().models["shared"].name == "older"


def test_objects_for_another_pool_are_reported(
    path: pathlib.Path, store: Datastore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    path.write_text(pool_file(model_doc("typo", "m", "t", pool="vllm-pol")))
    with caplog.at_level(logging.WARNING, logger="epp.picker.sources.file"):
        source_for(path, store, clock).load()
    assert store.snapshot().models == {}
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.__dict__["pool_ref"] == "default/vllm-pol"


def test_poll_interval_must_be_positive(path: pathlib.Path, store: Datastore, clock: FakeClock) -> None:
    with pytest.raises(ConfigError, match="poll interval"):
        FileSource(path, store, pool_name="", pool_namespace="", clock=clock, poll_interval_s=0)


# -- reload while running --------------------------------------------------------------------


@pytest.fixture
async def running(path: pathlib.Path, store: Datastore, clock: FakeClock) -> AsyncIterator[FileSource]:
    write_in_place(path, GOOD)
    source = source_for(path, store, clock)
    source.load()
    task = asyncio.create_task(source.run())
    try:
        yield source
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def settle(condition: Callable[[], bool], *, ticks: int = 200) -> None:
    """Let the source poll (each FakeClock sleep is one loop tick) until `condition` holds."""
    for _ in range(ticks):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def idle(ticks: int = 50) -> None:
    for _ in range(ticks):
        await asyncio.sleep(0)


def file_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "epp.picker.sources.file" and r.levelno >= logging.ERROR]


async def test_polling_follows_the_injected_clock(running: FileSource, clock: FakeClock) -> None:
    start = clock.now()
    await idle(10)
    elapsed = clock.now() - start
    assert elapsed >= 0.5 and elapsed % 0.5 == 0


async def test_changed_pod_ip_changes_endpoints_and_keeps_the_others_metrics(
    running: FileSource, path: pathlib.Path, store: Datastore, clock: FakeClock
) -> None:
    store.update_metrics("vllm-1-rank-0", Metrics(updated_at=clock.now(), waiting_requests=3))
    write_atomically(path, GOOD.replace("10.0.0.1", "10.0.0.9"))
    await settle(lambda: addresses(store) == ["10.0.0.2:8000", "10.0.0.9:8000"])
    kept = store.snapshot().endpoint("vllm-1-rank-0")
    assert kept is not None and kept.metrics is not None and kept.metrics.waiting_requests == 3


async def test_bad_file_keeps_state_logs_once_and_a_fix_is_applied(
    running: FileSource, path: pathlib.Path, store: Datastore, caplog: pytest.LogCaptureFixture
) -> None:
    before = store.snapshot()
    with caplog.at_level(logging.INFO, logger="epp.picker.sources.file"):
        write_atomically(path, GOOD.replace("10.0.0.1", "10.0.0.9").replace("number: 8000", "number: 0"))
        await settle(lambda: bool(file_errors(caplog)))
        await idle()
        (error,) = file_errors(caplog)
        assert "spec.targetPorts[0].number" in error.__dict__["error"]
        assert str(path) in error.__dict__["error"]
        assert addresses(store) == ["10.0.0.1:8000", "10.0.0.2:8000"]
        assert store.snapshot().models == before.models

        write_atomically(path, GOOD.replace("10.0.0.1", "10.0.0.9"))
        await settle(lambda: addresses(store) == ["10.0.0.2:8000", "10.0.0.9:8000"])
    assert len(file_errors(caplog)) == 1


async def test_missing_file_keeps_state_and_its_return_is_applied(
    running: FileSource, path: pathlib.Path, store: Datastore, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="epp.picker.sources.file"):
        remove(path)
        await settle(lambda: bool(file_errors(caplog)))
        await idle()
        assert len(file_errors(caplog)) == 1
        assert "cannot read pool file" in file_errors(caplog)[0].__dict__["error"]
        assert addresses(store) == ["10.0.0.1:8000", "10.0.0.2:8000"]
        write_in_place(
            path, GOOD.replace("ready: 'False'", "ready: 'True'").replace("status: 'False'", "status: 'True'")
        )
        await settle(lambda: len(addresses(store)) == 3)


async def test_in_place_edit_is_noticed(running: FileSource, path: pathlib.Path, store: Datastore) -> None:
    write_in_place(path, GOOD.replace("10.0.0.1", "10.0.0.7"))  # same size, same inode
    await settle(lambda: addresses(store) == ["10.0.0.2:8000", "10.0.0.7:8000"])


async def test_unchanged_content_is_not_reapplied(
    running: FileSource, path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="epp.picker.sources.file"):
        write_atomically(path, GOOD)  # new inode and mtime, same content
        await idle()
    assert not [r for r in caplog.records if r.getMessage() == "pool file applied"]


async def test_config_map_symlink_swap_is_followed(
    tmp_path: pathlib.Path, store: Datastore, clock: FakeClock
) -> None:
    # The layout a mounted ConfigMap has: pool.yaml -> ..data/pool.yaml, ..data -> ..<version>.
    mount = tmp_path / "config"
    (mount / "..v1").mkdir(parents=True)
    (mount / "..v1" / "pool.yaml").write_text(GOOD)
    (mount / "..data").symlink_to("..v1")
    (mount / "pool.yaml").symlink_to("..data/pool.yaml")
    source = source_for(mount / "pool.yaml", store, clock)
    source.load()
    task = asyncio.create_task(source.run())
    try:
        (mount / "..v2").mkdir()
        (mount / "..v2" / "pool.yaml").write_text(pool_file(pod_doc("vllm-5", "10.0.0.5"), port=8100))
        (mount / "..data_tmp").symlink_to("..v2")
        os.replace(mount / "..data_tmp", mount / "..data")
        await settle(lambda: addresses(store) == ["10.0.0.5:8100"])
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_the_shipped_example_pool_file_loads(store: Datastore, clock: FakeClock) -> None:
    example = pathlib.Path(__file__).resolve().parents[4] / "examples" / "pool.yaml"
    FileSource(example, store, pool_name="", pool_namespace="", clock=clock).load()
    snapshot = store.snapshot()
    assert snapshot.pool is not None and snapshot.pool.name == "vllm-llama3-8b"
    assert addresses(store) == ["127.0.0.2:8000", "127.0.0.3:8000", "127.0.0.4:8000"]
    assert set(snapshot.models) == {"legal-assistant", "sql-lora"}
    assert snapshot.objectives["batch-jobs"].priority == -1
