"""End-to-end checks of lora-epp behind a gateway: one set of checks, two stacks.

`checks` holds the checks, each a function of a `Stack` (`stack.py`). `cluster.py` builds the
stack from a real Kubernetes cluster (kubeconfig, set up by `kind/up.sh`), `local.py` from
`epp.tools.localstack` (real Envoy, EPP and simulators on loopback). `pytest e2e` runs the checks
against the cluster; `tests/integration/test_e2e_local.py` runs them against the local stack.
"""
