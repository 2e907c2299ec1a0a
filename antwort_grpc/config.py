"""Configuration of every role the package runs, from flags and ANTWORT_* environment variables."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, TypeVar

from pydantic import Field, PrivateAttr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Part = TypeVar("Part", bound="DataclassInstance")


def _split_commas(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


@dataclass(frozen=True)
class WorkerPlace:
    """What a worker process of `serve --workers N` is told by its parent (never read from the
    environment): its ports are shared with the other workers (SO_REUSEPORT)."""

    index: int
    count: int
    # The base URL of the embedded local model the parent started; None: the settings' backend.
    model_url: str | None = None


class GatewaySettings(BaseSettings):
    """`antwort-grpc serve`."""

    model_config = SettingsConfigDict(env_prefix="ANTWORT_", extra="ignore")

    listen: str = "127.0.0.1:50051"
    # The Open Responses HTTP/SSE door (docs/http.md): its host:port ("" or "off": none); TLS as
    # the gRPC port's (tls_cert, tls_key, tls_client_ca). Left at its default, a port already in
    # use only turns the door off (a warning); set, it must bind.
    http_listen: str = "127.0.0.1:50080"
    # The largest request body it accepts (413 past it): the gRPC port's message limit.
    http_max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    # Seconds a connection may take to send a request's headers (from its opening, or from the
    # end of the previous response when kept alive) and, apart, its body; then it is closed.
    http_idle_timeout: float = Field(default=60.0, gt=0)
    # Connections the HTTP door holds open, and from one address (docs/limits.md): past them a new
    # one is answered 503 with Retry-After and closed. Unset: half of the descriptors left after a
    # reserve (at most 10,000), and half of that per address; 0: no bound.
    http_max_connections: int | None = Field(default=None, ge=0)
    http_max_connections_per_peer: int | None = Field(default=None, ge=0)
    log_level: str = "INFO"
    # Directory for the embedded defaults (SQLite file, local model state).
    data_dir: Path = Path("var")

    # Model backend: an OpenAI-compatible /v1/chat/completions endpoint. Unset: the embedded
    # local model (when installed) or the scripted provider given by `script`.
    backend_url: str | None = None
    model: str = ""
    backend_api_key: str | None = None
    backend_api_key_file: Path | None = None
    backend_headers: dict[str, str] = Field(default_factory=dict)
    backend_connect_timeout: float = 5.0
    backend_read_timeout: float = 120.0
    backend_max_retries: int = 3
    # A JSON file of scripted turns: the provider tests and the demo use.
    script: Path | None = None

    # "memory", "sqlite:///path/file.db" or "postgresql://…"; empty: SQLite under data_dir.
    store: str = ""
    history_max_depth: int = 100
    # The most bytes of input and output followed through a previous_response_id chain.
    history_max_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    # The memory store's bounds (oldest finished responses evicted past either).
    memory_max_responses: int = 10_000
    memory_max_bytes: int = 256 * 1024 * 1024
    # What one request may hold (docs/limits.md); checked before any work starts.
    max_tools: int = 128
    max_schema_bytes: int = 64 * 1024
    max_schema_depth: int = 20
    max_tools_bytes: int = Field(default=1024 * 1024, gt=0)
    max_input_items: int = 2048
    # Content parts of every input message together (docs/limits.md: what bounds the objects a
    # request makes, as bytes do not: 8 MB of one-character parts is 900,000 of them).
    max_content_parts: int = Field(default=8192, gt=0)
    max_metadata: int = 16
    # A request that starts a response, serialized (0: only the gRPC message limit, 32 MiB).
    max_request_bytes: int = Field(default=8 * 1024 * 1024, ge=0)
    # What controls may add to a running response (docs/limits.md): items per steer or follow-up,
    # and the steering messages and follow-ups waiting to be taken in, by count and bytes. What a
    # response holds in all, with what controls add, is bounded by history_max_bytes.
    max_control_items: int = Field(default=64, gt=0)
    max_steers: int = Field(default=16, gt=0)
    max_steer_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    max_follow_ups: int = Field(default=16, gt=0)
    max_follow_up_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    response_ttl_seconds: float | None = None
    # Seconds between store upkeep: heartbeat, sweep of responses a dead replica left, TTL purge.
    store_maintenance_seconds: float = 5.0
    # Background responses (docs/durable-runs.md): seconds a replica's lease on a run lasts
    # unrenewed (another replica takes the run over after it), seconds the event log is kept after
    # the end, bytes of events one response's log may hold (beyond: only the final response), and
    # seconds an idempotency key names its response.
    background_lease_seconds: float = Field(default=10.0, gt=0)
    background_log_retention_seconds: float = Field(default=3600.0, ge=0)
    background_log_max_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    idempotency_ttl_seconds: float = Field(default=24 * 3600.0, gt=0)

    # gRPC targets of ToolExecutorService servers.
    executors: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Seconds between refreshes of each executor's tool list; the longest one remote tool call may
    # take (the request's deadline shortens it).
    executor_refresh_seconds: float = 10.0
    executor_call_timeout: float = 300.0
    # How the gateway reaches its executors: the token it sends (or a file holding it), the CA that
    # signed their TLS certificates (set: TLS), and its own client certificate and key (mutual TLS).
    executor_token: str | None = None
    executor_token_file: Path | None = None
    executor_ca: Path | None = None
    executor_client_cert: Path | None = None
    executor_client_key: Path | None = None
    # The server's maximums of a response's execution limits; a request may ask for less (max_turns
    # is also the default). Unset: no maximum. Seconds for max_duration.
    max_turns: int = 10
    max_tool_calls: int | None = None
    max_duration: float | None = None
    max_output_tokens: int | None = None
    # The context a model call is sent with truncation AUTO: items, and estimated tokens.
    context_max_items: int | None = None
    context_max_tokens: int | None = None
    # Hooks, called in this order: gRPC targets of HookService servers, or module:Class of a
    # PolicyHook to run in-process; each may add `;timeout=SECONDS;failure=open|closed`.
    hooks: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # The defaults of those options: seconds per hook call, and what a failing hook does.
    hook_timeout: float = Field(default=1.0, gt=0, le=60)
    hook_failure: Literal["open", "closed"] = "closed"
    # Seconds a tool call waits for an approve/deny decision before it is denied ("timeout").
    approval_timeout: float = Field(default=300.0, gt=0)
    # Connections (docs/clients.md). Clients may ping as often as every keepalive_min_ping_interval
    # seconds, with or without calls (Go's and Java's keepalive of 10 s and more); the server pings
    # a connection every keepalive_time seconds and closes it when no answer comes within
    # keepalive_timeout (a client gone without a FIN). After max_connection_age seconds (±10 %) a
    # connection is told to go away: new calls open a new one, which a balancer may send to another
    # replica; the calls still on it may finish for max_connection_age_grace seconds, unset: as long
    # as they take (an idle Converse session waiting for an approval is never cut). 0: no age.
    keepalive_time: float = Field(default=30.0, gt=0)
    keepalive_timeout: float = Field(default=20.0, gt=0)
    keepalive_min_ping_interval: float = Field(default=5.0, gt=0)
    max_connection_age: float = Field(default=1800.0, ge=0)
    max_connection_age_grace: float | None = Field(default=None, gt=0)
    # Calls one connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; a client
    # queues its calls past it). Bounds the request bytes one connection makes the gateway receive
    # before admission weighs them (docs/limits.md). 0: grpc's default, no limit.
    max_streams_per_connection: int = Field(default=0, ge=0)
    # Connections the gRPC port holds open (past it grpc closes a new one at once: the client sees
    # UNAVAILABLE and retries). Unset: as the HTTP door's default; 0: no bound.
    max_connections: int | None = Field(default=None, ge=0)
    # Seconds in-flight streams get to finish on SIGTERM.
    shutdown_grace: float = 10.0
    # Seconds between health going NOT_SERVING and refusing new calls, for load balancers.
    shutdown_drain: float = 1.0
    # Ctrl-C (SIGINT): no drain, and in-flight responses get this grace before they are cancelled.
    interrupt_grace: float = 1.0

    # Authentication: none (then only a loopback listen address, unless allow_unauthenticated),
    # api_key (a file of hashed keys) or jwt (bearer tokens checked against a JWKS or a PEM key).
    auth: Literal["none", "api_key", "jwt"] = "none"
    allow_unauthenticated: bool = False
    api_keys_file: Path | None = None
    jwt_jwks: str = ""
    jwt_public_key_file: Path | None = None
    jwt_issuer: str = ""
    jwt_audience: str = ""
    jwt_algorithms: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["RS256", "ES256"])
    jwt_principal_claim: str = "sub"
    jwt_tenant_claim: str = "tenant"
    jwt_leeway_seconds: float = 30.0
    # Least seconds between two fetches of a JWKS URL (a token with an unknown key id fetches it).
    jwt_jwks_refresh_seconds: float = 30.0
    # Responses one principal may run at once (CreateResponse, Converse); 0: no limit. Unset:
    # with authentication, `principal_share` of the running cap (one caller cannot take every
    # slot); without it every caller is the same principal, so no limit.
    max_concurrent_responses: int | None = Field(default=None, ge=0)
    # The fraction of the running cap one principal may hold by default (see above).
    principal_share: float = Field(default=0.5, gt=0, le=1)
    # The fraction of the running cap one principal's background responses may hold (they run
    # with nobody connected); with authentication only, as above.
    background_share: float = Field(default=0.25, gt=0, le=1)
    # A background response without a max_duration of its own (nor a server maximum) ends
    # INCOMPLETE (max_duration) after this many seconds; 0: never.
    background_max_duration: float = Field(default=3600.0, ge=0)
    # Responses the whole gateway process runs at once; unset: 512, what one event loop serves
    # (docs/limits.md); 0: no limit.
    max_running_responses: int | None = Field(default=None, ge=0)
    # Seconds the event loop may run behind (averaged over about a second) before new responses
    # are refused with a retry pushback; 0: no such bound.
    admission_max_lag: float = Field(default=0.5, ge=0)
    # Bytes the requests of running responses are estimated to hold (6 times their size, plus
    # 64 KiB each); unset: a quarter of the memory the process may use; 0: no budget.
    memory_budget_bytes: int | None = Field(default=None, ge=0)
    # Seconds a Converse stream may stay open with no response running before it is closed
    # (DEADLINE_EXCEEDED, reason idle_timeout); 0: never.
    converse_idle_timeout: float = Field(default=600.0, ge=0)
    # Seconds a stream's write may stay blocked because its client reads nothing before the stream
    # is ended (its response stored, its slot freed; a background run goes on); 0: never.
    stream_write_timeout: float = Field(default=30.0, ge=0)
    # gRPC server reflection (grpcurl's `list`, `describe`); behind authentication like every RPC.
    reflection: bool = True
    # TLS on the gRPC port: certificate chain and key (PEM); with a client CA, mutual TLS (callers
    # must present a certificate it signed).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    # host:port of the Prometheus /metrics endpoint (its own HTTP port); empty: no metrics.
    metrics_listen: str = ""
    # "json": one JSON object per log line, and a line per finished response.
    log_format: Literal["text", "json"] = "text"
    # Worker processes serving the same ports, each a replica of the store (docs/deploy.md);
    # unset: one per usable core with a PostgreSQL store, else 1 (SQLite and memory serve one process).
    workers: int | None = Field(default=None, ge=1)
    # Set in a worker process by its parent (antwort_grpc/workers); None in a gateway of one process.
    _worker: WorkerPlace | None = PrivateAttr(default=None)

    @property
    def worker(self) -> WorkerPlace | None:
        return self._worker

    def place_worker(self, place: WorkerPlace) -> None:
        self._worker = place

    def part(self, record: type[Part], prefix: str = "", keep: tuple[str, ...] = (), **named: object) -> Part:
        """The settings record (a dataclass) of one part of the gateway, from these settings: a
        field given in `named` takes that value, any other the setting `prefix` + its name, and
        those in `keep` their defaults (what the operator does not set). A field that is none of
        these is a wiring mistake, refused at start-up (TypeError, as the record itself refuses a
        missing field) rather than left at its default without a word."""
        settings = type(self).model_fields
        values = dict(named)
        for name in (f.name for f in fields(record) if f.init and f.name not in named and f.name not in keep):
            if prefix + name not in settings:
                raise TypeError(f"{record.__name__}.{name}: no setting {prefix + name}")
            values[name] = getattr(self, prefix + name)
        return record(**values)

    _split = field_validator("executors", "hooks", "jwt_algorithms", mode="before")(_split_commas)


class ExecutorSettings(BaseSettings):
    """`antwort-grpc executor …` roles."""

    model_config = SettingsConfigDict(env_prefix="ANTWORT_EXECUTOR_", extra="ignore")

    listen: str = "127.0.0.1:50061"
    log_level: str = "INFO"
    # Callers must send `authorization: Bearer <token>` (the gateway's ANTWORT_EXECUTOR_TOKEN);
    # the token itself, or a file holding it.
    token: str | None = None
    token_file: Path | None = None
    # TLS on the port (PEM); with a client CA, callers must present a certificate it signed.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    # Without a token or mutual TLS an executor listens only on loopback, unless this says a
    # network policy guards it.
    allow_unauthenticated: bool = False


class HookSettings(BaseSettings):
    """`antwort-grpc hook run`."""

    model_config = SettingsConfigDict(env_prefix="ANTWORT_HOOK_", extra="ignore")

    listen: str = "127.0.0.1:50071"
    log_level: str = "INFO"
