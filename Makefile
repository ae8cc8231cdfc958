# iobatch: every target sets up what it needs first. Setup is idempotent and pinned:
# Python packages from requirements.lock into .venv/, versitygw and the CDK CLI into .tools/ and node_modules/.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TOOLS := .tools
VERSITYGW_VERSION := v1.8.0
SYSTEM_PACKAGES := podman buildah debootstrap clang libbpf-dev bpftool chromium strace xfsprogs datefudge fuse3 runc \
  qemu-system-x86 qemu-utils busybox-static crun kmod
# The cgroup v2 guest's kernel (tuning/guest): Debian 12's generic 6.1 kernel, this ABI first.
GUEST_KERNEL_ABI := 6.1.0-56
export CDK_DISABLE_VERSION_CHECK := 1
export CDK_DISABLE_CLI_TELEMETRY := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/$(TOOLS)/bin:$(CURDIR)/node_modules/.bin:$(PATH)

# Flags for the demo, e.g. `make demo DEMO_ARGS="--images 80 --slow-child 3"`.
DEMO_ARGS ?=
# Extra pytest arguments, e.g. `make test PYTEST_ARGS="-m unit"`.
PYTEST_ARGS ?=
# Arguments for the CDK CLI, e.g. `make deploy CDK_ARGS="-c volumeType=gp3 -c volumeSizeGiB=300"`.
CDK_ARGS ?=

.PHONY: setup bytecode bpf host-mounts guest images demo fresh-check check docs test test-shifted-clock fuzz lint synth bench clean help
.PHONY: setup-deploy setup-demo setup-start bootstrap deploy destroy localstack

help:
	@echo "make demo    run the main job on the embedded S3 server and print where outputs and report are"
	@echo "make test    run the whole suite (unit, functional, synth, e2e, faults, guest, localstack)"
	@echo "make synth   cdk synth the stack offline with the pinned CLI"
	@echo "make bootstrap / deploy / destroy   the CDK CLI with CDK_ARGS (setup-deploy: only what deploying needs)"
	@echo "make bench   run the benchmarks in bench/ (see BENCHMARKS.md)"
	@echo "make check   ruff and mypy (make lint is the same), with only the Python environment"
	@echo "make docs    write docs/reference/ from the code (the suite fails when it is stale)"
	@echo "make fuzz    the fuzz tests with new examples drawn (make test replays the same ones)"
	@echo "make fresh-check   make demo and make test as a new machine runs them (a fresh clone, no bpffs, no caches)"

setup: setup-start $(VENV)/.installed bytecode $(TOOLS)/bin/versitygw node_modules/.installed \
  $(TOOLS)/.system-packages interposer bpf host-mounts guest images localstack
	@echo "[$$(date -u +%T)] set up"

setup-start:
	@echo "[$$(date -u +%T)] setting up"

# Deploying needs only the Python environment, the pinned CDK CLI and a container builder for the job image (no Go,
# no root, none of the test tools): `make setup-deploy`, then `make bootstrap` and `make deploy`.
setup-deploy: $(VENV)/.installed node_modules/.installed
	@command -v "$${CDK_DOCKER:-docker}" >/dev/null 2>&1 || echo "note: no $${CDK_DOCKER:-docker} on PATH: cdk deploy \
	builds the job image with it (CDK_DOCKER names another Docker-compatible CLI, e.g. CDK_DOCKER=podman)"

bootstrap: setup-deploy
	cdk bootstrap $(CDK_ARGS)

deploy: setup-deploy
	cdk deploy $(CDK_ARGS)

destroy: setup-deploy
	cdk destroy $(CDK_ARGS)

$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

$(TOOLS)/bin/versitygw:
	mkdir -p $(TOOLS)/bin
	GOBIN=$(CURDIR)/$(TOOLS)/bin GOFLAGS=-mod=mod go install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# Debian packages, as root: `make setup` (the tests) installs all of SYSTEM_PACKAGES: the container build, the eBPF
