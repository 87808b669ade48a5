"""inference-perf against the gateway: its install script, an example config and a loopback run."""
