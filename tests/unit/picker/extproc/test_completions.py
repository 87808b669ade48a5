"""Finishing routed requests from the gateway's access log: keys, waiting, entries, bounds."""

from __future__ import annotations

import pytest
from google.protobuf import duration_pb2, struct_pb2, wrappers_pb2

from epp._proto.envoy.config.core.v3 import address_pb2
from epp._proto.envoy.data.accesslog.v3 import accesslog_pb2
from epp.clock import FakeClock
from epp.picker.extproc.accesslog import completion_key, completion_of
from epp.picker.extproc.completions import Completion, Completions, peer_host
from epp.picker.lifecycle import Ending, KeyMint, RequestLife

GATEWAY = "ipv4:10.0.0.9:41234"
OTHER_GATEWAY = "ipv4:10.0.0.8:5000"
DONE = Completion(status=200, served_address="10.0.0.1:8000")


class Lives:
    """Lives with keys from one KeyMint, recording each finish (as the director's finisher would)."""

    def __init__(self, clock: FakeClock, instance: str | None = "epp-a") -> None:
        self._clock = clock
        self._keys = KeyMint(instance)
        self.finished: list[RequestLife] = []

    def __call__(self) -> RequestLife:
        key = self._keys()
        return RequestLife(key, f"client-{key}", self._clock.now(), self.finished.append)


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


def test_the_key_is_the_lifes_and_keys_differ_between_processes() -> None:
    clock = FakeClock()
    completions = Completions(clock)
    one, two = Lives(clock, instance=None), Lives(clock, instance=None)  # each process its own prefix
    lives = [one() for _ in range(100)] + [two() for _ in range(100)]
    keys = {completions.expect(life) for life in lives}
    assert keys == {life.key for life in lives}
    assert len(keys) == 200
    assert len(completions) == 200


def test_an_entry_finishes_its_waiting_request_once() -> None:
    clock = FakeClock()
    completions = Completions(clock)
    completions.log_stream_opened(GATEWAY)
    lives = Lives(clock)
    life = lives()
    key = completions.expect(life)
    completions.wait(life, GATEWAY)
    clock.advance(1.0)
    assert completions.on_entry(key, DONE)
    assert not completions.on_entry(key, DONE)  # already finished: a duplicate changes nothing
    assert lives.finished == [life]
    assert life.ending is Ending.ACCESS_LOG and life.finished_at == clock.now()
    assert (life.outcome.status, life.outcome.served_address) == (200, "10.0.0.1:8000")
    assert len(completions) == 0
    assert (completions.entries_matched, completions.entries_unknown) == (1, 1)


def test_an_entry_fills_the_outcome_and_keeps_a_known_served_address() -> None:
    clock = FakeClock()
    completions = Completions(clock)
    life = Lives(clock)()
    life.outcome.served_address = "10.0.0.1:8000"
    completions.finish(
        life, Completion(status=502, served_address=None, response_body_bytes=7, duration_s=1.5, ttft_s=0.5)
    )
    outcome = life.outcome
    assert (outcome.status, outcome.served_address, outcome.response_body_bytes) == (502, "10.0.0.1:8000", 7)
    assert (outcome.duration_s, outcome.ttft_s) == (1.5, 0.5)
    assert life.ending is Ending.ACCESS_LOG


def test_an_entry_can_arrive_before_its_stream_ends() -> None:
    clock = FakeClock()
    completions = Completions(clock)
    lives = Lives(clock)
    life = lives()
    key = completions.expect(life)
    assert completions.on_entry(key, DONE)
    assert lives.finished == []  # its stream is open: it finishes the request with the entry
    assert completions.logged(key) == DONE
    completions.finish(life, completions.logged(key))
    assert lives.finished == [life] and life.ending is Ending.ACCESS_LOG
    assert completions.logged(key) is None
    assert len(completions) == 0