# probe's build, the slow-disk lab, the report's browser test, the shifted-clock run (datefudge) and the cgroup v2
# guest. `make demo` installs only what the demo runs: the eBPF probe's build and the lab's volume.
DEMO_PACKAGES := clang libbpf-dev xfsprogs fuse3
define install-packages
	@mkdir -p $(TOOLS)
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages: $$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "note: not root, so not installing $$missing; what needs them says so and is skipped"; exit 0; \
	  fi; \
	fi
	touch $@
endef

$(TOOLS)/.system-packages: Makefile
	$(call install-packages,$(SYSTEM_PACKAGES))

$(TOOLS)/.demo-packages: Makefile
	$(call install-packages,$(DEMO_PACKAGES))

# What `make demo` needs: the Python environment, the S3 server, the interposer and the eBPF probe.
setup-demo: $(VENV)/.installed bytecode $(TOOLS)/bin/versitygw $(TOOLS)/.demo-packages interposer bpf host-mounts

# The project's own modules, compiled: where PYTHONDONTWRITEBYTECODE is set (CI's machines set it) no process writes
# them, and every python process would compile them again, ~0.3 s of CPU each (a child runs three; the suite starts
# thousands). A module changed since is compiled again in memory by Python, never run stale.
bytecode: $(VENV)/.installed
	@$(PY) -m compileall -q -j 0 pipeline profiling tuning infra bench tests

# The mounts a booted host has and the eBPF probe uses (bpffs, tracefs: profiling/probes/hoststate.py owns the list):
# as root, mounted when missing, one line each; a machine that boots no systemd has neither. Never a stamp file: a
# mount is gone after a reboot while a stamp stays.
host-mounts: $(VENV)/.installed
	@$(PY) -m profiling.hoststate

interposer: $(VENV)/.installed
	@if [ -f profiling/interpose/Makefile ]; then $(MAKE) --no-print-directory -C profiling/interpose; fi

# The eBPF probe's CO-RE program (profiling/bpf): needs clang and libbpf-dev (installed above as root) and builds
# from the committed x86_64 vmlinux.h, not this machine's BTF; elsewhere the probe says why it is off and the rest works.
bpf: $(TOOLS)/.demo-packages
	@if command -v clang >/dev/null && [ -f /usr/include/bpf/bpf_helpers.h ] && [ "$$(uname -m)" = x86_64 ]; \
	then $(MAKE) --no-print-directory -C profiling/bpf; \
	else echo "note: not building the eBPF probe (needs clang and libbpf-dev, on x86_64)"; fi

# The cgroup v2 guest (tuning/guest): its kernel unpacked under .tools/guest and an initramfs the project builds.
# As root only (qemu and busybox come from Debian's packages above); without them the guest tier skips.
guest: $(TOOLS)/.system-packages $(VENV)/.installed
	@if [ "$$(id -u)" = 0 ] && command -v qemu-system-x86_64 >/dev/null && [ -x /bin/busybox ]; then \
	  tuning/guest/fetch-kernel.sh $(TOOLS)/guest $(GUEST_KERNEL_ABI) && \
	  { [ $(TOOLS)/guest/initramfs.cpio -nt tuning/guest/initramfs-init.sh ] && [ $(TOOLS)/guest/initramfs.cpio -nt tuning/guest/assets.py ] \
	    || $(PY) -m tuning.guest.assets $(TOOLS)/guest; } && \
	  $(PY) -m tuning.guest.machine; \
	else echo "note: not preparing the cgroup v2 guest (needs root, qemu-system-x86 and busybox-static)"; fi

# The images the task rehearsals run (tests/support/images.py: a debootstrap base, the job image, a user's image from
# examples/Dockerfile), as root with podman: a few minutes on a new machine, seconds once podman's layer cache holds
# them. Without root or podman the rehearsals skip, saying so.
images: $(TOOLS)/.system-packages $(VENV)/.installed
	@if [ "$$(id -u)" = 0 ] && command -v podman >/dev/null; then $(PY) -m tests.support.images; \
	else echo "note: not building the rehearsals' images (needs root and podman)"; fi

# LocalStack's free runtime (S3, CloudWatch Logs) for the localstack test tier, in its own virtualenv, every package
# pinned in requirements-localstack.lock (installed without a resolver). Without network or Python it says so once
# and the tier skips.
LOCALSTACK_VENV := $(TOOLS)/localstack-venv
localstack: $(LOCALSTACK_VENV)/.installed

