"""Durable creates moved to antwort_grpc/durable (creates.py): the names the doors import from
here, until they import them from there."""

from antwort_grpc.durable.creates import IDEMPOTENCY_KEY, Begun, Durability, idempotency_key, unavailable

__all__ = ["IDEMPOTENCY_KEY", "Begun", "Durability", "idempotency_key", "unavailable"]
