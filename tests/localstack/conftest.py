"""LocalStack on loopback for this tier: one process per test session, skipped with the reason where it is not
installed (tests/support/localstack.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.localstack import LocalStack, missing


@pytest.fixture(scope="session")
def localstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    with LocalStack(tmp_path_factory.mktemp("localstack")) as server:
        yield server
