"""The LLMInferenceService controller: one object → the whole serving stack (see `reconcile`)."""
