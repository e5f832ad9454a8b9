"""Real-engine harness: the vLLM CPU venv, the tiny local model, and a server context manager."""

from harness.engine import (
    EngineError,
    VllmServer,
    engine_python,
    engine_ready,
    engine_venv,
    ensure_engine,
    tiny_model_dir,
)

__all__ = [
    "EngineError",
    "VllmServer",
    "engine_python",
    "engine_ready",
    "engine_venv",
    "ensure_engine",
    "tiny_model_dir",
]
