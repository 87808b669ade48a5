"""lora-epp: a LoRA-aware Endpoint Picker for the Gateway API Inference Extension."""

__version__ = "0.1.0"
