"""Which MCP servers the bridge connects to, and how.

Servers come from a JSON file (`ANTWORT_MCP_CONFIG` or `--config`) and/or a JSON list in
`ANTWORT_MCP_SERVERS`; both are lists of `McpServerConfig` (the file may also be an object with a
`servers` list). Secrets stay out of the file: header values can be read from files (a mounted
Kubernetes Secret), and they are read again on every reconnect, so a rotated token is picked up
without a restart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class HeaderFromFile(BaseModel):
    """A header value read from a file (stripped of surrounding whitespace), with an optional
    prefix such as "Bearer "."""

    model_config = ConfigDict(extra="forbid")

    path: Path
    prefix: str = ""

    def read(self) -> str:
        return self.prefix + self.path.read_text().strip()


class McpServerConfig(BaseModel):
    """One MCP server: its label (what requests name in `McpTool.server_label`) and transport."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(pattern=LABEL_PATTERN)
    transport: Literal["stdio", "streamable_http"]
    # stdio: the command to start; the child gets the SDK's minimal default environment
    # (PATH, HOME, …) plus `env`, never the bridge's whole environment.
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: Path | None = None
    # streamable_http: the endpoint and the headers sent with every request.
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    header_files: dict[str, HeaderFromFile] = Field(default_factory=dict)

    @field_validator("header_files", mode="before")
    @classmethod
    def _plain_paths(cls, value: object) -> object:
        # {"Authorization": "/run/secrets/token"} is the short form of {"path": …}.
        if isinstance(value, dict):
            return {k: {"path": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _transport_fields(self) -> McpServerConfig:
        if self.transport == "stdio":
            if not self.command:
                raise ValueError(f"server {self.label!r}: stdio needs a command")
            if self.url or self.headers or self.header_files:
                raise ValueError(f"server {self.label!r}: url and headers apply to streamable_http only")
        else:
            if not self.url or not self.url.startswith(("http://", "https://")):
                raise ValueError(f"server {self.label!r}: streamable_http needs an http(s) url")
            if self.command or self.args or self.env or self.cwd:
                raise ValueError(f"server {self.label!r}: command, args, env and cwd apply to stdio only")
        return self

    def resolved_headers(self) -> dict[str, str]:
        """The headers for a new connection, with file-backed values read now."""
        return {**self.headers, **{name: source.read() for name, source in self.header_files.items()}}


_SERVER_LIST = TypeAdapter(list[McpServerConfig])


class McpBridgeSettings(BaseSettings):
    """`antwort-grpc executor mcp`."""

    model_config = SettingsConfigDict(env_prefix="ANTWORT_MCP_", extra="ignore")

    # A JSON file listing the servers (a list, or an object with a "servers" list).
    config: Path | None = None
    # Servers given directly, as a JSON list (added after those of the file).
    servers: list[McpServerConfig] = Field(default_factory=list)
    # The executor's name in GetExecutorInfo.
    name: str = "mcp"
    # Seconds one connection attempt may take; also how long a call waits for a server that is
    # (re)connecting before it gets an is_error result.
    connect_timeout: float = Field(default=10.0, gt=0)
    # Seconds one tools/call may take (the caller's gRPC deadline applies as well).
    call_timeout: float = Field(default=300.0, gt=0)
    # Seconds between tool-list refreshes of a connected server.
    refresh_seconds: float = Field(default=300.0, gt=0)
    # Upper bound of the exponential backoff between reconnect attempts.
    reconnect_max_seconds: float = Field(default=30.0, gt=0)

    def load_servers(self) -> list[McpServerConfig]:
        servers = list(_read_config_file(self.config)) if self.config else []
        servers.extend(self.servers)
        labels = [s.label for s in servers]
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        if duplicates:
            raise ValueError(f"MCP server labels must be unique; repeated: {', '.join(duplicates)}")
        return servers


def _read_config_file(path: Path) -> list[McpServerConfig]:
    data: Any = json.loads(path.read_text())
    if isinstance(data, dict):
        data = data.get("servers", [])
    return _SERVER_LIST.validate_python(data)
