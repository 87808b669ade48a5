"""Faults injected into a `LocalStack`: crashed pods, sidecars and EPPs, pods gone unready,
restarts and rollouts; and the logs to read when a stack fails.

They live beside the tests rather than in `epp.tools.localstack`, which `epp demo` and
`epp bench --live` ship: only the integration tests and the loopback e2e stack break things.
"""

from __future__ import annotations

import contextlib
import subprocess

from epp.tools.localstack import Child, LocalStack, StackError
from testkit.waiting import wait_until


def _kill(child: Child) -> None:
    """SIGKILL, then reap it, so that the port and the pid are free when this returns."""
    if child.alive():
        child.process.kill()
        child.process.wait(timeout=5.0)


def kill_pod(stack: LocalStack, name: str) -> None:
    """SIGKILL pod `name`'s model server (the pool file still lists the pod)."""
    _kill(stack.sim_process(name))


def kill_sidecar(stack: LocalStack, name: str) -> None:
    """SIGKILL pod `name`'s adapter-state sidecar; `stack.start_sidecar(name)` brings one back."""
    _kill(stack.sidecar_process(name))


def sidecar_log(stack: LocalStack, name: str) -> str:
    """The whole log of pod `name`'s sidecar started last."""
    return stack.sidecar_process(name).log_path.read_text(errors="replace")


def write_pool_file(stack: LocalStack, text: str) -> None:
    """Replace the stack's pool file (atomically); the EPP applies the change on its next poll."""
    tmp = stack.pool_file.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(stack.pool_file)


def log_tails(stack: LocalStack) -> str:
    """The end of every log the stack wrote: pods, sidecars, EPPs, Envoy. After a failed start
    some were never started, and are left out."""
    children: list[Child] = []
    for find in (stack.sim_process, stack.sidecar_process):
        for pod in stack.pods:
            with contextlib.suppress(KeyError):
                children.append(find(pod.name))
    parts = [f"== {c.name} ==\n{c.log_tail()}" for c in children]
    for slot in stack.epp_slots:
        if slot.process is not None:
            parts.append(f"== epp :{slot.grpc_port} ==\n{slot.process.log_tail()}")
    if stack.envoy is not None:
        parts.append(f"== envoy ==\n{stack.envoy.log_tail()}")
    return "\n".join(parts)


def stop_epp(stack: LocalStack) -> None:
    """SIGKILL the current EPP (a crash, an OOM kill, a lost node)."""
    slot = stack.epp_slot
    if slot is not None and slot.process is not None:
        _kill(slot.process)


def restart_epp(stack: LocalStack, *, timeout_s: float = 30.0) -> None:
    """Kill the current EPP and start a new one in its slot (a crash and its restart)."""
    slot = stack.epp_slot
    if slot is None:
        raise StackError("the stack has not started")
    if slot.process is not None:
        _kill(slot.process)
    stack.start_epp_slot(slot, timeout_s=timeout_s)


def rolling_restart_epp(stack: LocalStack, *, timeout_s: float = 60.0) -> None:
    """Replace the current EPP as a Deployment rollout does: a new one in a free slot first,
    then SIGTERM to the old one, which drains; returns once the old one has exited."""
    free = [slot for slot in stack.epp_slots if not slot.alive]
    if not free:
        raise StackError("a rolling restart needs a free EPP slot (StackOptions.epp_slots >= 2)")
    old = stack.epp_slot
    stack.start_epp_slot(free[0], timeout_s=timeout_s)
    if old is None or old.process is None or not old.process.alive():
        return
    old.process.process.terminate()
    try:
        old.process.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired as err:
        raise StackError(f"the old EPP did not exit within {timeout_s}s of SIGTERM") from err


def wait_envoy_sees_epp_down(stack: LocalStack, *, timeout_s: float = 15.0) -> None:
    """Return once Envoy's health checks mark the current EPP unhealthy."""
    slot = stack.epp_slot
    if slot is None:
        raise StackError("the stack has not started")
    wait_until(lambda: stack.envoy_sees_epp(slot, "unhealthy"), "Envoy sees the EPP down", within_s=timeout_s)
