"""The compose stack of docker/, built and started once per test session (see stack.py)."""

from __future__ import annotations

import time

import pytest

from tests.support.docker.stack import ComposeStack, start_stack

#: How long each stage took (engine, each image built, stack start-up, teardown): printed in the
#: session's summary, where slow builds are seen without reading logs.
TIMINGS: list[str] = []


def pytest_terminal_summary(terminalreporter) -> None:
    if TIMINGS:
        terminalreporter.write_sep("-", "compose stack timings")
        terminalreporter.write_line(", ".join(TIMINGS))


@pytest.fixture(scope="module")
def compose_stack(tmp_path_factory) -> ComposeStack:
    """Images built with the project's Dockerfiles on stand-in bases, docker/compose.yaml up.

    Down as soon as this module's tests are done: its health checks (Airflow's CLI every few
    seconds per service) kept two CPUs busy for the rest of the suite.

    Skips (saying why) where no Docker engine runs and none can be installed and started, or where
    the stand-ins cannot be built (the tests run on another Python than the one they copy).
    """
    from tests.support.docker.engine import EngineUnavailable, ensure_engine
    from tests.support.docker.images import StandinsUnavailable, stand_in_python

    try:
        stand_in_python()
    except StandinsUnavailable as reason:
        pytest.skip(f"no stand-in images: {reason}")
    workdir = tmp_path_factory.mktemp("compose")
    started = time.monotonic()
    try:
        engine = ensure_engine(workdir)
    except EngineUnavailable as reason:
        pytest.skip(f"no Docker engine: {reason}")
    TIMINGS.append(f"engine: {time.monotonic() - started:.0f} s")
    try:
        stack = start_stack(engine, workdir, TIMINGS)
        try:
            yield stack
        finally:
            started = time.monotonic()
            stack.down()
            TIMINGS.append(f"stack down: {time.monotonic() - started:.0f} s")
    finally:
        engine.stop()
