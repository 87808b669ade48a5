"""Every conversation with the Kubernetes API: the client, the pool's list+watch, leader election."""
