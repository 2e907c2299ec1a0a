"""Model backends: the Provider protocol and its implementations."""
