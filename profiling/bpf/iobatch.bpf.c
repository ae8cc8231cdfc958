// SPDX-License-Identifier: GPL-2.0
/* Per-call figures of one cgroup's processes: the read, write, open, close and fsync families, plus the
 * time writers were paused in balance_dirty_pages, the pages they dirtied and the bytes they moved on sockets.
 *
 * Selection is by cgroup v2 (iob_state.cgroup_id and the cgroups below it), so a pid namespace does not
 * matter and forked children are counted from their first call: a child inherits its parent's cgroup.
 * bpf_get_current_ancestor_cgroup_id() reads the default (v2) hierarchy, which exists beside v1 on a hybrid
 * host (include/uapi/linux/bpf.h, "bpf_get_current_ancestor_cgroup_id").
 *
 * Per call: raw tracepoints sys_enter / sys_exit (include/trace/events/syscalls.h: TP_PROTO(struct pt_regs
 * *regs, long id) and (regs, long ret)), the cheapest syscall hooks and the same on every architecture. The
 * entry time stamp lives in task-local storage (BPF_MAP_TYPE_TASK_STORAGE, usable from tracing programs
 * since Linux 5.11): no hash entry is inserted and deleted per call. Counters are atomic adds on an
 * mmap-able array the loader reads without a system call; min and max are exact (compare-and-swap,
 * -mcpu=v3, Linux 5.12+).
 *
 * The layout (iobatch.h) is what the loader reads; the task finder (iter/task) answers "which cgroup is the
 * process with pid P in pid namespace N in", so the profiler can find a job container's cgroup from
 * another container of the same task.
 */
#include "vmlinux.h"
#include <asm/unistd.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "iobatch.h"

char LICENSE[] SEC("license") = "GPL";

enum { CALL_READ, CALL_WRITE, CALL_OPEN, CALL_CLOSE, CALL_FSYNC };

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, IOB_CELLS);
	__type(key, __u32);
	__type(value, struct iob_cell);
} cells SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct iob_state);
} state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, IOB_TASKS);
	__type(key, __u32);
	__type(value, struct iob_task_pause);
} task_pause SEC(".maps");

/* The call in flight: its type + 1 (0: none) and its entry time. */
struct entry {
	__u64 ts;
	__u32 call;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct entry);
} entries SEC(".maps");

static __always_inline struct iob_state *get_state(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&state, &zero);
}

/* The call type of syscall `id`, or -1 when it is not watched. The numbers are the build's architecture's
 * (<asm/unistd.h>); arm64 has no open or creat. */
static __always_inline int call_of(long id)
{
	switch (id) {
	case __NR_read: case __NR_pread64: case __NR_readv: case __NR_preadv: case __NR_preadv2:
		return CALL_READ;
	case __NR_write: case __NR_pwrite64: case __NR_writev: case __NR_pwritev: case __NR_pwritev2:
		return CALL_WRITE;
#ifdef __NR_open
	case __NR_open:
#endif
#ifdef __NR_creat
	case __NR_creat:
#endif
	case __NR_openat: case __NR_openat2:
		return CALL_OPEN;
	case __NR_close:
		return CALL_CLOSE;
	case __NR_fsync: case __NR_fdatasync:
		return CALL_FSYNC;
	}
	return -1;
}

static __always_inline int selected(struct iob_state *st)
{
	if (!st->cgroup_id || bpf_get_current_ancestor_cgroup_id(st->cgroup_level) != st->cgroup_id)
		return 0;
	return !st->exclude_tgid || (bpf_get_current_pid_tgid() >> 32) != st->exclude_tgid;
}

/* Bit length of v (0 for 0), without loops. */
static __always_inline __u32 bit_length(__u64 v)
{
	__u32 n = 0;
	if (v >> 32) { n += 32; v >>= 32; }
	if (v >> 16) { n += 16; v >>= 16; }
	if (v >> 8) { n += 8; v >>= 8; }
	if (v >> 4) { n += 4; v >>= 4; }
	if (v >> 2) { n += 2; v >>= 2; }
	if (v >> 1) { n += 1; v >>= 1; }
	return n + (__u32)v;
}

