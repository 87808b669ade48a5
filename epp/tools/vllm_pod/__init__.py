"""One clock-free model of a vLLM pod, shared by every simulation in the repository.

`epp sim` runs it in wall-clock time behind vLLM's HTTP API (`epp.tools.sim`), `epp bench` in
simulated time under the real schedulers (`epp.tools.bench`), and the scheduling scenario tests
through the bench's event loop. Keeping one model means a change to how vLLM schedules, holds
adapters or caches prefixes is made once and every consumer sees it.

- `pod`: `VllmPod`, the scheduler (continuous batching, chunked prefill under a token budget, LoRA
  deferral, KV reservation, prefix cache per adapter) and what its `/metrics` would report.
- `lora`: GPU adapter slots over a host-memory tier, both LRU, with in-batch adapters pinned.
- `prefix`: the prefix cache, in segments (KV blocks, or one shared system prompt).
- `request`: `SimRequest`, a request's workload and what happened to it.
- `cost`: the pluggable step-time model (`CostModel`) and `LatencyCost`, `epp sim`'s flag-driven one.
- `profiles`: `PodProfile`, the calibrated cost model `epp bench` uses, each number with its source.

The model never reads a clock or sleeps: its caller calls `begin_step(now)`, waits the returned
duration however it keeps time, then calls `end_step(end)`.
"""
