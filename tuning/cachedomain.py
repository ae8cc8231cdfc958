"""The write cache a child meets on a Batch host: the lower of the host's writeback domain and its container's. Pure.

On cgroup v2 a task in a memory cgroup is bound to two writeback domains, the host's and its cgroup's, and
balance_dirty_pages() paces it by whichever is nearer its limit (Documentation/admin-guide/cgroup-v2.rst,
"Writeback"; mm/page-writeback.c). The container's thresholds are vm.dirty_* applied to its own available memory,
computed by profiling.probes.wbdomain (the kernel's formula, one owner: mdtc_calc_avail, domain_dirty_limits); a byte
setting is first turned into a ratio of the host's dirtyable memory, so `vm.dirty_bytes` reaches each child only
in proportion to its memory. So with dirtyRatio 30 a 6.75 GiB child pauses near 2 GiB, not at the host's 8.6 GiB
of an m6i.2xlarge.

For planning, a child's available memory is taken as its whole limit (memory.max, the job container's MEMORY): an
upper bound, as the kernel counts only its file pages and its headroom, not what its processes hold. The children
of a round run the same stage together (tuning.simulator), so their container domains fill alike: N children each
at its own limit L are N x L on the host, and the simulator replays the tighter of that and the host's limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from profiling.probes.wbdomain import CgroupMemory, DirtySettings, HostDirtyState, cgroup_thresholds
from tuning.host import KERNEL_DEFAULTS, HostTuning
from tuning.writecache import DIRTYABLE_FRACTION, WriteCache

CONTAINER = "container"
HOST = "host"
# The kernel's own defaults when a setting is left to the kernel (tuning.host.KERNEL_DEFAULTS).
DEFAULT_RATIO = KERNEL_DEFAULTS.dirty_ratio or 20
DEFAULT_BACKGROUND_RATIO = KERNEL_DEFAULTS.dirty_background_ratio or 10


@dataclass(frozen=True)
class Domains:
    """A host's write cache and one child's own (None when the child has no memory limit), for `children` children
    running the same stage."""

    host: WriteCache
    container: WriteCache | None
    children: int

    @property
    def tighter(self) -> str:
        """Which domain paces the children first: CONTAINER or HOST."""
        if self.container is not None and self.container.limit_bytes * self.children < self.host.limit_bytes:
            return CONTAINER
        return HOST

    @property
    def effective(self) -> WriteCache:
        """The host-wide cache the simulator replays: the host's, or the children's own caches together."""
        if self.tighter == HOST or self.container is None:
            return self.host
        n = self.children
        return WriteCache(self.container.limit_bytes * n, self.container.background_bytes * n,
                          self.host.other_dirty_bytes)

    @property
    def optimistic(self) -> WriteCache:
        """The effective cache under the optimistic state of the kernel's pacing (tuning.writecache): a new writeback
        context where the children's own containers pace them (each child is a new container), else a controller
        not yet settled."""
        return self.effective.fresh() if self.tighter == CONTAINER else self.effective.unsettled()

    @property
    def child_limit_bytes(self) -> int:
        """The dirty limit one child meets (its share of the host's when the host's is the tighter)."""
        return self.effective.limit_bytes // self.children


def dirty_settings(tuning: HostTuning) -> DirtySettings:
    """The vm.dirty_* a HostTuning leaves in force (the kernel's defaults for what it leaves alone)."""
    # Writing dirty_bytes zeroes dirty_ratio; the background ratio stays unless its bytes are set.
    if tuning.dirty_bytes:
        background = 0 if tuning.dirty_background_bytes else tuning.dirty_background_ratio or DEFAULT_BACKGROUND_RATIO
        return DirtySettings(0, background, tuning.dirty_bytes, tuning.dirty_background_bytes or 0)
    return DirtySettings(tuning.dirty_ratio or DEFAULT_RATIO, tuning.dirty_background_ratio or DEFAULT_BACKGROUND_RATIO,
                         0, 0)


def host_cache(settings: DirtySettings, memory_bytes: int) -> WriteCache:
    """The host domain's limits (WriteCache.from_ratios: ratios of the host's dirtyable memory)."""
    if settings.bytes:
        dirtyable = memory_bytes * DIRTYABLE_FRACTION
        background = settings.background_bytes or int(dirtyable * settings.background_ratio / 100)
        return WriteCache(settings.bytes, background)
    return WriteCache.from_ratios(memory_bytes, settings.ratio, settings.background_ratio)


def domains(tuning: HostTuning, memory_bytes: int, job_memory_bytes: int | None, children: int) -> Domains:
    """The host's and one child's write cache under `tuning` on a host of `memory_bytes`."""
    settings = dirty_settings(tuning)
    host = host_cache(settings, memory_bytes)
    if job_memory_bytes is None:
        return Domains(host, None, children)
    state = HostDirtyState(int(memory_bytes * DIRTYABLE_FRACTION), 0, exact=False)
    own = cgroup_thresholds(CgroupMemory(0, 0, job_memory_bytes), state, settings)
    return Domains(host, WriteCache(own.dirty_bytes, own.background_bytes), children)


def host_bytes_for_child_limit(child_limit_bytes: int, memory_bytes: int, job_memory_bytes: int) -> int:
    """The vm.dirty_bytes that gives a child of `job_memory_bytes` its own limit of `child_limit_bytes`: the kernel
    applies dirty_bytes / the host's dirtyable memory to the child's memory (inverse of `domains`)."""
    dirtyable = int(memory_bytes * DIRTYABLE_FRACTION)
    return -(-child_limit_bytes * dirtyable // job_memory_bytes)
