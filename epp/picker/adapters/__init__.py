"""LoRA adapters as a service: the adapter catalogue and on-demand loading on model servers."""