static __always_inline void store_min(__u64 *slot, __u64 value)
{
	for (int i = 0; i < 8; i++) {
		__u64 seen = *(volatile __u64 *)slot;
		if (seen && seen <= value + 1)
			return;
		if (__sync_val_compare_and_swap(slot, seen, value + 1) == seen)
			return;
	}
}

static __always_inline void store_max(__u64 *slot, __u64 value)
{
	for (int i = 0; i < 8; i++) {
		__u64 seen = *(volatile __u64 *)slot;
		if (seen >= value)
			return;
		if (__sync_val_compare_and_swap(slot, seen, value) == seen)
			return;
	}
}

SEC("raw_tp/sys_enter")
int iob_sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
	int call = call_of((long)ctx->args[1]);
	if (call < 0)
		return 0;
	struct iob_state *st = get_state();
	if (!st || !selected(st))
		return 0;
	struct entry *e = bpf_task_storage_get(&entries, bpf_get_current_task_btf(), 0,
					       BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!e) {
		__sync_fetch_and_add(&st->missed, 1);
		return 0;
	}
	e->call = call + 1;
	e->ts = bpf_ktime_get_ns();
	return 0;
}

SEC("raw_tp/sys_exit")
int iob_sys_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 now = bpf_ktime_get_ns();
	struct iob_state *st = get_state();
	if (!st || !st->cgroup_id || bpf_get_current_ancestor_cgroup_id(st->cgroup_level) != st->cgroup_id)
		return 0;
	struct entry *e = bpf_task_storage_get(&entries, bpf_get_current_task_btf(), 0, 0);
	if (!e || !e->call)
		return 0;
	__u32 call = e->call - 1;
	__u64 lat = now - e->ts;
	e->call = 0;
	long ret = (long)ctx->args[1];
	__u64 nbytes = 0;
	__u32 k = 0;
	if (call == CALL_READ || call == CALL_WRITE) {
		nbytes = ret > 0 ? ret : 0;
		k = bit_length(nbytes);
		if (k >= IOB_SIZES)
			k = IOB_SIZES - 1;
	}
	__u32 index = call * IOB_SIZES + k;
	struct iob_cell *cell = bpf_map_lookup_elem(&cells, &index);
	if (!cell)
		return 0;
	__u32 h = bit_length(lat);
	h = h ? h - 1 : 0;
	if (h >= IOB_HIST)
		h = IOB_HIST - 1;
	__sync_fetch_and_add(&cell->count, 1);
	__sync_fetch_and_add(&cell->bytes, nbytes);
	__sync_fetch_and_add(&cell->total_ns, lat);
	__sync_fetch_and_add(&cell->hist[h], 1);
	store_min(&cell->min_ns, lat);
	store_max(&cell->max_ns, lat);
	return 0;
}

/* Dirty-page throttling (mm/page-writeback.c): the trace point fires just before the writer sleeps for
 * `pause` ms (include/trace/events/writeback.h converts jiffies to ms); pause <= 0 means no sleep. */
SEC("tp/writeback/balance_dirty_pages")
int iob_dirty_pause(struct trace_event_raw_balance_dirty_pages *ctx)
{
	long pause = BPF_CORE_READ(ctx, pause);
	struct iob_state *st = get_state();
	if (pause <= 0 || !st || !selected(st))
		return 0;
	__sync_fetch_and_add(&st->throttle_ms, pause);
	__u64 now = bpf_ktime_get_ns();
	__u64 end = now + (__u64)pause * 1000000;
	for (int i = 0; i < 8; i++) {   /* wall time: the union of the pauses of all tasks */
		__u64 until = *(volatile __u64 *)&st->paused_until_ns;
		if (end <= until)
			break;
		__u64 from = until > now ? until : now;
		if (__sync_val_compare_and_swap(&st->paused_until_ns, until, end) == until) {
			__sync_fetch_and_add(&st->throttle_wall_ns, end - from);
			break;
		}
	}
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct iob_task_pause *tp = bpf_map_lookup_elem(&task_pause, &tid);
	if (!tp) {
		struct iob_task_pause fresh = {};
		bpf_get_current_comm(fresh.comm, sizeof(fresh.comm));
		bpf_map_update_elem(&task_pause, &tid, &fresh, BPF_NOEXIST);
		tp = bpf_map_lookup_elem(&task_pause, &tid);
		if (!tp)
			return 0;
	}
	__sync_fetch_and_add(&tp->ms, pause);
	return 0;
}

