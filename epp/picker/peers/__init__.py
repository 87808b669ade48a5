"""The peer exchange between active-active replicas (`epp serve --peers`): `exchange` sends and
receives the routing batches, `server` and `gate` serve the peer port over mutual TLS,
`credentials` reads and checks the certificates, `renewal` takes up renewed ones, `refusals`
counts who was turned away."""

from epp.picker.peers.credentials import PeerTls, PeerTlsFiles, load_peer_tls, peer_identity
from epp.picker.peers.exchange import (
    PeerSender,
    PeerService,
    PodAddresses,
    from_proto,
    parse_peers,
    peers_route,
    process_id,
    to_proto,
)
from epp.picker.peers.refusals import PeerRefusals, Refusal
from epp.picker.peers.renewal import PeerTlsRenewal, Reload
from epp.picker.peers.server import PeerServer, build_peer_server

__all__ = [
    "PeerRefusals",
    "PeerSender",
    "PeerServer",
    "PeerService",
    "PeerTls",
    "PeerTlsFiles",
    "PeerTlsRenewal",
    "PodAddresses",
    "Refusal",
    "Reload",
    "build_peer_server",
    "from_proto",
    "load_peer_tls",
    "parse_peers",
    "peer_identity",
    "peers_route",
    "process_id",
    "to_proto",
]
