"""Tools around the picker: the vLLM simulator, the policy benchmark, the demo, the local stack
and the Envoy bootstrap builder. None of it is on a request's path in production."""
