"""Where the flags become settings: the environment's share, then every cross-field rule, once.

A rule that fails is a `ConfigError` naming the flags at fault; what passes here is not checked again
by the composition root (it checks only what reading files or resolving names can find).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Callable, Mapping

from epp.errors import ConfigError
from epp.picker.observability import decisions
from epp.serve.settings.parser import settings_from_flags
from epp.serve.settings.tree import ServeSettings


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServeSettings:
    """Validate and combine the parsed flags; ConfigError names the flag at fault."""
    settings = with_environment(settings_from_flags(args), os.environ if environ is None else environ)
    for rule in RULES:
        rule(settings)
    return settings


def with_environment(settings: ServeSettings, environ: Mapping[str, str]) -> ServeSettings:
    """The namespace from env NAMESPACE when no flag names one; tracing on when an OTLP endpoint is set."""
    pool = settings.pool
    if not pool.namespace:
        pool = dataclasses.replace(pool, namespace=environ.get("NAMESPACE", "") or "default")
    observability = settings.observability
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip():
        observability = dataclasses.replace(observability, tracing=True)
    return dataclasses.replace(settings, pool=pool, observability=observability)


def _pool_is_named(settings: ServeSettings) -> None:
    if settings.pool.file is None and not settings.pool.name:
        raise ConfigError("--pool-name is required unless --pool-file is given")


def _cert_needs_tls(settings: ServeSettings) -> None:
    if settings.listen.cert_path is not None and not settings.listen.secure_serving:
        raise ConfigError("--cert-path needs --secure-serving=true")


def _decision_log_is_bounded(settings: ServeSettings) -> None:
    if settings.observability.decision_log_size > decisions.MAX_CAPACITY:
        raise ConfigError(f"--decision-log-size must be at most {decisions.MAX_CAPACITY}")


def _one_scheduling_source(settings: ServeSettings) -> None:
    if settings.scheduling.picker_config_text is not None and settings.scheduling.policy is not None:
        raise ConfigError("--policy cannot be combined with --config-file/--config-text")


_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_SELECTOR_TERM = re.compile(rf"!?{_LABEL}|{_LABEL}\s*(=|==|!=)\s*([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def _peers_are_active_active(settings: ServeSettings) -> None:
    peers = settings.peers
    if not peers.enabled:
        return
    if peers.addresses and peers.selector:
        raise ConfigError(
            "--peers (by DNS) and --peer-selector (through the Kubernetes API) both name the peers: "
            "choose one"
        )
    if peers.addresses:
        from epp.picker.peers import parse_peers

        parse_peers(peers.addresses)  # a malformed entry fails at start, not at the first send
    else:
        bad = [term for term in peers.selector.split(",") if not _SELECTOR_TERM.fullmatch(term.strip())]
        if bad:
            raise ConfigError(f"--peer-selector: expected KEY=VALUE[,...] label terms, got {bad[0]!r}")
        if settings.pool.file is not None:
            raise ConfigError(
                "--peer-selector finds the replicas through the Kubernetes API, which --pool-file "
                "does not use: name them with --peers NAME:PORT instead"
            )
    if settings.leader.enabled:
        raise ConfigError(
            f"{peers.flag} runs replicas active-active, --ha-enable-leader-election active-passive: "
            "choose one"
        )


def _peer_tls(settings: ServeSettings) -> None:
    """All three peer TLS files or none; with `--peers`, files or an explicit `--peer-insecure`."""
    peers = settings.peers
    files = {
        "--peer-tls-ca": peers.tls_ca,
        "--peer-tls-cert": peers.tls_cert,
        "--peer-tls-key": peers.tls_key,
    }
    given = [flag for flag, path in files.items() if path is not None]
    if not given:
        if peers.enabled and not peers.insecure:
            raise ConfigError(
                f"{peers.flag} needs --peer-tls-ca, --peer-tls-cert and --peer-tls-key (mutual TLS between "
                "replicas), or --peer-insecure to run the peer exchange in plaintext"
            )
        return
    if len(given) < len(files):
        missing = [flag for flag in files if flag not in given]
        raise ConfigError(f"{', '.join(given)} needs {' and '.join(missing)} too")
    if peers.insecure:
        raise ConfigError("--peer-insecure and --peer-tls-* contradict each other: choose one")
    if not peers.enabled:
        raise ConfigError(f"{', '.join(given)} only apply with --peers or --peer-selector")
    if not settings.pool.name:
        raise ConfigError("--peer-tls-* need --pool-name: the peer certificates name the pool")


# In the order they are checked: the first that fails is the one reported.
RULES: tuple[Callable[[ServeSettings], None], ...] = (
    _pool_is_named,
    _cert_needs_tls,
    _decision_log_is_bounded,
    _one_scheduling_source,
    _peers_are_active_active,
    _peer_tls,
)
