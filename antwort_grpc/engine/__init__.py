"""The agentic loop and the pure policies it runs on."""

from antwort_grpc.engine.loop import Engine, EngineConfig

__all__ = ["Engine", "EngineConfig"]