/* The kernel's two layouts of a large folio's page count (include/linux/mm_types.h). */
struct folio___nr_pages { unsigned int _nr_pages; } __attribute__((preserve_access_index));
struct folio___folio_nr_pages { unsigned int _folio_nr_pages; } __attribute__((preserve_access_index));
struct folio___flags_1 { unsigned long _flags_1; } __attribute__((preserve_access_index));

/* folio_nr_pages(): 1 unless PG_head is set, else the large folio's own count. */
static __always_inline __u64 folio_pages(void *folio)
{
	unsigned long flags = 0;
	bpf_probe_read_kernel(&flags, sizeof(flags), folio);   /* flags is the folio's first word */
	if (!(flags & (1UL << bpf_core_enum_value(enum pageflags, PG_head))))
		return 1;
	if (bpf_core_field_exists(struct folio___nr_pages, _nr_pages))
		return BPF_CORE_READ((struct folio___nr_pages *)folio, _nr_pages);
	if (bpf_core_field_exists(struct folio___folio_nr_pages, _folio_nr_pages))
		return BPF_CORE_READ((struct folio___folio_nr_pages *)folio, _folio_nr_pages);
	return 1UL << (BPF_CORE_READ((struct folio___flags_1 *)folio, _flags_1) & 0xff);
}

/* A folio newly dirtied (folio_account_dirtied, in the dirtying task): TP_PROTO(struct folio *, mapping). */
SEC("raw_tp/writeback_dirty_folio")
int iob_dirtied(struct bpf_raw_tracepoint_args *ctx)
{
	struct iob_state *st = get_state();
	if (!st || !selected(st))
		return 0;
	__sync_fetch_and_add(&st->dirtied_pages, folio_pages((void *)ctx->args[0]));
	return 0;
}

/* Socket payload (net/socket.c, sock_sendmsg_nosec / sock_recvmsg_nosec, Linux 6.3+):
 * TP_PROTO(struct sock *sk, int ret, int flags); a MSG_PEEK receive moves nothing. */
SEC("raw_tp/sock_send_length")
int iob_sock_send(struct bpf_raw_tracepoint_args *ctx)
{
	int ret = (int)ctx->args[1];
	struct iob_state *st = get_state();
	if (ret > 0 && st && selected(st))
		__sync_fetch_and_add(&st->sock_sent, ret);
	return 0;
}

#define IOB_MSG_PEEK 2

SEC("raw_tp/sock_recv_length")
int iob_sock_recv(struct bpf_raw_tracepoint_args *ctx)
{
	int ret = (int)ctx->args[1];
	int flags = (int)ctx->args[2];
	struct iob_state *st = get_state();
	if (ret > 0 && !(flags & IOB_MSG_PEEK) && st && selected(st))
		__sync_fetch_and_add(&st->sock_received, ret);
	return 0;
}

/* The task finder: the thread-group leader whose pid in the pid namespace find_ns_inum is find_pid. */
SEC("iter/task")
int iob_find_task(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	struct iob_state *st = get_state();
	if (!task || !st || task->pid != task->tgid)
		return 0;
	struct pid *pid = task->thread_pid;
	if (!pid)
		return 0;
	unsigned int level = BPF_CORE_READ(pid, level);
	for (unsigned int i = 0; i < 8; i++) {
		if (i > level)
			break;
		struct upid up = {};
		bpf_probe_read_kernel(&up, sizeof(up), &pid->numbers[i]);
		if (up.nr != st->find_pid || BPF_CORE_READ(up.ns, ns.inum) != st->find_ns_inum)
			continue;
		struct cgroup *cg = BPF_CORE_READ(task, cgroups, dfl_cgrp);
		st->found_cgroup_id = BPF_CORE_READ(cg, kn, id);
		st->found_cgroup_level = BPF_CORE_READ(cg, level);
		st->found_tgid = task->tgid;
		break;
	}
	return 0;
}
