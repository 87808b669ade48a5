"""`epp bench`: routing policies compared on simulated vLLM pods in simulated time.

Layout: `model` (one pod), `workload` (requests), `scenario` (YAML files), `events` (the
discrete-event loop around the real scheduler), `runner` (figures, replica search), `report`
(table, JSON, Markdown, plots), `live` (the real-time cross-check), `cli`.
"""
