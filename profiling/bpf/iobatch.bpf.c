// SPDX-License-Identifier: GPL-2.0
/* Per-call figures of one cgroup's processes: the read, write, open, close and fsync families, plus the
 * time writers were paused in balance_dirty_pages, the pages they dirtied and the bytes they moved on sockets.
 *
 * Selection is by cgroup v2 (iob_state.cgroup_id and the cgroups below it), so a pid namespace does not
 * matter and forked children are counted from their first call: a child inherits its parent's cgroup.
 * bpf_get_current_ancestor_cgroup_id() reads the default (v2) hierarchy, which exists beside v1 on a hybrid
 * host (include/uapi/linux/bpf.h, "bpf_get_current_ancestor_cgroup_id").
 *
 * Per call: the tracepoints sys_enter / sys_exit (include/trace/events/syscalls.h: TP_PROTO(struct pt_regs
 * *regs, long id) and (regs, long ret)), the cheapest syscall hooks and the same on every architecture. The
 * entry time stamp lives in task-local storage (BPF_MAP_TYPE_TASK_STORAGE, usable from tracing programs
 * since Linux 5.11): no hash entry is inserted and deleted per call. Counters are atomic adds on an
 * mmap-able array the loader reads without a system call; min and max are exact (compare-and-swap,
 * -mcpu=v3, Linux 5.12+).
 *
 * Per file: the calls on files (regular files and devices; not directories, whose records would spend the
 * cap on what the import system and directory walks open) also go to the file's record in `files`,
 * found from the call's fd through the task's fd table (the open file description, struct file), which
 * open_files maps to a record; a description not seen yet gets its path from its dentry (resolve()).
 * Offsets for the access pattern: the call's own (pread64, preadv*, pwrite64, pwritev*), else the file
 * position (f_pos) at entry. A task's last description and record are kept in its task storage, so a
 * run of calls on one file costs no map lookup.
 *
 * Programs on syscalls are tp_btf (BTF-typed raw tracepoints, Linux 5.5+): pt_regs is read directly.
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

/* Files one by one, then (last) every file past the cap summed. IOB_FILES + 1 entries: the loader takes the
 * cap from this map's size. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, IOB_FILES + 1);
	__type(key, __u32);
	__type(value, struct iob_file);
} files SEC(".maps");

struct path_key {
	char path[IOB_PATH];
};

/* path -> its record in `files`: one record per path, however often and by whom it is opened. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, IOB_FILES);
	__type(key, struct path_key);
	__type(value, __u32);
} file_of_path SEC(".maps");

/* The paths past the cap, only to count them once each. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct path_key);
	__type(value, __u8);
} other_paths SEC(".maps");

/* An open file (struct file, the kernel's open file description) -> its record. Keyed by the description,
 * not by (process, fd): a forked child's and a dup'ed fd's calls land on the file opened before, and a
 * file opened before the probe started is found at its first call. A description freed and reused for
 * another file is told by its inode. LRU: descriptions closed long ago fall out by themselves. `next` is
 * the access pattern's "previous end" (iobatch.h), per description so concurrent readers of one file keep
 * their own. */
struct open_file {
	__u64 inode;
	__u32 file;     /* record index + 1; 0: not a file kept (socket, pipe, anonymous inode, directory) */
	__u32 pad;
	__u64 next[2];  /* end of this description's previous read, write plus one (0: none yet) */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct open_file);
} open_files SEC(".maps");

#define IOB_DEPTH 32    /* path components and mount crossings walked up from a file */
#define IOB_NAME 256    /* NAME_MAX + 1 */