def test_entries_of_other_processes_are_ignored() -> None:
    clock = FakeClock()
    completions = Completions(clock)
    mine = Lives(clock, instance="epp-a")()
    completions.expect(mine)
    theirs = Lives(clock, instance="epp-b")()  # another replica's first request
    assert not completions.on_entry(theirs.key, DONE)
    assert not completions.on_entry("someone-else-1", DONE)
    assert completions.entries_unknown == 2
    assert not mine.finished


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
    clock = FakeClock()
    completions = Completions(clock)
    completions.log_stream_opened(GATEWAY)
    completions.log_stream_opened(OTHER_GATEWAY)
    lives = Lives(clock)
    mine, theirs = lives(), lives()
    completions.expect(mine)
    completions.wait(mine, GATEWAY)
    completions.expect(theirs)
    completions.wait(theirs, OTHER_GATEWAY)
    completions.log_stream_closed(GATEWAY)
    assert lives.finished == [mine]  # its entry would go elsewhere, if anywhere
    assert mine.ending is Ending.EXPIRED
    assert not theirs.finished
    assert completions.expired == 1


def test_waiting_is_bounded_in_time_and_count() -> None:
    clock = FakeClock()
    completions = Completions(clock, wait_s=10.0, max_waiting=3)
    completions.log_stream_opened(GATEWAY)
    lives = Lives(clock)
    requests = [lives() for _ in range(5)]
    for life in requests:
        completions.expect(life)
    for life in requests[:3]:
        completions.wait(life, GATEWAY)
    completions.wait(requests[3], GATEWAY)  # over the count: the oldest goes
    assert lives.finished == [requests[0]]
    clock.advance(11.0)
    completions.expire()
    assert lives.finished == requests[:4]
    assert all(life.ending is Ending.EXPIRED for life in requests[:4])
    assert not requests[4].finished  # its stream is still open: never expired
    assert completions.expired == 4


def test_a_wait_for_a_request_that_was_not_expected_is_ignored() -> None:
    clock = FakeClock()
    completions = Completions(clock)
    completions.log_stream_opened(GATEWAY)
    life = Lives(clock)()
    completions.wait(life, GATEWAY)
    assert len(completions) == 0
    assert not completions.on_entry(life.key, DONE)


def test_forget_drops_a_key_without_finishing_it() -> None:
    clock = FakeClock()
    completions = Completions(clock)
    lives = Lives(clock)
    life = lives()
    key = completions.expect(life)
    completions.forget(key)
    assert not completions.on_entry(key, DONE)
    assert lives.finished == []
    assert len(completions) == 0


def test_a_request_finished_elsewhere_is_not_finished_again() -> None:
    clock = FakeClock()
    completions = Completions(clock)
    completions.log_stream_opened(GATEWAY)
    lives = Lives(clock)
    life = lives()
    completions.expect(life)
    completions.wait(life, GATEWAY)
    life.finish(Ending.CLIENT_GONE, clock.now())  # e.g. the client left: its finisher ran
    completions.on_entry(life.key, DONE)
    assert lives.finished == [life] and life.ending is Ending.CLIENT_GONE
    assert len(completions) == 0


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


def test_the_key_comes_from_the_logged_request_header_when_the_metadata_was_dropped() -> None:
    """Envoy AI Gateway's ext_proc filter accepts no metadata namespace: its access log records
    the key header the EPP set beside the metadata."""
    entry = _entry(None)
    entry.request.request_headers["x-lora-epp-completion-key"] = "abc-7"
    assert completion_key(entry) == "abc-7"
    both = _entry("abc-1")
    both.request.request_headers["x-lora-epp-completion-key"] = "client-sent"
    assert completion_key(both) == "abc-1"  # the metadata, which no client can set, wins


def test_an_ipv6_endpoint_is_bracketed() -> None:
    entry = _entry("k")
    entry.common_properties.upstream_remote_address.socket_address.address = "fd00::2"
    assert completion_of(entry).served_address == "[fd00::2]:8000"
