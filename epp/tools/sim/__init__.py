"""`epp sim`: a vLLM-compatible model-server simulator.

The pod itself (batching, LoRA slots, KV, prefix cache) is `epp.tools.vllm_pod`, shared with
`epp bench`. Here: `engine` (that model costed by the flags, seen token by token, stepped by its
caller), `driver` (runs the engine on a Clock), `metrics` (vLLM's /metrics), `api` (wire shapes),
`server` (aiohttp routes), `cli` (flags).
"""
