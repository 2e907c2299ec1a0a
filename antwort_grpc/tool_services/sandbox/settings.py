"""Settings of `antwort-grpc executor sandbox`: environment variables ANTWORT_SANDBOX_*."""

from __future__ import annotations

import sys
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from antwort_grpc.config import _split_commas


class SandboxSettings(BaseSettings):
    """Limits and isolation of the code interpreter. Every limit applies to one call."""

    model_config = SettingsConfigDict(env_prefix="ANTWORT_SANDBOX_", extra="ignore")

    # The interpreter that runs the code (its installed packages are what the code can import).
    python: str = sys.executable
    # auto: user/net/pid/mount namespaces where the kernel allows them, else the fallback (seccomp
    # and Landlock only); required: refuse to start without them; off: always the fallback.
    namespaces: Literal["auto", "required", "off"] = "auto"
    # uid and gid the code runs as when the service itself runs as root (the kernel applies no
    # process limit to root, and root can read every file). Non-root services run code as themselves.
    user: int = 65534
    # Wall-clock seconds per call; then the whole process group is killed.
    timeout_seconds: Annotated[float, Field(gt=0)] = 30.0
    # CPU seconds per process (SIGXCPU, then SIGKILL one second later).
    cpu_seconds: Annotated[int, Field(ge=1)] = 10
    # Address space per process (RLIMIT_AS).
    memory_mb: Annotated[int, Field(ge=64)] = 512
    # Processes (and threads) the code may have at once. In the fallback mode the kernel counts all
    # of the uid's, the service's own (about 10, plus 3 per running call) included.
    max_processes: Annotated[int, Field(ge=2)] = 64
    # Largest file the code may write.
    max_file_size_mb: Annotated[int, Field(ge=1)] = 16
    # Open file descriptors per process.
    max_open_files: Annotated[int, Field(ge=16)] = 64
    # Bytes of stdout and of stderr kept; printing more stops the code (limit "output").
    max_output_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024
    # Produced files returned with their content, and their total size; the rest are listed only.
    max_files: Annotated[int, Field(ge=0)] = 20
    max_files_bytes: Annotated[int, Field(ge=0)] = 512 * 1024
    # Source size accepted in one call.
    max_code_bytes: Annotated[int, Field(ge=1)] = 256 * 1024
    # Calls running at once; more are refused with RESOURCE_EXHAUSTED.
    max_concurrency: Annotated[int, Field(ge=1)] = 4
    # Where the per-call directories are made (default: the system temp directory).
    workdir_root: str | None = None
    # Extra paths the code may read, comma-separated (the interpreter, system libraries and its own
    # directory are always readable).
    read_paths: Annotated[list[str], NoDecode] = Field(default_factory=list)

    _split = field_validator("read_paths", mode="before")(_split_commas)
