"""Build the gateway's parts from settings: provider, store, executors."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from antwort_grpc.config import GatewaySettings
from antwort_grpc.executors.base import FunctionExecutor, ToolExecutor
from antwort_grpc.providers.base import Provider
from antwort_grpc.startup_errors import StartupError
from antwort_grpc.storage.base import ResponseStore

log = logging.getLogger(__name__)

Closer = Callable[[], Awaitable[None]]


@dataclass
class Parts:
    provider: Provider
    store: ResponseStore
    executors: list[ToolExecutor]
    # Called in reverse order on shutdown.
    closers: list[Closer] = field(default_factory=list)

    async def close(self) -> None:
        await close_all(self.closers)


async def close_all(closers: list[Closer]) -> None:
    for close in reversed(closers):
        try:
            await close()
        except Exception:
            log.exception("shutdown step failed")


async def assemble(settings: GatewaySettings) -> Parts:
    from antwort_grpc.providers.factory import build_provider
    from antwort_grpc.storage.factory import open_store, options_from

    closers: list[Closer] = []
    try:
        store = await open_store(settings.store, settings.data_dir, options_from(settings))
    except Exception as error:  # whatever the store's driver raises, the setting to change is the same
        where = settings.store or f"SQLite under --data-dir {settings.data_dir}"
        raise StartupError(f"--store / ANTWORT_STORE ({where}): {error}") from error
    if hasattr(store, "close"):
        closers.append(store.close)
    try:
        provider = await build_provider(settings)
    except BaseException:
        await close_all(closers)  # a store left open would keep its threads and lock
        raise
    if hasattr(provider, "aclose"):
        closers.append(provider.aclose)
    executors: list[ToolExecutor] = [FunctionExecutor()]
    if settings.executors:
        from antwort_grpc.executors.credentials import channel_credentials, read_token
        from antwort_grpc.executors.remote import RemoteSettings, build_executors, start_all

        remote = build_executors(
            settings.executors,
            RemoteSettings(
                refresh_interval=settings.executor_refresh_seconds,
                call_timeout=settings.executor_call_timeout,
                credentials=channel_credentials(
                    settings.executor_ca, settings.executor_client_cert, settings.executor_client_key
                ),
                token=read_token(settings.executor_token, settings.executor_token_file, "ANTWORT_EXECUTOR_TOKEN"),
            ),
        )
        # A service that is down does not stop the gateway: it is retried in the background, and
        # its calls fail as tool errors the model sees meanwhile.
        closers += [r.close for r in remote]
        await start_all(remote)
        executors += remote
    return Parts(provider, store, executors, closers)
