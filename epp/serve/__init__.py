"""`epp serve`: its flags and the composition root that builds the picker and plugs in the rest."""
