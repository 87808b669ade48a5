"""The picker: what `epp serve` runs on each request's path.

Envoy's ext_proc stream (`extproc`) hands each request to the director, which resolves the model,
asks admission and the scheduler, and names the endpoints; the datastore holds the pool, its
models and each endpoint's scraped metrics (`scrape`) as the pool sources (`sources`) keep them
current; `observability` records every decision. Nothing here knows Kubernetes, the tools or
the operator: the composition root (`epp.serve`) plugs those in.
"""
