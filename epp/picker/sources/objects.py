"""Kubernetes objects (plain mappings) → validated datastore values.

Both sources share these functions: the Kubernetes source feeds them what the API server
returns, the file source what a user would `kubectl apply`. Each rule is the one the
CustomResourceDefinition schema (and its CEL rules) enforces, so a pool file is rejected
exactly where a cluster would reject it, and an error names the object and the field.

Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple, TypeAlias

from epp.errors import ConfigError
from epp.picker.datastore.types import (
    Criticality,
    FailureMode,
    InferenceModel,
    InferenceObjective,
    PodInfo,
    Pool,
    TargetModel,
)

# -- API coordinates -------------------------------------------------------------------------


class ApiResource(NamedTuple):
    """Where a kind lives in the API (what CustomObjectsApi calls take)."""

    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


GROUP_V1 = "inference.networking.k8s.io"
GROUP_X = "inference.networking.x-k8s.io"

POOL_V1 = ApiResource(GROUP_V1, "v1", "inferencepools")
POOL_V1ALPHA2 = ApiResource(GROUP_X, "v1alpha2", "inferencepools")
INFERENCE_MODEL = ApiResource(GROUP_X, "v1alpha2", "inferencemodels")
INFERENCE_OBJECTIVE = ApiResource(GROUP_X, "v1alpha2", "inferenceobjectives")
POD = ApiResource("", "v1", "pods")

ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports"
# What the v1alpha2 extensionRef means when portNumber is unset and the kind is Service.
DEFAULT_EXTENSION_PORT = 9002
MAX_TARGET_PORTS = 8
MAX_SELECTOR_LABELS = 64
MAX_TARGET_MODELS = 10
MAX_MODEL_NAME_CHARS = 256
MAX_WEIGHT = 1_000_000

ParsedObject: TypeAlias = Pool | PodInfo | InferenceModel | InferenceObjective


def pool_resource(group: str) -> ApiResource:
    """The InferencePool resource for a `--pool-group` value."""
    if group == GROUP_V1:
        return POOL_V1
    if group == GROUP_X:
        return POOL_V1ALPHA2
    raise ConfigError(f"unknown InferencePool group {group!r}: expected {GROUP_V1!r} or {GROUP_X!r}")


# -- errors ----------------------------------------------------------------------------------


class ObjectError(ConfigError):
    """An object the API server would reject (or that cannot be used), naming kind, name and field."""

    def __init__(self, kind: str, name: str, field: str, problem: str) -> None:
        self.kind = kind
        self.name = name
        self.field = field
        self.problem = problem
        shown_name = json.dumps(name) if name else "(unnamed)"
        super().__init__(f"{kind or 'object'} {shown_name}: {field}: {problem}")


# -- validation rules (the CRDs' and Kubernetes' own) ------------------------------------------

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GROUP = re.compile(r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_KIND = re.compile(r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

_FAILURE_MODES = {mode.value: mode for mode in FailureMode}
_CRITICALITIES = {c.value: c for c in Criticality}
_APP_PROTOCOLS = ("http", "kubernetes.io/h2c")


def _show(value: object) -> str:
    """A value as the user wrote it in YAML/JSON, cut short."""
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _key_path(parent: str, key: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{json.dumps(key)}]"


class _Fields:
    """Reads fields of one object, raising an `ObjectError` that names it."""

    def __init__(self, obj: Mapping[str, Any], kind: str, *, strict: bool) -> None:
        self.kind = kind
        self.name = _name_of(obj)
        self.strict = strict

    def error(self, field: str, problem: str) -> ObjectError:
        return ObjectError(self.kind, self.name, field, problem)

    def mapping(self, parent: Mapping[str, Any], key: str, path: str, *, required: bool) -> Mapping[str, Any]:
        field = _key_path(path, key)
        value = parent.get(key)
        if value is None:
            if required:
                raise self.error(field, "is required")
            return MappingProxyType({})
        if not isinstance(value, Mapping):
            raise self.error(field, f"must be an object, got {_show(value)}")
        return value

    def known(self, value: Mapping[str, Any], path: str, allowed: Sequence[str]) -> None:
        """In strict mode (files), an unknown field is a typo: say so instead of ignoring it."""
        if not self.strict:
            return
        for key in value:
            if key not in allowed:
                raise self.error(
                    _key_path(path, str(key)), f"unknown field (expected one of {', '.join(allowed)})"
                )

    def string(
        self,
        parent: Mapping[str, Any],
        key: str,
        path: str,
        *,
        required: bool = False,
        default: str = "",
        min_chars: int = 0,
        max_chars: int | None = None,
        pattern: re.Pattern[str] | None = None,
        rule: str = "",
    ) -> str:
        field = _key_path(path, key)
        value = parent.get(key)
        if value is None:
            if required:
                raise self.error(field, "is required")
            return default
        if not isinstance(value, str):
            raise self.error(field, f"must be a string, got {_show(value)}")
        self.check_string(value, field, min_chars=min_chars, max_chars=max_chars, pattern=pattern, rule=rule)
        return value

    def check_string(
        self,
        value: str,
        field: str,
        *,
        min_chars: int = 0,
        max_chars: int | None = None,
        pattern: re.Pattern[str] | None = None,
        rule: str = "",
    ) -> None:
        if len(value) < min_chars:
            raise self.error(
                field, "must not be empty" if min_chars == 1 else f"must be at least {min_chars} characters"
            )
        if max_chars is not None and len(value) > max_chars:
            raise self.error(field, f"must be at most {max_chars} characters, got {len(value)}")
        # fullmatch: `$` alone would let a trailing newline through.
        if pattern is not None and not pattern.fullmatch(value):
            raise self.error(field, f"must be {rule or 'match ' + pattern.pattern}, got {_show(value)}")

    def integer(
        self,
        parent: Mapping[str, Any],
        key: str,
        path: str,
        *,
        low: int | None = None,
        high: int | None = None,
    ) -> int | None:
        """An optional integer: None when unset."""
        value = parent.get(key)
        if value is None:
            return None
        return self.check_integer(value, _key_path(path, key), low=low, high=high)

    def required_integer(
        self,
        parent: Mapping[str, Any],
        key: str,
        path: str,
        *,
        low: int | None = None,
        high: int | None = None,
    ) -> int:
        field = _key_path(path, key)
        value = parent.get(key)
        if value is None:
            raise self.error(field, "is required")
        return self.check_integer(value, field, low=low, high=high)

    def check_integer(self, value: object, field: str, *, low: int | None, high: int | None) -> int:
        # bool is an int in Python, not in YAML: `true` is no port number.
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(field, f"must be an integer, got {_show(value)}")
        if low is not None and high is not None and not low <= value <= high:
            raise self.error(field, f"must be {low}-{high}, got {value}")
        if low is not None and value < low:
            raise self.error(field, f"must be at least {low}, got {value}")
        if high is not None and value > high:
            raise self.error(field, f"must be at most {high}, got {value}")
        return value

    def enum(
        self,
        parent: Mapping[str, Any],
        key: str,
        path: str,
        allowed: Sequence[str],
        *,
        default: str = "",
        required: bool = False,
    ) -> str:
        value = self.string(parent, key, path, default=default, required=required)
        if value not in allowed:
            raise self.error(_key_path(path, key), f"must be one of {', '.join(allowed)}, got {_show(value)}")
        return value

    def sequence(
        self, parent: Mapping[str, Any], key: str, path: str, *, required: bool = False
    ) -> Sequence[Any]:
        field = _key_path(path, key)
        value = parent.get(key)
        if value is None:
            if required:
                raise self.error(field, "is required")
            return ()
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise self.error(field, f"must be a list, got {_show(value)}")
        return value

    def labels(self, value: Mapping[str, Any], path: str) -> dict[str, str]:
        """A label map: keys and values as Kubernetes label rules (and the CRDs) allow."""
        labels: dict[str, str] = {}
        for key, label_value in value.items():
            if not isinstance(key, str):
                raise self.error(path, f"label keys must be strings, got {_show(key)}")
            field = _key_path(path, key)
            self.check_string(
                key, field, min_chars=1, max_chars=253, pattern=_LABEL_KEY, rule="a valid label key"
            )
            if not isinstance(label_value, str):
                raise self.error(field, f"must be a string, got {_show(label_value)}")
            self.check_string(
                label_value, field, max_chars=63, pattern=_LABEL_VALUE, rule="a valid label value"
            )
            labels[key] = label_value
        return labels


def _kind_of(obj: Mapping[str, Any]) -> str:
    kind = obj.get("kind")
    return kind if isinstance(kind, str) else ""


def _name_of(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping):
        name = metadata.get("name")
        if isinstance(name, str):
            return name
    return ""


class _Metadata(NamedTuple):
    name: str
    namespace: str
    resource_version: str
    uid: str
    creation_timestamp: float
    labels: dict[str, str]
    annotations: Mapping[str, Any]
    deleting: bool


def _versioned_metadata(
    f: _Fields, obj: Mapping[str, Any], resource: ApiResource, default_namespace: str
) -> _Metadata:
    """The metadata of an object of a kind served at one apiVersion, after checking that version."""
    if obj.get("apiVersion") != resource.api_version:
        raise f.error("apiVersion", f"must be {resource.api_version}, got {_show(obj.get('apiVersion'))}")
    f.known(obj, "", _OBJECT_FIELDS)
    return _metadata(f, obj, default_namespace)


def _metadata(f: _Fields, obj: Mapping[str, Any], default_namespace: str) -> _Metadata:
    metadata = f.mapping(obj, "metadata", "", required=True)
    name = f.string(
        metadata,
        "name",
        "metadata",
        required=True,
        min_chars=1,
        max_chars=253,
        pattern=_DNS_SUBDOMAIN,
        rule="a lowercase DNS subdomain",
    )
    namespace = f.string(
        metadata,
        "namespace",
        "metadata",
        default=default_namespace,
        min_chars=1,
        max_chars=63,
        pattern=_DNS_LABEL,
        rule="a lowercase DNS label",
    )
    labels = f.labels(f.mapping(metadata, "labels", "metadata", required=False), "metadata.labels")
    annotations = f.mapping(metadata, "annotations", "metadata", required=False)
    return _Metadata(
        name=name,
        namespace=namespace,
        resource_version=_opaque_string(metadata.get("resourceVersion")),
        uid=_opaque_string(metadata.get("uid")),
        creation_timestamp=_timestamp(f, metadata.get("creationTimestamp"), "metadata.creationTimestamp"),
        labels=labels,
        annotations=annotations,
        deleting=metadata.get("deletionTimestamp") is not None,
    )


def _opaque_string(value: object) -> str:
    return "" if value is None else str(value)


def _timestamp(f: _Fields, value: object, field: str) -> float:
    """RFC 3339 (as the API returns it) or a datetime (as YAML loads it) → Unix seconds; absent → 0."""
    if value is None:
        return 0.0
    if isinstance(value, datetime.datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.datetime.fromisoformat(value)
        except ValueError:
            raise f.error(field, f"must be an RFC 3339 time, got {_show(value)}") from None
    else:
        raise f.error(field, f"must be an RFC 3339 time, got {_show(value)}")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


_OBJECT_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")


# -- InferencePool ---------------------------------------------------------------------------


def parse_pool(obj: Mapping[str, Any], *, default_namespace: str = "default", strict: bool = False) -> Pool:
    """An InferencePool of either API version, normalised to a `Pool`.

    `strict` (pool files) also rejects fields the schema does not know, which the API
    server would prune; objects read from the API never carry them.
    """
    api_version = obj.get("apiVersion")
    f = _Fields(obj, "InferencePool", strict=strict)
    if api_version == POOL_V1.api_version:
        return _parse_pool_v1(f, obj, default_namespace)
    if api_version == POOL_V1ALPHA2.api_version:
        return _parse_pool_v1alpha2(f, obj, default_namespace)
    raise f.error(
        "apiVersion",
        f"must be {POOL_V1.api_version} or {POOL_V1ALPHA2.api_version}, got {_show(api_version)}",
    )


def _failure_mode(f: _Fields, ref: Mapping[str, Any], path: str) -> FailureMode:
    value = f.enum(ref, "failureMode", path, tuple(_FAILURE_MODES), default=FailureMode.FAIL_CLOSE.value)
    return _FAILURE_MODES[value]


def _ref_group_kind(
    f: _Fields, ref: Mapping[str, Any], path: str, *, default_group: str, default_kind: str
) -> tuple[str, str]:
    group = f.string(
        ref,
        "group",
        path,
        default=default_group,
        max_chars=253,
        pattern=_GROUP,
        rule="a DNS subdomain or empty",
    )
    kind = f.string(
        ref, "kind", path, default=default_kind, min_chars=1, max_chars=63, pattern=_KIND, rule="a valid kind"
    )
    return group, kind


def _object_name(f: _Fields, ref: Mapping[str, Any], path: str) -> str:
    return f.string(ref, "name", path, required=True, min_chars=1, max_chars=253)


def _parse_pool_v1(f: _Fields, obj: Mapping[str, Any], default_namespace: str) -> Pool:
    f.known(obj, "", _OBJECT_FIELDS)
    meta = _metadata(f, obj, default_namespace)
    spec = f.mapping(obj, "spec", "", required=True)
    f.known(spec, "spec", ("selector", "targetPorts", "appProtocol", "endpointPickerRef"))

    selector = f.mapping(spec, "selector", "spec", required=True)
    f.known(selector, "spec.selector", ("matchLabels",))
    match_labels_raw = f.mapping(selector, "matchLabels", "spec.selector", required=True)
    if not 1 <= len(match_labels_raw) <= MAX_SELECTOR_LABELS:
        raise f.error(
            "spec.selector.matchLabels",
            f"must have 1-{MAX_SELECTOR_LABELS} labels, got {len(match_labels_raw)}",
        )
    match_labels = f.labels(match_labels_raw, "spec.selector.matchLabels")

    ports_raw = f.sequence(spec, "targetPorts", "spec", required=True)
    if not 1 <= len(ports_raw) <= MAX_TARGET_PORTS:
        raise f.error("spec.targetPorts", f"must have 1-{MAX_TARGET_PORTS} ports, got {len(ports_raw)}")
    ports: list[int] = []
    for index, port_raw in enumerate(ports_raw):
        path = f"spec.targetPorts[{index}]"
        if not isinstance(port_raw, Mapping):
            raise f.error(path, f"must be an object with a number, got {_show(port_raw)}")
        f.known(port_raw, path, ("number",))
        number = f.required_integer(port_raw, "number", path, low=1, high=65535)
        if number in ports:
            raise f.error(
                f"{path}.number", f"port {number} is listed twice; target port numbers must be unique"
            )
        ports.append(number)

    app_protocol = f.enum(spec, "appProtocol", "spec", _APP_PROTOCOLS, default="http")

    failure_mode = FailureMode.FAIL_CLOSE
    picker_name = ""
    picker_port: int | None = None
    # Required up to GIE v1.5.0, optional from v1.6.0: the EPP never needs it to route.
    if spec.get("endpointPickerRef") is not None:
        path = "spec.endpointPickerRef"
        ref = f.mapping(spec, "endpointPickerRef", "spec", required=True)
        f.known(ref, path, ("group", "kind", "name", "port", "failureMode"))
        _, kind = _ref_group_kind(f, ref, path, default_group="", default_kind="Service")
        picker_name = _object_name(f, ref, path)
        if ref.get("port") is not None:
            port = f.mapping(ref, "port", path, required=True)
            f.known(port, f"{path}.port", ("number",))
            picker_port = f.required_integer(port, "number", f"{path}.port", low=1, high=65535)
        elif kind == "Service":
            raise f.error(f"{path}.port", "is required when kind is Service")
        failure_mode = _failure_mode(f, ref, path)

    return Pool(
        name=meta.name,
        namespace=meta.namespace,
        selector=MappingProxyType(match_labels),
        target_ports=tuple(ports),
        failure_mode=failure_mode,
        group=POOL_V1.group,
        endpoint_picker_name=picker_name,
        endpoint_picker_port=picker_port,
        resource_version=meta.resource_version,
        app_protocol=app_protocol,
    )


def _parse_pool_v1alpha2(f: _Fields, obj: Mapping[str, Any], default_namespace: str) -> Pool:
    f.known(obj, "", _OBJECT_FIELDS)
    meta = _metadata(f, obj, default_namespace)
    spec = f.mapping(obj, "spec", "", required=True)
    f.known(spec, "spec", ("selector", "targetPortNumber", "extensionRef"))
    selector = f.labels(f.mapping(spec, "selector", "spec", required=True), "spec.selector")
    port = f.required_integer(spec, "targetPortNumber", "spec", low=1, high=65535)

    path = "spec.extensionRef"
    ref = f.mapping(spec, "extensionRef", "spec", required=True)
    f.known(ref, path, ("group", "kind", "name", "portNumber", "failureMode"))
    _, kind = _ref_group_kind(f, ref, path, default_group="", default_kind="Service")
    picker_name = _object_name(f, ref, path)
    picker_port = f.integer(ref, "portNumber", path, low=1, high=65535)
    if picker_port is None and kind == "Service":
        picker_port = DEFAULT_EXTENSION_PORT
    failure_mode = _failure_mode(f, ref, path)

    return Pool(
        name=meta.name,
        namespace=meta.namespace,
        selector=MappingProxyType(selector),
        target_ports=(port,),
        failure_mode=failure_mode,
        group=POOL_V1ALPHA2.group,
        endpoint_picker_name=picker_name,
        endpoint_picker_port=picker_port,
        resource_version=meta.resource_version,
    )


# -- Pod -------------------------------------------------------------------------------------


def parse_pod(
    obj: Mapping[str, Any],
    *,
    default_namespace: str = "default",
    ready_without_conditions: bool = False,
    strict: bool = False,
) -> PodInfo:
    """A `v1` Pod: name, labels, IP, readiness, deletion and active ports.

    Ready means condition `Ready` is `"True"`. A pod with no `status.conditions` at all is
    not Ready, as the API server never reports one that way; pool files pass
    `ready_without_conditions=True` so a hand-written pod needs only its `podIP`.
    """
    f = _Fields(obj, "Pod", strict=strict)
    meta = _versioned_metadata(f, obj, POD, default_namespace)
    status = f.mapping(obj, "status", "", required=False)

    ip = f.string(status, "podIP", "status")
    if ip:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise f.error("status.podIP", f"must be an IP address, got {_show(ip)}") from None

    ready = _pod_ready(f, status, ready_without_conditions=ready_without_conditions)
    return PodInfo(
        name=meta.name,
        namespace=meta.namespace,
        ip=ip,
        labels=MappingProxyType(meta.labels),
        ready=ready,
        deleting=meta.deleting,
        active_ports=_active_ports(f, meta.annotations),
        resource_version=meta.resource_version,
    )


def _pod_ready(f: _Fields, status: Mapping[str, Any], *, ready_without_conditions: bool) -> bool:
    if status.get("conditions") is None:
        return ready_without_conditions and bool(status.get("podIP"))
    for index, condition in enumerate(f.sequence(status, "conditions", "status")):
        path = f"status.conditions[{index}]"
        if not isinstance(condition, Mapping):
            raise f.error(path, f"must be an object, got {_show(condition)}")
        if f.string(condition, "type", path, required=True) != "Ready":
            continue
        value = f.enum(condition, "status", path, ("True", "False", "Unknown"), required=True)
        return value == "True"
    return False


def _active_ports(f: _Fields, annotations: Mapping[str, Any]) -> frozenset[int] | None:
    """The `active-ports` annotation: a comma list of port numbers; blank or absent → all ports."""
    raw = annotations.get(ACTIVE_PORTS_ANNOTATION)
    field = _key_path("metadata.annotations", ACTIVE_PORTS_ANNOTATION)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise f.error(field, f"must be a string, got {_show(raw)}")
    if not raw.strip():
        return None
    ports: set[int] = set()
    for item in raw.split(","):
        text = item.strip()
        if not text.isdigit() or not 1 <= int(text) <= 65535:
            raise f.error(field, f"must be a comma list of port numbers 1-65535, got {_show(raw)}")
        ports.add(int(text))
    return frozenset(ports)


# -- InferenceModel and InferenceObjective ----------------------------------------------------


def _pool_ref(f: _Fields, spec: Mapping[str, Any], *, default_group: str) -> tuple[str, str]:
    """(name, group) of spec.poolRef, which must name an InferencePool."""
    path = "spec.poolRef"
    ref = f.mapping(spec, "poolRef", "spec", required=True)
    f.known(ref, path, ("group", "kind", "name"))
    group, kind = _ref_group_kind(f, ref, path, default_group=default_group, default_kind="InferencePool")
    if kind != "InferencePool":
        raise f.error(f"{path}.kind", f"must be InferencePool, got {_show(kind)}")
    return _object_name(f, ref, path), group


def parse_inference_model(
    obj: Mapping[str, Any], *, default_namespace: str = "default", strict: bool = False
) -> InferenceModel:
    """An InferenceModel (x-k8s v1alpha2); creationTimestamp absent → 0 (the source may order instead)."""
    f = _Fields(obj, "InferenceModel", strict=strict)
    meta = _versioned_metadata(f, obj, INFERENCE_MODEL, default_namespace)
    spec = f.mapping(obj, "spec", "", required=True)
    f.known(spec, "spec", ("modelName", "criticality", "targetModels", "poolRef"))
    model_name = f.string(
        spec, "modelName", "spec", required=True, min_chars=1, max_chars=MAX_MODEL_NAME_CHARS
    )
    criticality_raw = spec.get("criticality")
    criticality = None
    if criticality_raw is not None:
        criticality = _CRITICALITIES[f.enum(spec, "criticality", "spec", tuple(_CRITICALITIES))]

    targets_raw = f.sequence(spec, "targetModels", "spec")
    if len(targets_raw) > MAX_TARGET_MODELS:
        raise f.error(
            "spec.targetModels", f"must have at most {MAX_TARGET_MODELS} items, got {len(targets_raw)}"
        )
    targets: list[TargetModel] = []
    for index, target_raw in enumerate(targets_raw):
        path = f"spec.targetModels[{index}]"
        if not isinstance(target_raw, Mapping):
            raise f.error(path, f"must be an object with a name, got {_show(target_raw)}")
        f.known(target_raw, path, ("name", "weight"))
        name = f.string(target_raw, "name", path, required=True, min_chars=1, max_chars=253)
        weight = f.integer(target_raw, "weight", path, low=1, high=MAX_WEIGHT)
        targets.append(TargetModel(name=name, weight=weight))
    weighted = [t.weight is not None for t in targets]
    if any(weighted) and not all(weighted):
        missing = weighted.index(False)
        raise f.error(
            f"spec.targetModels[{missing}].weight", "weights must be set on all targetModels or on none"
        )

    pool_name, pool_group = _pool_ref(f, spec, default_group=GROUP_X)
    return InferenceModel(
        name=meta.name,
        namespace=meta.namespace,
        model_name=model_name,
        pool_name=pool_name,
        criticality=criticality,
        target_models=tuple(targets),
        creation_timestamp=meta.creation_timestamp,
        uid=meta.uid,
        resource_version=meta.resource_version,
        pool_group=pool_group,
    )


def parse_inference_objective(
    obj: Mapping[str, Any], *, default_namespace: str = "default", strict: bool = False
) -> InferenceObjective:
    """An InferenceObjective (x-k8s v1alpha2); unset priority → 0, negatives allowed (sheddable)."""
    f = _Fields(obj, "InferenceObjective", strict=strict)
    meta = _versioned_metadata(f, obj, INFERENCE_OBJECTIVE, default_namespace)
    spec = f.mapping(obj, "spec", "", required=True)
    f.known(spec, "spec", ("priority", "poolRef"))
    priority = f.integer(spec, "priority", "spec")
    pool_name, pool_group = _pool_ref(f, spec, default_group=GROUP_V1)
    return InferenceObjective(
        name=meta.name,
        namespace=meta.namespace,
        pool_name=pool_name,
        priority=0 if priority is None else priority,
        creation_timestamp=meta.creation_timestamp,
        uid=meta.uid,
        resource_version=meta.resource_version,
        pool_group=pool_group,
    )


# -- dispatch --------------------------------------------------------------------------------

_POOL_API_VERSIONS = (POOL_V1.api_version, POOL_V1ALPHA2.api_version)
_KINDS = {
    "InferencePool": _POOL_API_VERSIONS,
    "Pod": (POD.api_version,),
    "InferenceModel": (INFERENCE_MODEL.api_version,),
    "InferenceObjective": (INFERENCE_OBJECTIVE.api_version,),
}


def parse_object(
    obj: Mapping[str, Any],
    *,
    default_namespace: str,
    strict: bool = False,
    ready_without_conditions: bool = False,
) -> ParsedObject:
    """One object, by apiVersion and kind; anything else is an `ObjectError` naming it.

    A `List` holds many objects: use `parse_objects` for those.
    """
    if not isinstance(obj, Mapping):
        raise ObjectError("", "", "(document)", f"must be an object, got {_show(obj)}")
    kind = _kind_of(obj)
    api_version = obj.get("apiVersion")
    if not kind:
        raise ObjectError("", _name_of(obj), "kind", "is required")
    if kind not in _KINDS:
        if kind == "List" or kind.endswith("List"):
            raise ObjectError(kind, _name_of(obj), "kind", "is a list of objects; read it with parse_objects")
        raise ObjectError(
            kind,
            _name_of(obj),
            "kind",
            f"unsupported kind {_show(kind)} (expected one of {', '.join(_KINDS)})",
        )
    if api_version not in _KINDS[kind]:
        raise ObjectError(
            kind,
            _name_of(obj),
            "apiVersion",
            f"must be {' or '.join(_KINDS[kind])} for kind {kind}, got {_show(api_version)}",
        )
    if kind == "InferencePool":
        return parse_pool(obj, default_namespace=default_namespace, strict=strict)
    if kind == "Pod":
        return parse_pod(
            obj,
            default_namespace=default_namespace,
            ready_without_conditions=ready_without_conditions,
            strict=strict,
        )
    if kind == "InferenceModel":
        return parse_inference_model(obj, default_namespace=default_namespace, strict=strict)
    return parse_inference_objective(obj, default_namespace=default_namespace, strict=strict)


def iter_list_items(obj: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The objects in `obj`: itself, or the items of a `List` / `<Kind>List` (flattened).

    Items of a typed list (`PodList`, `InferencePoolList`) may omit apiVersion and kind, as
    list responses from the API do; they are filled in from the list.
    """
    kind = _kind_of(obj)
    if not (kind == "List" or (kind.endswith("List") and "items" in obj)):
        yield obj
        return
    items = obj.get("items")
    if items is None:
        return
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        raise ObjectError(kind, _name_of(obj), "items", f"must be a list, got {_show(items)}")
    item_kind = "" if kind == "List" else kind.removesuffix("List")
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ObjectError(kind, _name_of(obj), f"items[{index}]", f"must be an object, got {_show(item)}")
        if item_kind and ("kind" not in item or "apiVersion" not in item):
            item = {"apiVersion": obj.get("apiVersion"), "kind": item_kind, **item}
        yield from iter_list_items(item)


def parse_objects(
    obj: Mapping[str, Any],
    *,
    default_namespace: str,
    strict: bool = False,
    ready_without_conditions: bool = False,
) -> list[ParsedObject]:
    """`parse_object` over one object or every item of a `List`."""
    return [
        parse_object(
            item,
            default_namespace=default_namespace,
            strict=strict,
            ready_without_conditions=ready_without_conditions,
        )
        for item in iter_list_items(obj)
    ]
