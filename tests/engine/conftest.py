"""Everything under tests/engine/ needs the real vLLM CPU engine: mark it ``engine`` automatically, so
it is deselected from the default (unit) run even if a test module forgets its marker. A test here that
needs no engine (pure harness logic) opts out with ``@pytest.mark.offline``."""

from __future__ import annotations

from pathlib import Path

import pytest

ENGINE_DIR = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "offline: a test under tests/engine/ that needs no real engine")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if ENGINE_DIR in Path(str(item.path)).parents and item.get_closest_marker("offline") is None:
            item.add_marker(pytest.mark.engine)
