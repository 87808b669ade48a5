"""`epp bench --config-file` sheds by the config's saturation detector, as `epp serve` does.

Without the flowControl gate a request is admitted or shed (429) when it arrives, by the
detector the config names. A config whose detector calls a pool overloaded as soon as any pod
queues a request or holds any KV sheds Standard requests where the same config with upstream's
default thresholds sheds none.
"""

from __future__ import annotations

import dataclasses

from epp.tools.bench import policies, runner, scenario, workload
from epp.tools.bench.events import simulate

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: saturation-detector{parameters}
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: queue-scorer, weight: 1}}
"""
DEFAULT_THRESHOLDS = ""
NO_HEADROOM = (
    "\n  parameters: {queueDepthThreshold: 0, kvCacheUtilThreshold: 0,"
    " overloadQueueDepthThreshold: 0, overloadKvCacheUtilThreshold: 0}"
)


def refused(parameters: str, name: str) -> tuple[int, int]:
    """Requests, and those shed with 429, in 60 s of the brief scenario under this detector."""
    policy = policies.add_config(CONFIG.format(parameters=parameters), name)
    sc = scenario.load("brief").with_overrides(duration_s=60.0)
    fleet = runner.fleet_for(sc)
    result = simulate(policy, fleet, workload.generate(sc.workload, sc.seed), seed=sc.seed)
    summary = runner.summarize(result, warmup_s=0.0, slo_ttft_s=sc.slo.ttft_s)
    return summary.requests, summary.refused_429


def test_a_bench_run_sheds_by_the_configured_detector() -> None:
    requests, shed = refused(NO_HEADROOM, "no-headroom-detector")
    assert requests > 500
    assert shed > requests // 10, "every busy pod counts as overloaded: Standard requests are shed"
    _, shed_by_defaults = refused(DEFAULT_THRESHOLDS, "default-detector")
    assert shed_by_defaults == 0, "the brief's load never overloads a pool by upstream's thresholds"


def test_shed_standard_off_in_the_config_sheds_no_standard_request() -> None:
    parameters = NO_HEADROOM.replace("}", ", shedStandard: false}")
    requests, shed = refused(parameters, "no-headroom-no-shedding")
    assert requests > 500 and shed == 0


def test_the_config_is_kept_per_policy_name() -> None:
    """Two configs in one run are two policies, each with its own detector."""
    a = policies.add_config(CONFIG.format(parameters=NO_HEADROOM), "detector-a")
    b = policies.add_config(CONFIG.format(parameters=DEFAULT_THRESHOLDS), "detector-b")
    spec_a, spec_b = policies.policy_spec(a, seed=1), policies.policy_spec(b, seed=1)
    assert spec_a != spec_b
    assert dataclasses.replace(spec_a, config_text=spec_b.config_text) == spec_b
