"""The compose stack of docker/, built and started once per test session (see stack.py)."""

from __future__ import annotations

import pytest

from tests.docker.stack import ComposeStack, start_stack


@pytest.fixture(scope="session")
def compose_stack(tmp_path_factory) -> ComposeStack:
    """Images built with the project's Dockerfiles on stand-in bases, docker/compose.yaml up.

    Skips (saying why) where no Docker engine runs and none can be installed and started, or where
    the stand-ins cannot be built (the tests run on another Python than the one they copy).
    """
    from tests.docker.engine import EngineUnavailable, ensure_engine
    from tests.docker.images import StandinsUnavailable, stand_in_python

    try:
        stand_in_python()
    except StandinsUnavailable as reason:
        pytest.skip(f"no stand-in images: {reason}")
    workdir = tmp_path_factory.mktemp("compose")
    try:
        engine = ensure_engine(workdir)
    except EngineUnavailable as reason:
        pytest.skip(f"no Docker engine: {reason}")
    try:
        stack = start_stack(engine, workdir)
        try:
            yield stack
        finally:
            stack.down()
    finally:
        engine.stop()
