"""Where the pool comes from without a cluster (a pool file), and the object parsing every source shares."""
