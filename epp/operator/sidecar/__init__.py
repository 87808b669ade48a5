"""`epp sidecar`: the adapter-state sidecar next to a model server (API in proto/adapterstate.proto)."""
