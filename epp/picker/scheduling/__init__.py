"""Pure scheduling: filters, scorers, pickers and the policies built from them."""
