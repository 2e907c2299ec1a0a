"""Policy hooks around the agentic loop: in-process (`PolicyHook`) or remote (antwort.v1.HookService)."""

from antwort_grpc.hooks.clients import Caller, HookClient, LocalHook, RemoteHook, build_hooks
from antwort_grpc.hooks.dispatch import Dispatcher, HookFailed, HookFailure, HookRejected, HookRun
from antwort_grpc.hooks.service import PolicyHook

__all__ = [
    "Caller",
    "Dispatcher",
    "HookClient",
    "HookFailed",
    "HookFailure",
    "HookRejected",
    "HookRun",
    "LocalHook",
    "PolicyHook",
    "RemoteHook",
    "build_hooks",
]
