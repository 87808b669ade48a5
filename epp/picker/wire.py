"""Every header name, metadata key and size limit of the ext_proc contract, in one place.

Names follow the Gateway API Inference Extension protocol (v1.0+ fixed names).
"""

from __future__ import annotations

# Request headers the EPP sets.
DESTINATION_ENDPOINT_HEADER = "x-gateway-destination-endpoint"
CONTENT_LENGTH_HEADER = "Content-Length"
REQUEST_ID_HEADER = "x-request-id"

# Request headers a client (or the gateway) sends to steer the EPP.
OBJECTIVE_HEADER = "x-gateway-inference-objective"
MODEL_NAME_REWRITE_HEADER = "x-gateway-model-name-rewrite"
FAIRNESS_ID_HEADER = "x-gateway-inference-fairness-id"
FAIRNESS_ID_HEADER_LLMD = "x-llm-d-inference-fairness-id"  # llm-d's newer name for the same

# Control headers a client may send but must never reach the model server as-is: the destination
# header (a client must never choose the address Envoy dials) and the served/subset keys. The EPP
# removes these from the upstream request.
STRIPPED_CLIENT_HEADERS = frozenset(
    {
        DESTINATION_ENDPOINT_HEADER,
        "x-gateway-destination-endpoint-fallback",
        "x-gateway-destination-endpoint-served",
        "x-gateway-destination-endpoint-subset",
    }
)

# Response headers the EPP sets.
WENT_INTO_RESP_HEADERS = "x-went-into-resp-headers"

# Dynamic metadata (EPP -> data plane) and metadata_context (data plane -> EPP).
LB_METADATA_NAMESPACE = "envoy.lb"
DESTINATION_ENDPOINT_KEY = "x-gateway-destination-endpoint"
SERVED_ENDPOINT_KEY = "x-gateway-destination-endpoint-served"
# Ours: the key the EPP gives each routed request, returned by the gateway's access-log entry.
COMPLETION_KEY = "lora-epp-completion-key"
# The same key as a request header, for gateways whose ext_proc filter drops the EPP's dynamic
# metadata (Envoy AI Gateway accepts no namespace): their access log records the header instead.
COMPLETION_KEY_HEADER = "x-lora-epp-completion-key"
SUBSET_HINT_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_HINT_KEY = "x-gateway-destination-endpoint-subset"

# Body chunks sent back as streamed_response stay under Envoy's 64 KiB streamed-mutation limit.
BODY_CHUNK_BYTES = 62000

# Defaults for limits the operator can change.
DEFAULT_MAX_REQUEST_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

SSE_CONTENT_TYPE = "text/event-stream"
JSON_CONTENT_TYPE = "application/json"
