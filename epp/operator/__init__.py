"""What runs beside the picker to manage models and adapters: the LLMInferenceService controller,
the adapter-state sidecar on each pod, and the EPP's adapter catalogue and loading."""
