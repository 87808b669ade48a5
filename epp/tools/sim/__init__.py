"""`epp sim`: a vLLM-compatible model-server simulator.

Pure parts, reusable by a discrete-event model: `lora` (GPU slots over a CPU tier, LRU),
`kvcache` (per-adapter prefix cache), `engine` (batching and timing, stepped by its caller).
Live parts: `driver` (runs the engine on a Clock), `metrics` (vLLM's /metrics), `api` (wire
shapes), `server` (aiohttp routes), `cli` (flags).
"""
