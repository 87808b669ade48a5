"""Finishing routed requests from the gateway's access log: keys, waiting, entries, bounds."""

from __future__ import annotations

import pytest
from google.protobuf import duration_pb2, struct_pb2, wrappers_pb2

from epp._proto.envoy.config.core.v3 import address_pb2
from epp._proto.envoy.data.accesslog.v3 import accesslog_pb2
from epp.clock import FakeClock
from epp.picker.extproc.accesslog import completion_key, completion_of
from epp.picker.extproc.completions import Completion, Completions, peer_host

GATEWAY = "ipv4:10.0.0.9:41234"
OTHER_GATEWAY = "ipv4:10.0.0.8:5000"
DONE = Completion(status=200, served_address="10.0.0.1:8000")


class Finished:
    def __init__(self) -> None:
        self.calls: list[Completion | None] = []

    def __call__(self, completion: Completion | None) -> None:
        self.calls.append(completion)


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:10.0.0.9:41234", "10.0.0.9"),
        ("ipv6:[fd00::5]:443", "fd00::5"),
        ("ipv4:127.0.0.1:1", "127.0.0.1"),
        ("unix:/tmp/envoy.sock", "/tmp/envoy.sock"),
    ],
)
def test_peer_host(peer: str, host: str) -> None:
    assert peer_host(peer) == host


def test_keys_are_unique_and_differ_between_processes() -> None:
    clock = FakeClock()
    one, two = Completions(clock), Completions(clock)
    keys = {one.expect(Finished()) for _ in range(100)} | {two.expect(Finished()) for _ in range(100)}
    assert len(keys) == 200


def test_an_entry_finishes_its_waiting_request_once() -> None:
    completions = Completions(FakeClock())
    completions.log_stream_opened(GATEWAY)
    finished = Finished()
    key = completions.expect(finished)
    completions.wait(key, GATEWAY)
    assert completions.on_entry(key, DONE)
    assert not completions.on_entry(key, DONE)  # already finished: a duplicate changes nothing
    assert finished.calls == [DONE]
    assert len(completions) == 0
    assert (completions.entries_matched, completions.entries_unknown) == (1, 1)


def test_an_entry_can_arrive_before_its_stream_ends() -> None:
    completions = Completions(FakeClock())
    finished = Finished()
    key = completions.expect(finished)
    assert completions.on_entry(key, DONE)
    assert finished.calls == [DONE]


def test_entries_of_other_processes_are_ignored() -> None:
    completions = Completions(FakeClock())
    assert not completions.on_entry("someone-else-1", DONE)
    assert completions.entries_unknown == 1


def test_only_gateways_with_an_open_log_stream_are_waited_for() -> None:
    completions = Completions(FakeClock())
    assert not completions.receives_from(GATEWAY)
    completions.log_stream_opened("ipv4:10.0.0.9:60000")  # its log stream comes from another port
    completions.log_stream_opened("ipv4:10.0.0.9:60001")  # one per Envoy worker
    assert completions.receives_from(GATEWAY)
    assert not completions.receives_from(OTHER_GATEWAY)
    completions.log_stream_closed("ipv4:10.0.0.9:60000")
    assert completions.receives_from(GATEWAY)
    completions.log_stream_closed("ipv4:10.0.0.9:60001")
    assert not completions.receives_from(GATEWAY)


def test_waits_end_when_the_gateways_last_log_stream_closes() -> None:
    completions = Completions(FakeClock())
    completions.log_stream_opened(GATEWAY)
    completions.log_stream_opened(OTHER_GATEWAY)
    mine, theirs = Finished(), Finished()
    key = completions.expect(mine)
    completions.wait(key, GATEWAY)
    other = completions.expect(theirs)
    completions.wait(other, OTHER_GATEWAY)
    completions.log_stream_closed(GATEWAY)
    assert mine.calls == [None]  # its entry would go elsewhere, if anywhere
    assert theirs.calls == []
    assert completions.expired == 1


def test_waiting_is_bounded_in_time_and_count() -> None:
    clock = FakeClock()
    completions = Completions(clock, wait_s=10.0, max_waiting=3)
    completions.log_stream_opened(GATEWAY)
    finished = [Finished() for _ in range(5)]
    keys = [completions.expect(f) for f in finished]
    for key in keys[:3]:
        completions.wait(key, GATEWAY)
    completions.wait(keys[3], GATEWAY)  # over the count: the oldest goes
    assert finished[0].calls == [None]
    clock.advance(11.0)
    completions.expire()
    assert [f.calls for f in finished[1:4]] == [[None]] * 3
    assert finished[4].calls == []  # its stream is still open: never expired
    assert completions.expired == 4


def test_forget_drops_a_key_without_finishing_it() -> None:
    completions = Completions(FakeClock())
    finished = Finished()
    key = completions.expect(finished)
    completions.forget(key)
    assert not completions.on_entry(key, DONE)
    assert finished.calls == []


def _entry(key: str | None) -> accesslog_pb2.HTTPAccessLogEntry:
    entry = accesslog_pb2.HTTPAccessLogEntry()
    common = entry.common_properties
    if key is not None:
        common.metadata.filter_metadata["envoy.lb"].CopyFrom(
            struct_pb2.Struct(
                fields={
                    "x-gateway-destination-endpoint": struct_pb2.Value(string_value="10.0.0.1:8000"),
                    "lora-epp-completion-key": struct_pb2.Value(string_value=key),
                }
            )
        )
    common.upstream_remote_address.CopyFrom(
        address_pb2.Address(socket_address=address_pb2.SocketAddress(address="10.0.0.2", port_value=8000))
    )
    common.time_to_first_upstream_rx_byte.CopyFrom(duration_pb2.Duration(nanos=250_000_000))
    common.time_to_last_downstream_tx_byte.CopyFrom(duration_pb2.Duration(seconds=2, nanos=500_000_000))
    entry.response.response_code.CopyFrom(wrappers_pb2.UInt32Value(value=200))
    entry.response.response_body_bytes = 1234
    return entry


def test_an_access_log_entry_becomes_a_completion() -> None:
    entry = _entry("abc-1")
    assert completion_key(entry) == "abc-1"
    assert completion_of(entry) == Completion(
        status=200, served_address="10.0.0.2:8000", response_body_bytes=1234, duration_s=2.5, ttft_s=0.25
    )


def test_entries_without_a_key_or_a_response() -> None:
    assert completion_key(_entry(None)) == ""
    bare = accesslog_pb2.HTTPAccessLogEntry()
    assert completion_key(bare) == ""
    assert completion_of(bare) == Completion(status=None, served_address=None)


def test_an_ipv6_endpoint_is_bracketed() -> None:
    entry = _entry("k")
    entry.common_properties.upstream_remote_address.socket_address.address = "fd00::2"
    assert completion_of(entry).served_address == "[fd00::2]:8000"