$(LOCALSTACK_VENV)/.installed: requirements-localstack.lock
	@mkdir -p $(TOOLS)
	@if { test -x $(LOCALSTACK_VENV)/bin/python || $(PYTHON) -m venv $(LOCALSTACK_VENV); } >$(TOOLS)/localstack-install.log 2>&1 \
	    && $(LOCALSTACK_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -r requirements-localstack.lock \
	       >>$(TOOLS)/localstack-install.log 2>&1; then touch $@; \
	else echo "note: LocalStack did not install (see $(TOOLS)/localstack-install.log): the localstack tests will skip"; fi

demo: setup-demo
	$(PY) -m pipeline.cli demo $(DEMO_ARGS)

# Each step says when it starts (UTC), and pytest names its 20 slowest tests: where a run's time goes.
test: setup
	@echo "[$$(date -u +%T)] lint"
	@$(MAKE) --no-print-directory check
	@echo "[$$(date -u +%T)] the shifted clock"
	$(MAKE) --no-print-directory test-shifted-clock
	@echo "[$$(date -u +%T)] the suite"
	$(PY) -m pytest --durations=20 $(PYTEST_ARGS)

# No test may depend on today's date or the time zone: the unit tier again, 400 days ahead and at UTC+14
# (a POSIX TZ string, so no tz database is needed). datefudge moves only the wall clock (time, gettimeofday,
# clock_gettime's CLOCK_REALTIME) for Python and what it starts, not for Go binaries, which is why only the unit tier
# (no S3 server, no s5cmd) runs shifted. Not libfaketime: its 0.9.10 moves the monotonic clock too, and Python's
# timed waits (threading.Event.wait(0.5)) then wait 400 days, or time.sleep fails (EINVAL) when told not to.
# Each test has 5 minutes here, then every thread's stack is printed and the run ends (the thread method: the
# signal method's failure can be caught by the code under test, Hypothesis among it, and the hang goes on).
SHIFTED_DAYS := 400
test-shifted-clock: setup
	@if command -v datefudge >/dev/null 2>&1; then \
	  echo "unit tier with the clock $(SHIFTED_DAYS) days ahead, TZ UTC+14:"; \
	  TZ=IOB-14 datefudge "$$(date -u -d '+$(SHIFTED_DAYS) days' '+%F %T UTC')" $(PY) -m pytest -m unit -q \
	    -p no:cacheprovider -o timeout=300 -o timeout_method=thread; \
	else \
	  echo "skipped: the shifted-clock unit run needs datefudge (make setup installs it as root)"; \
	fi

# The fuzz tests with new examples drawn (`make test` replays the same ones each run: see tests/conftest.py).
fuzz: setup
	HYPOTHESIS_PROFILE=explore $(PY) -m pytest -q tests/unit/test_cli_fuzz.py tests/unit/test_fuzz_inputs.py $(PYTEST_ARGS)

# Lint and types: only the Python environment (none of the test tools, Debian packages, Go or npm); under a minute.
check: $(VENV)/.installed
	$(PY) -m ruff check pipeline profiling tuning infra tests bench examples scripts
	$(PY) -m mypy

lint: check

# The reference pages under docs/reference/, written from the code (scripts/docsref.py); tests/unit/test_docs.py fails
# when they differ from what this would write.
docs: $(VENV)/.installed
	$(PY) scripts/docsref.py

synth: setup-deploy
	rm -rf cdk.out
	cdk synth --quiet $(CDK_ARGS)

bench: setup
	$(PY) -m bench

# The README's two commands as a new machine runs them (a fresh clone, a mount namespace without bpffs or tracefs,
# podman storage and caches of its own): run it before resolving an issue. Takes as long as a new machine's first
# make demo and make test (about 40 minutes); as root.
fresh-check:
	scripts/fresh-check.sh

clean:
	rm -rf cdk.out .iobatch .pytest_cache .mypy_cache .ruff_cache
	find pipeline profiling tuning infra bench tests -name __pycache__ -prune -exec rm -rf {} +
