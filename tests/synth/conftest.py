"""The synthesized stack, built once per test session (synth takes seconds and a lot of memory).

The synth is the one `cdk deploy` runs (tests/support/synth.py `synthesize`): aws-cdk-lib's own template
validation stays on, with its findings as errors (tests/synth/test_batch_host.py checks that), cdk-nag
runs as a plugin, and cfn-lint runs once on the template besides.
"""

from __future__ import annotations

import shutil

import pytest

from tests.support.synth import Synthesized, synthesize

if shutil.which("node") is None:
    pytest.skip("node is not installed: CDK synthesis needs it (make setup)", allow_module_level=True)


@pytest.fixture(scope="session")
def synthesized() -> Synthesized:
    return synthesize()
