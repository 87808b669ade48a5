"""Gateway profiles: each rewrites our ext_proc filter to what that gateway builds, and Envoy accepts it."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from epp.picker.datastore.types import FailureMode
from epp.tools.envoy.bootstrap import EnvoyOptions, HostPort, Upstream, build_bootstrap, render_yaml
from epp.tools.envoy.profiles import GATEWAY_PROCESSING_MODE, PROFILES, Gateway, apply_profile
from tests.support.envoy_validation import validate_config


def ext_proc_config(bootstrap: dict[str, object]) -> dict[str, object]:
    listeners = bootstrap["static_resources"]["listeners"]  # type: ignore[index]
    filters = listeners[0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    [config] = [f["typed_config"] for f in filters if f["name"] == "envoy.filters.http.ext_proc"]
    return config  # type: ignore[no-any-return]


OPTIONS = EnvoyOptions(failure_mode=FailureMode.FAIL_OPEN, pool_endpoints=(HostPort("10.0.0.1", 8000),))


@pytest.mark.parametrize("gateway", list(Gateway), ids=[g.value for g in Gateway])
def test_a_profile_sends_responses_to_the_epp_and_envoy_accepts_it(
    gateway: Gateway, tmp_path: pathlib.Path
) -> None:
    bootstrap = build_bootstrap(OPTIONS)
    apply_profile(bootstrap, PROFILES[gateway])
    config = ext_proc_config(bootstrap)
    assert config["processing_mode"] == GATEWAY_PROCESSING_MODE
    assert config["failure_mode_allow"] is True  # the pool's failure mode stays
    assert "route_cache_action" not in config and "allow_mode_override" not in config
    path = tmp_path / "envoy.yaml"
    path.write_text(render_yaml(bootstrap))
    validate_config(path)


def test_kgateway_times_messages_out_and_forwards_the_subset_hint() -> None:
    bootstrap = build_bootstrap(OPTIONS)
    apply_profile(bootstrap, PROFILES[Gateway.KGATEWAY])
    config = ext_proc_config(bootstrap)
    assert config["message_timeout"] == "5.000s"
    assert config["metadata_options"] == {
        "forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint"]},
        "receiving_namespaces": {"untyped": ["envoy.lb"]},
    }
    assert PROFILES[Gateway.KGATEWAY].routes_by_metadata


def pool_cluster_sources(bootstrap: dict[str, object]) -> list[object]:
    clusters = bootstrap["static_resources"]["clusters"]  # type: ignore[index]
    [sources] = [
        policy["typed_extension_config"]["typed_config"]["override_host_sources"]
        for cluster in clusters
        for policy in cluster.get("load_balancing_policy", {}).get("policies", [])
    ]
    return sources  # type: ignore[no-any-return]


def test_ai_gateway_receives_no_metadata_and_its_pool_cluster_reads_the_destination_header() -> None:
    bootstrap = build_bootstrap(OPTIONS)
    assert pool_cluster_sources(bootstrap) == [
        {"metadata": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}}
    ]
    apply_profile(bootstrap, PROFILES[Gateway.ENVOY_AI_GATEWAY])
    assert "metadata_options" not in ext_proc_config(bootstrap)
    assert pool_cluster_sources(bootstrap) == [{"header": "x-gateway-destination-endpoint"}]


def test_ai_gateway_fails_close_on_a_missing_header_and_logs_requests_by_their_completion_key() -> None:
    bootstrap = build_bootstrap(dataclasses.replace(OPTIONS, failure_mode=FailureMode.FAIL_CLOSE))
    apply_profile(bootstrap, PROFILES[Gateway.ENVOY_AI_GATEWAY])
    listeners = bootstrap["static_resources"]["listeners"]
    manager = listeners[0]["filter_chains"][0]["filters"][0]["typed_config"]
    picked, unpicked = manager["route_config"]["virtual_hosts"][0]["routes"]
    assert picked["match"] == {
        "prefix": "/",
        "headers": [{"name": "x-gateway-destination-endpoint", "present_match": True}],
    }
    assert unpicked["direct_response"]["status"] == 503
    [access_log] = manager["access_log"]
    assert access_log["filter"] == {
        "header_filter": {"header": {"name": "x-lora-epp-completion-key", "present_match": True}}
    }
    assert access_log["typed_config"]["additional_request_headers_to_log"] == ["x-lora-epp-completion-key"]


def test_a_header_routed_profile_needs_the_override_host_upstream() -> None:
    bootstrap = build_bootstrap(dataclasses.replace(OPTIONS, upstream=Upstream.ORIGINAL_DST))
    with pytest.raises(ValueError, match="override-host"):
        apply_profile(bootstrap, PROFILES[Gateway.ENVOY_AI_GATEWAY])
