"""Each part of the gateway gets its settings record from GatewaySettings.part: every field from the
setting of its name (after the part's prefix) or from a setting named otherwise, none left at its
default by a slip of wiring."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from antwort_grpc.auth.build import build_authenticator
from antwort_grpc.config import GatewaySettings
from antwort_grpc.core import control_limits, durable_settings, request_limits, server_limits
from antwort_grpc.http.serving import door_settings
from antwort_grpc.storage.factory import options_from


def jwt_settings(settings: GatewaySettings) -> Any:
    return getattr(build_authenticator(settings), "settings", None)


JWT = {"auth": "jwt", "jwt_issuer": "https://issuer", "jwt_audience": "antwort", "jwt_jwks": "https://issuer/jwks.json"}

# (the part's builder, a setting given a value other than its default, that value, the field
# that carries it), for the fields named like their settings and for every one named otherwise.
CASES: list[tuple[Callable[[GatewaySettings], Any], str, Any, str]] = [
    (request_limits, "max_tools", 7, "max_tools"),
    (request_limits, "max_control_items", 9, "max_control_items"),
    (control_limits, "max_control_items", 9, "max_items"),
    (control_limits, "max_steer_bytes", 1000, "max_steer_bytes"),
    (control_limits, "history_max_bytes", 2000, "max_response_bytes"),
    (server_limits, "executor_call_timeout", 12.0, "max_tool_timeout"),
    (server_limits, "context_max_tokens", 500, "context_max_tokens"),
    (durable_settings, "background_lease_seconds", 3.0, "lease_seconds"),
    (durable_settings, "background_log_max_bytes", 4096, "log_max_bytes"),
    (durable_settings, "idempotency_ttl_seconds", 60.0, "idempotency_ttl_seconds"),
    (options_from, "response_ttl_seconds", 86400.0, "ttl_seconds"),
    (options_from, "store_maintenance_seconds", 2.5, "maintenance_interval"),
    (options_from, "memory_max_bytes", 1 << 20, "memory_max_bytes"),
    (door_settings, "http_idle_timeout", 2.0, "idle_timeout"),
    (door_settings, "http_max_connections_per_peer", 3, "max_connections_per_peer"),
    (door_settings, "tls_client_ca", Path("ca.pem"), "tls_client_ca"),
    (jwt_settings, "jwt_issuer", "https://other", "issuer"),
    (jwt_settings, "jwt_algorithms", ["ES256"], "algorithms"),
    (jwt_settings, "jwt_leeway_seconds", 5.0, "leeway"),
    (jwt_settings, "jwt_jwks_refresh_seconds", 90.0, "jwks_min_refresh"),
]


@pytest.mark.parametrize(("build", "setting", "value", "field"), CASES)
def test_a_part_takes_its_setting(
    build: Callable[[GatewaySettings], Any], setting: str, value: Any, field: str
) -> None:
    base = JWT if build is jwt_settings else {}
    got = getattr(build(GatewaySettings(**{**base, setting: value})), field)
    assert got == (tuple(value) if isinstance(value, list) else value)


@dataclass(frozen=True)
class Wired:
    max_tools: int
    fixed: float = 1.0
    unknown: int = 0


def test_a_field_with_no_setting_is_refused_unless_kept_or_given() -> None:
    settings = GatewaySettings(max_tools=3)
    with pytest.raises(TypeError, match=r"Wired.unknown: no setting unknown"):
        settings.part(Wired, keep=("fixed",))
    assert settings.part(Wired, keep=("fixed", "unknown")) == Wired(3)
    assert settings.part(Wired, keep=("fixed",), unknown=5) == Wired(3, 1.0, 5)
    with pytest.raises(TypeError, match=r"Wired.max_tools: no setting http_max_tools"):
        settings.part(Wired, "http_", keep=("fixed", "unknown"))
