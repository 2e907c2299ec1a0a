"""Response storage: the ResponseStore protocol and its implementations."""