/* Per-CPU room for building one path. */
struct scratch {
	struct path_key key;
	char spill[IOB_NAME];                 /* a last component may run past IOB_PATH before it is cut */
	__u64 names[IOB_DEPTH];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

/* The call in flight: its type + 1 (0: none), its entry time, its file (record index + 1, 0: none), its
 * open file description and the offset it starts at. `last_*`: the file description this task used last,
 * to skip the open_files lookup when it is used again (checked against the fd table on every call). */
struct entry {
	__u64 ts;
	__u64 offset;
	__u64 desc;
	__u32 call;
	__u32 file;
	__u64 last_desc;
	__u64 last_inode;
	__u32 last_file;
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

#define POSITIONED 0x10   /* call_of: the call names its offset (4th argument); -1 for p*v2 means "the position" */

/* The call type of syscall `id` (| POSITIONED), or -1 when it is not watched. The numbers are the build's
 * architecture's (<asm/unistd.h>); arm64 has no open or creat. */
static __always_inline int call_of(long id)
{
	switch (id) {
	case __NR_read: case __NR_readv:
		return CALL_READ;
	case __NR_pread64: case __NR_preadv: case __NR_preadv2:
		return CALL_READ | POSITIONED;
	case __NR_write: case __NR_writev:
		return CALL_WRITE;
	case __NR_pwrite64: case __NR_pwritev: case __NR_pwritev2:
		return CALL_WRITE | POSITIONED;
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

/* Whether it stored `value` (the new maximum). */
static __always_inline int store_max(__u64 *slot, __u64 value)
{
	for (int i = 0; i < 8; i++) {
		__u64 seen = *(volatile __u64 *)slot;
		if (seen >= value)
			return 0;
		if (__sync_val_compare_and_swap(slot, seen, value) == seen)
			return 1;
	}
	return 0;
}

/* The open file description (struct file) behind descriptor `fd` of the current task, 0 for none:
 * task->files->fdt->fd[fd] (include/linux/fdtable.h). The fd table is read under the RCU read lock every
 * tracing program runs in. */
static __always_inline __u64 desc_of(long fd)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct fdtable *fdt = task->files->fdt;
	if (fd < 0 || !fdt || fd >= fdt->max_fds)
		return 0;
	__u64 desc = 0;
	bpf_probe_read_kernel(&desc, sizeof(desc), &fdt->fd[fd]);
	return desc;
}

#define IOB_S_IFMT 0170000   /* include/uapi/linux/stat.h */
#define IOB_S_IFREG 0100000
#define IOB_S_IFBLK 0060000
#define IOB_S_IFCHR 0020000

/* A path being built. bpf_loop (Linux 5.17+, include/uapi/linux/bpf.h): the verifier checks each step once;
 * the same walk as an unrolled loop is past its million-instruction limit. */
struct walk {
	struct scratch *b;
	struct path root;
	struct dentry *d;
	struct vfsmount *vm;
	struct mount *m;
	__u32 n;        /* names collected, the file's own first */
	__u32 whole;    /* the walk reached the root */
	__u32 off;      /* bytes of the path written */
	__u32 cut;      /* names left out: the path is longer than IOB_PATH - 1 bytes */
};

/* One step up from w->d: its name, or from the top of a mount to where it is mounted (fs/d_path.c). */
static long walk_up(__u32 i, void *ctx)
{
	struct walk *w = ctx;
	/* locals: BPF_CORE_READ relocates every access in its argument, and struct walk is not the kernel's */
	struct dentry *d = w->d;
	struct vfsmount *vm = w->vm;
	struct mount *m = w->m;
	if (d == w->root.dentry && vm == w->root.mnt) {
		w->whole = 1;
		return 1;
	}
	struct dentry *parent = BPF_CORE_READ(d, d_parent);
	if (d == BPF_CORE_READ(vm, mnt_root) || d == parent) {
		struct mount *up = BPF_CORE_READ(m, mnt_parent);
		if (up == m) {
			w->whole = 1;
			return 1;
		}
		w->d = BPF_CORE_READ(m, mnt_mountpoint);
		w->m = up;
		w->vm = (void *)up + bpf_core_field_offset(struct mount, mnt);
		return 0;
	}
	w->b->names[w->n & (IOB_DEPTH - 1)] = (__u64)BPF_CORE_READ(d, d_name.name);
	w->n++;
	w->d = parent;
	return 0;
}

/* The names collected, root first, each after a '/'. */
static long write_down(__u32 i, void *ctx)
{
	struct walk *w = ctx;
	if (i >= w->n)
		return 1;
	if (w->off >= IOB_PATH - 1) {
		w->cut = 1;
		return 1;
	}
	struct scratch *b = w->b;
	b->key.path[w->off & (IOB_PATH - 1)] = '/';
	w->off++;
	long len = bpf_probe_read_kernel_str(&b->key.path[w->off & (IOB_PATH - 1)], IOB_NAME,
					     (void *)b->names[(w->n - 1 - i) & (IOB_DEPTH - 1)]);
	if (len > 1)
		w->off += len - 1;
	return 0;
}

/* The record of a file description not seen before: its path (as d_path() gives it: walked up from its
 * dentry to the opening task's root, crossing mounts, fs/d_path.c), then the path's record, a new one
 * while fewer than IOB_FILES are handed out, else the last ("other files"). 0 for what is not a file
 * kept: sockets, pipes, anonymous inodes, directories. A path deeper than IOB_DEPTH steps starts with "..."
 * (its head is unknown); a longer one than IOB_PATH keeps its head; either marks its record `cut`. */
__noinline __u32 resolve(__u64 desc, __u64 inode)   /* global: verified once, on its own */
{
	__u32 mode = BPF_CORE_READ((struct inode *)inode, i_mode) & IOB_S_IFMT;
	if (mode != IOB_S_IFREG && mode != IOB_S_IFBLK && mode != IOB_S_IFCHR)
		return 0;
	__u32 zero = 0;
	struct scratch *b = bpf_map_lookup_elem(&scratch, &zero);
	struct iob_state *st = get_state();
	if (!b || !st)
		return 0;
	__builtin_memset(&b->key, 0, sizeof(b->key));
	struct path at = {};
	struct walk w = {.b = b};
	BPF_CORE_READ_INTO(&at, (struct file *)desc, f_path);
	BPF_CORE_READ_INTO(&w.root, bpf_get_current_task_btf(), fs, root);
	w.d = at.dentry;
	w.vm = at.mnt;
	w.m = (void *)w.vm - bpf_core_field_offset(struct mount, mnt);
	bpf_loop(IOB_DEPTH, walk_up, &w, 0);
	if (!w.whole) {
		b->key.path[0] = b->key.path[1] = b->key.path[2] = '.';
		w.off = 3;
	}
	bpf_loop(IOB_DEPTH, write_down, &w, 0);
	__u32 off = w.off;
	if (off == 0)
		b->key.path[off++] = '/';
	if (off > IOB_PATH - 1) {   /* the last name ran on into spill */
		off = IOB_PATH - 1;
		w.cut = 1;
	}
	b->key.path[off & (IOB_PATH - 1)] = 0;

	__u32 *known = bpf_map_lookup_elem(&file_of_path, &b->key);
	if (known)
		return *known + 1;
	__u64 next = __sync_fetch_and_add(&st->files, 1);
	if (next < IOB_FILES) {
		__u32 index = next;
		if (bpf_map_update_elem(&file_of_path, &b->key, &index, BPF_NOEXIST) == 0) {
			struct iob_file *rec = bpf_map_lookup_elem(&files, &index);
			if (rec) {
				bpf_probe_read_kernel(rec->path, IOB_PATH, b->key.path);
				rec->cut = w.cut || !w.whole;
			}
			return index + 1;
		}
		known = bpf_map_lookup_elem(&file_of_path, &b->key);   /* another CPU added the same path just now */
		if (known)
			return *known + 1;
	}
	__u8 one = 1;
	if (bpf_map_update_elem(&other_paths, &b->key, &one, BPF_NOEXIST) == 0)
		__sync_fetch_and_add(&st->other_files, 1);
	else if (!bpf_map_lookup_elem(&other_paths, &b->key))
		__sync_fetch_and_add(&st->other_lost, 1);
	return IOB_FILES + 1;
}

/* The record (index + 1, 0: none) of file description `desc`, from the task's last one, open_files, or
 * resolved now. `opened`: the description was just made by an open, so none of its calls were seen yet. */
static __always_inline __u32 file_of(struct entry *e, __u64 desc, int opened)
{
	__u64 inode = (__u64)BPF_CORE_READ((struct file *)desc, f_inode);
	if (!opened && desc == e->last_desc && inode == e->last_inode)
		return e->last_file;
	struct open_file *known = bpf_map_lookup_elem(&open_files, &desc);
	__u32 file;
	if (known && known->inode == inode) {
		file = known->file;
		if (opened)   /* a freed description's memory reused for the same file: no previous access */
			known->next[0] = known->next[1] = 0;
	} else {
		struct open_file fresh = {.inode = inode, .file = resolve(desc, inode)};
		bpf_map_update_elem(&open_files, &desc, &fresh, BPF_ANY);
		file = fresh.file;
	}
	e->last_desc = desc;
	e->last_inode = inode;
	e->last_file = file;
	return file;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(iob_sys_enter, struct pt_regs *regs, long id)
{
	int what = call_of(id);
	if (what < 0)
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
	int call = what & ~POSITIONED;
	e->file = 0;
	if (call != CALL_OPEN) {   /* an open's file is known at its exit */
		__u64 desc = desc_of((int)PT_REGS_PARM1_SYSCALL(regs));
		e->desc = desc;
		if (desc)
			e->file = file_of(e, desc, 0);
		if (e->file && (call == CALL_READ || call == CALL_WRITE)) {
			long pos = (what & POSITIONED) ? (long)PT_REGS_PARM4_SYSCALL(regs) : -1;
			if (pos < 0)   /* read, write, readv, writev; p*v2 with offset -1 */
				pos = BPF_CORE_READ((struct file *)desc, f_pos);
			e->offset = pos;
		}
	}
	e->call = call + 1;
	e->ts = bpf_ktime_get_ns();
	return 0;
}

/* file_add's `how`: the call type, FAILED when it returned an error, and the record index from bit 16 (a
 * subprogram takes at most 5 arguments). */
#define FAILED 0x100
#define INDEX_SHIFT 16
_Static_assert(IOB_FILES + 1 < (1 << (32 - INDEX_SHIFT)), "a record index fits file_add's how");

/* One finished call on open file description `desc` whose record is in `how`: its figures, and for reads
 * and writes the access pattern. A global function: the verifier checks it once, on its own, not again in
 * every state of its caller. */
__noinline int file_add(__u64 desc, __u32 how, __u64 lat, __u64 nbytes, __u64 offset)
{
	__u32 call = how & 0xff;
	__u32 index = how >> INDEX_SHIFT;
	struct iob_file *rec = bpf_map_lookup_elem(&files, &index);
	if (!rec || call >= IOB_CALLS)
		return 0;
	struct iob_file_call *c = &rec->calls[call];
	__sync_fetch_and_add(&c->count, 1);
	__sync_fetch_and_add(&c->bytes, nbytes);
	__sync_fetch_and_add(&c->total_ns, lat);
	store_min(&c->min_ns, lat);
	if (store_max(&c->max_ns, lat))
		c->max_bytes = nbytes;   /* as in the cells: either racing call's size (iobatch.h) */
	if ((call != CALL_READ && call != CALL_WRITE) || (how & FAILED) || index >= IOB_FILES)
		return 0;   /* the summed record of many files has no access pattern */
	struct open_file *of = bpf_map_lookup_elem(&open_files, &desc);
	if (of && of->file == index + 1) {   /* else the description fell out of the LRU map: no previous */
		__u64 previous = of->next[call];
		if (previous) {
			if (offset >= previous - 1)
				__sync_fetch_and_add(&rec->sequential[call], 1);
			if (offset == previous - 1)
				__sync_fetch_and_add(&rec->consecutive[call], 1);
		}
		of->next[call] = offset + nbytes + 1;
	}
	__u64 want = nbytes + 1;
	for (int s = 0; s < IOB_ACCESS; s++) {
		__u64 have = rec->access_size[s];
		if (!have) {
			have = __sync_val_compare_and_swap(&rec->access_size[s], 0, want);
			if (!have)
				have = want;
		}
		if (have == want) {
			__sync_fetch_and_add(&rec->access_count[s], 1);
			return 0;
		}
	}
	__sync_fetch_and_add(&rec->access_other, 1);
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(iob_sys_exit, struct pt_regs *regs, long ret)
{
	/* This runs at the end of every system call on the machine: the task's own storage says at once whether
	 * a watched call is in flight (sys_enter set it only for a selected task), so other tasks pay one lookup,
	 * not a clock read and a walk of their cgroup's ancestors. The clock is read right after it. */
	struct entry *e = bpf_task_storage_get(&entries, bpf_get_current_task_btf(), 0, 0);
	if (!e || !e->call)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u32 call = e->call - 1;
	__u64 lat = now - e->ts;
	e->call = 0;
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
	if (store_max(&cell->max_ns, lat))
		cell->max_bytes = nbytes;   /* not atomic with max_ns: two slowest-yet calls racing on one cell can
					     * leave the size of the other; a size class holds sizes within 2x */
	__u32 file = e->file;
	__u64 desc = e->desc;
	if (call == CALL_OPEN && ret >= 0) {
		desc = desc_of(ret);
		if (desc)
			file = file_of(e, desc, 1);
	}
	if (file)
		file_add(desc, call | (ret < 0 ? FAILED : 0) | ((file - 1) << INDEX_SHIFT), lat, nbytes, e->offset);
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

/* Requests issued to the scratch disk (include/trace/events/block.h, block_rq_issue: dev, sector, nr_sector,
 * rwbs), for AWS's HDD accounting (st1/sc1 merge sequential I/O into 1 MiB units and charge a random one under
 * 1 MiB as a whole unit): a request is sequential when it starts at the sector where the previous one issued
 * to the disk ended. The previous end is swapped atomically, so requests issued at once on several CPUs are
 * ordered as the swaps were. Reads and writes only: no flushes (no sectors) or discards. */
SEC("tp/block/block_rq_issue")
int iob_block_issue(struct trace_event_raw_block_rq *ctx)
{
	struct iob_state *st = get_state();
	if (!st || !st->block_dev || BPF_CORE_READ(ctx, dev) != st->block_dev)
		return 0;
	__u64 sectors = BPF_CORE_READ(ctx, nr_sector);
	char rwbs[4] = {};
	bpf_core_read(rwbs, sizeof(rwbs), &ctx->rwbs);
	int data = 0;
	for (int i = 0; i < 3; i++) {    /* 'F' (a flush first) may come before the 'R' or 'W' */
		if (rwbs[i] == 'D')
			return 0;
		if (rwbs[i] == 'R' || rwbs[i] == 'W')
			data = 1;
	}
	if (!sectors || !data)
		return 0;
	__u64 sector = BPF_CORE_READ(ctx, sector);
	__u64 before = __sync_lock_test_and_set(&st->block_next, sector + sectors + 1);
	if (before == sector + 1) {
		__sync_fetch_and_add(&st->block_seq_bytes, sectors * 512);
	} else {
		__sync_fetch_and_add(&st->block_random_bytes, sectors * 512);
		__sync_fetch_and_add(&st->block_random_ios, 1);
	}
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
