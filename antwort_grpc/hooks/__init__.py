"""Policy hooks around the agentic loop: in-process (`PolicyHook`) or remote (antwort.v1.HookService)."""

from antwort_grpc.hooks.clients import HookClient, LocalHook, RemoteHook, build_hooks
from antwort_grpc.hooks.dispatch import Dispatcher, HookFailed, HookFailure, HookRejected, HookRun, Paused
from antwort_grpc.hooks.service import Caller, PolicyHook, current_caller

__all__ = [
    "Caller",
    "Dispatcher",
    "HookClient",
    "HookFailed",
    "HookFailure",
    "HookRejected",
    "HookRun",
    "LocalHook",
    "Paused",
    "PolicyHook",
    "RemoteHook",
    "build_hooks",
    "current_caller",
]
