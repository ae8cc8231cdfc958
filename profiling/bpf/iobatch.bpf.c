// SPDX-License-Identifier: GPL-2.0
/* Per-call figures of the selected cgroups' processes: the read, write, open, close and fsync families, plus the
 * time writers were paused in balance_dirty_pages, the pages they dirtied and the bytes they moved on sockets.
 *
 * One copy per host. The programs are loaded and attached once and shared by every profiler on the host
 * (profiling/probes/ebpf_host.py pins them in bpffs): each profiler takes a slot, puts its own maps (state,
 * cells, files, ...) at that slot of the slot_* maps of maps, and adds its child's cgroup to `selection`
 * (cgroup v2 id -> slot). A call is counted in the slot of the first selected cgroup among the caller's
 * ancestors, at the depths some selection uses (iob_host.levels), so a pid namespace does not matter and
 * forked children are counted from their first call: a child inherits its parent's cgroup.
 * bpf_get_current_ancestor_cgroup_id() reads the default (v2) hierarchy, which exists beside v1 on a hybrid
 * host (include/uapi/linux/bpf.h, "bpf_get_current_ancestor_cgroup_id").
 *
 * Per call: fentry/fexit (BPF trampolines, Linux 5.5+) on the watched system calls' own entry points
 * (__x64_sys_read ...; SYSCALL_DEFINE's wrappers, arch/x86/include/asm/syscall_wrapper.h), so only those
 * calls run a program: every other system call on the host runs nothing of ours, and a watched call of a
 * process nobody selected pays the selection lookup only. One entry per system call: the counts are exact
 * for any binary, static ones included. The entry time stamp lives in task-local storage
 * (BPF_MAP_TYPE_TASK_STORAGE, usable from tracing programs since Linux 5.11): no hash entry is inserted and
 * deleted per call. Counters are atomic adds on mmap-able arrays the profiler reads without a system call;
 * min and max are exact (compare-and-swap, -mcpu=v3, Linux 5.12+).
 *
 * Per file: the calls on files (regular files and devices; not directories, whose records would spend the
 * cap on what the import system and directory walks open) also go to the file's record in the slot's
 * `files`, found from the call's fd through the task's fd table (the open file description, struct file),
 * which open_files maps to a record; a description not seen yet gets its path from its dentry (resolve()).
 * Offsets for the access pattern: the call's own (pread64, preadv*, pwrite64, pwritev*), else the file
 * position (f_pos) at entry. A task's last description and record are kept in its task storage, so a
 * run of calls on one file costs no map lookup.
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

/* A slot's own maps: the profiler that takes the slot makes them (the same shapes as these templates) and
 * puts them at its slot of the slot_* maps of maps, so each profiler reads only its own figures, their memory
 * is charged to it, and it frees them when it leaves. Their values are sized, not typed: the profiler's maps
 * carry no BTF, and Linux 6.1 refuses an inner map whose value BTF differs from the template's (a struct value
 * there made the insert fail with EINVAL on Debian's 6.1.0-56; 6.18 takes it). */
struct cells_map {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, IOB_CELLS);
	__type(key, __u32);
	__uint(value_size, sizeof(struct iob_cell));
};

struct state_map {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__uint(value_size, sizeof(struct iob_state));
};

struct task_pause_map {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, IOB_TASKS);
	__type(key, __u32);
	__uint(value_size, sizeof(struct iob_task_pause));
};

/* Files one by one, then (last) every file past the cap summed. IOB_FILES + 1 entries: the loader takes the
 * cap from this map's size. */
struct files_map {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, IOB_FILES + 1);
	__type(key, __u32);
	__uint(value_size, sizeof(struct iob_file));
};

struct path_key {
	char path[IOB_PATH];
};

/* path -> its record in `files`: one record per path, however often and by whom it is opened. */
struct file_of_path_map {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, IOB_FILES);
	__type(key, struct path_key);
	__type(value, __u32);
};

/* The paths past the cap, only to count them once each. */
struct other_paths_map {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, IOB_OTHER_PATHS);
	__type(key, struct path_key);
	__type(value, __u8);
};

#define SLOT_MAPS(name, inner) \
	struct { \
		__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS); \
		__uint(max_entries, IOB_SLOTS); \
		__type(key, __u32); \
		__array(values, struct inner); \
	} name SEC(".maps")

SLOT_MAPS(slot_cells, cells_map);
SLOT_MAPS(slot_state, state_map);
SLOT_MAPS(slot_task_pause, task_pause_map);
SLOT_MAPS(slot_files, files_map);
SLOT_MAPS(slot_file_of_path, file_of_path_map);
SLOT_MAPS(slot_other_paths, other_paths_map);

/* The selected cgroups: cgroup v2 id -> whose slot. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, IOB_SLOTS);
	__type(key, __u64);
	__type(value, struct iob_select);
} selection SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct iob_host);
} host SEC(".maps");

/* The disks whose requests are classed: the kernel's dev_t -> counts. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, IOB_DISKS);
	__type(key, __u64);
	__type(value, struct iob_disk);
} disks SEC(".maps");

/* An open file (struct file, the kernel's open file description) -> its record. Keyed by the description,
 * not by (process, fd): a forked child's and a dup'ed fd's calls land on the file opened before, and a
 * file opened before the probe started is found at its first call. A description freed and reused for
 * another file is told by its inode. LRU: descriptions closed long ago fall out by themselves. `next` is
 * the access pattern's "previous end" (iobatch.h), per description so concurrent readers of one file keep
 * their own. The record is that of a slot: a description whose calls come from another slot's task is
 * resolved again (a file shared by two profilers' children is counted in the slot of each call's caller). */
struct open_file {
	__u64 inode;
	__u32 file;     /* record index + 1; 0: not a file kept (socket, pipe, anonymous inode, directory) */
	__u32 slot;     /* whose record `file` is */
	__u64 next[2];  /* end of this description's previous read, write plus one (0: none yet) */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
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

/* The call in flight: its type + 1 (0: none), its slot, its entry time, its file (record index + 1, 0: none),
 * its open file description and the offset it starts at. `last_*`: the file description this task used
 * last, to skip the open_files lookup when it is used again (checked against the fd table on every call). */
struct entry {
	__u64 ts;
	__u64 offset;
	__u64 desc;
	__u32 call;
	__u32 file;
	__u64 last_desc;
	__u64 last_inode;
	__u32 last_file;
	__u32 last_slot;
	__u32 slot;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct entry);
} entries SEC(".maps");

/* Slot `slot`'s entry `key` of maps of maps `outer` (NULL when the slot is free). */
static __always_inline void *slot_lookup(void *outer, __u32 slot, __u32 key)
{
	void *inner = bpf_map_lookup_elem(outer, &slot);
	if (!inner)
		return NULL;
	return bpf_map_lookup_elem(inner, &key);
}

static __always_inline struct iob_state *get_state(__u32 slot)
{
	return slot_lookup(&slot_state, slot, 0);
}

#define POSITIONED 0x10   /* the call names its offset (4th argument); -1 for p*v2 means "the position" */

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

#define IOB_LEVELS 16   /* cgroup depths looked at (the v2 hierarchy of a container host is a few deep) */

/* The selection of the current task: that of its first selected ancestor cgroup (itself included), at the
 * depths some selection uses; NULL when none selects it, or it is the selection's excluded process. */
static __always_inline struct iob_select *select_current(void)
{
	__u32 zero = 0;
	struct iob_host *h = bpf_map_lookup_elem(&host, &zero);
	if (!h)
		return NULL;
	__u64 levels = h->levels;
	for (int level = 0; level < IOB_LEVELS; level++) {
		if (!(levels >> level))
			break;
		if (!((levels >> level) & 1))
			continue;
		__u64 id = bpf_get_current_ancestor_cgroup_id(level);
		struct iob_select *sel = bpf_map_lookup_elem(&selection, &id);
		if (!sel)
			continue;
		if (sel->exclude_tgid && (bpf_get_current_pid_tgid() >> 32) == sel->exclude_tgid)
			return NULL;
		return sel;
	}
	return NULL;
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
__noinline __u32 resolve(__u64 desc, __u64 inode, __u32 slot)   /* global: verified once, on its own */
{
	__u32 mode = BPF_CORE_READ((struct inode *)inode, i_mode) & IOB_S_IFMT;
	if (mode != IOB_S_IFREG && mode != IOB_S_IFBLK && mode != IOB_S_IFCHR)
		return 0;
	__u32 zero = 0;
	struct scratch *b = bpf_map_lookup_elem(&scratch, &zero);
	struct iob_state *st = get_state(slot);
	void *file_of_path = bpf_map_lookup_elem(&slot_file_of_path, &slot);
	void *other_paths = bpf_map_lookup_elem(&slot_other_paths, &slot);
	void *files = bpf_map_lookup_elem(&slot_files, &slot);
	if (!b || !st || !file_of_path || !other_paths || !files)
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

	__u32 *known = bpf_map_lookup_elem(file_of_path, &b->key);
	if (known)
		return *known + 1;
	__u64 next = __sync_fetch_and_add(&st->files, 1);
	if (next < IOB_FILES) {
		__u32 index = next;
		if (bpf_map_update_elem(file_of_path, &b->key, &index, BPF_NOEXIST) == 0) {
			struct iob_file *rec = bpf_map_lookup_elem(files, &index);
			if (rec) {
				bpf_probe_read_kernel(rec->path, IOB_PATH, b->key.path);
				rec->cut = w.cut || !w.whole;
			}
			return index + 1;
		}
		known = bpf_map_lookup_elem(file_of_path, &b->key);   /* another CPU added the same path just now */
		if (known)
			return *known + 1;
	}
	__u8 one = 1;
	if (bpf_map_update_elem(other_paths, &b->key, &one, BPF_NOEXIST) == 0)
		__sync_fetch_and_add(&st->other_files, 1);
	else if (!bpf_map_lookup_elem(other_paths, &b->key))
		__sync_fetch_and_add(&st->other_lost, 1);
	return IOB_FILES + 1;
}

/* The record (index + 1, 0: none) of file description `desc`, from the task's last one, open_files, or
 * resolved now. `opened`: the description was just made by an open, so none of its calls were seen yet. */
static __always_inline __u32 file_of(struct entry *e, __u64 desc, int opened)
{
	__u64 inode = (__u64)BPF_CORE_READ((struct file *)desc, f_inode);
	__u32 slot = e->slot;
	if (!opened && desc == e->last_desc && inode == e->last_inode && slot == e->last_slot)
		return e->last_file;
	struct open_file *known = bpf_map_lookup_elem(&open_files, &desc);
	__u32 file;
	if (known && known->inode == inode && known->slot == slot) {
		file = known->file;
		if (opened)   /* a freed description's memory reused for the same file: no previous access */
			known->next[0] = known->next[1] = 0;
	} else {
		struct open_file fresh = {.inode = inode, .file = resolve(desc, inode, slot), .slot = slot};
		bpf_map_update_elem(&open_files, &desc, &fresh, BPF_ANY);
		file = fresh.file;
	}
	e->last_desc = desc;
	e->last_inode = inode;
	e->last_file = file;
	e->last_slot = slot;
	return file;
}

/* A watched call's entry (`what`: its call type | POSITIONED; `fd` and `pos`: its first and fourth arguments).
 * A global function: verified once per program, on its own. */
__noinline int enter(__u32 what, long fd, long pos)
{
	struct iob_select *sel = select_current();
	if (!sel)
		return 0;
	__u32 slot = sel->slot;
	struct entry *e = bpf_task_storage_get(&entries, bpf_get_current_task_btf(), 0,
					       BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!e) {
		struct iob_state *st = get_state(slot);
		if (st)
			__sync_fetch_and_add(&st->missed, 1);
		return 0;
	}
	__u32 call = what & ~POSITIONED;
	e->slot = slot;
	e->file = 0;
	if (call != CALL_OPEN) {   /* an open's file is known at its exit */
		__u64 desc = desc_of(fd);
		e->desc = desc;
		if (desc)
			e->file = file_of(e, desc, 0);
		if (e->file && (call == CALL_READ || call == CALL_WRITE)) {
			if (!(what & POSITIONED) || pos < 0)   /* read, write, readv, writev; p*v2 with offset -1 */
				pos = BPF_CORE_READ((struct file *)desc, f_pos);
			e->offset = pos;
		}
	}
	e->call = call + 1;
	e->ts = bpf_ktime_get_ns();
	return 0;
}

/* file_add's `how`: the call type, FAILED when it returned an error, the slot from bit 9 and the record index
 * from bit 16 (a subprogram takes at most 5 arguments). */
#define FAILED 0x100
#define SLOT_SHIFT 9
#define INDEX_SHIFT 16
_Static_assert(IOB_FILES + 1 < (1 << (32 - INDEX_SHIFT)), "a record index fits file_add's how");
_Static_assert(IOB_SLOTS <= (1 << (INDEX_SHIFT - SLOT_SHIFT)), "a slot fits file_add's how");

/* One finished call on open file description `desc` whose record is in `how`: its figures, and for reads
 * and writes the access pattern. A global function: the verifier checks it once, on its own, not again in
 * every state of its caller. */
__noinline int file_add(__u64 desc, __u32 how, __u64 lat, __u64 nbytes, __u64 offset)
{
	__u32 call = how & 0xff;
	__u32 slot = (how >> SLOT_SHIFT) & (IOB_SLOTS - 1);
	__u32 index = how >> INDEX_SHIFT;
	struct iob_file *rec = slot_lookup(&slot_files, slot, index);
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

/* A watched call's exit (`ret`: what it returned). The task's own storage says at once whether a call is in
 * flight (enter() set it only for a selected task), so other tasks pay one lookup, not a clock read and a walk
 * of their cgroup's ancestors. The clock is read right after it. */
__noinline int leave(long ret)
{
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
	__u32 slot = e->slot & (IOB_SLOTS - 1);
	struct iob_cell *cell = slot_lookup(&slot_cells, slot, index);
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
		file_add(desc, call | (ret < 0 ? FAILED : 0) | (slot << SLOT_SHIFT) | ((file - 1) << INDEX_SHIFT), lat,
			 nbytes, e->offset);
	return 0;
}

/* The watched system calls (the build's architecture's wrappers; arm64 has no open or creat). */
#if defined(__TARGET_ARCH_x86)
#define SYS(name) "__x64_sys_" #name
#elif defined(__TARGET_ARCH_arm64)
#define SYS(name) "__arm64_sys_" #name
#endif

#define WATCH(name, what) \
	SEC("fentry/" SYS(name)) \
	int BPF_PROG(iob_in_##name, struct pt_regs *regs) \
	{ \
		return enter((what), (long)PT_REGS_PARM1_SYSCALL(regs), (long)PT_REGS_PARM4_SYSCALL(regs)); \
	} \
	SEC("fexit/" SYS(name)) \
	int BPF_PROG(iob_out_##name, struct pt_regs *regs, long ret) \
	{ \
		return leave(ret); \
	}

WATCH(read, CALL_READ)
WATCH(readv, CALL_READ)
WATCH(pread64, CALL_READ | POSITIONED)
WATCH(preadv, CALL_READ | POSITIONED)
WATCH(preadv2, CALL_READ | POSITIONED)
WATCH(write, CALL_WRITE)
WATCH(writev, CALL_WRITE)
WATCH(pwrite64, CALL_WRITE | POSITIONED)
WATCH(pwritev, CALL_WRITE | POSITIONED)
WATCH(pwritev2, CALL_WRITE | POSITIONED)
#ifdef __TARGET_ARCH_x86
WATCH(open, CALL_OPEN)
WATCH(creat, CALL_OPEN)
#endif
WATCH(openat, CALL_OPEN)
WATCH(openat2, CALL_OPEN)
WATCH(close, CALL_CLOSE)
WATCH(fsync, CALL_FSYNC)
WATCH(fdatasync, CALL_FSYNC)

/* Where the kernel refuses fentry (a kernel built without BPF trampolines, or one whose security policy forbids
 * them: the loader learns it when loading fails), the same figures from the raw syscall tracepoints
 * (include/trace/events/syscalls.h: TP_PROTO(struct pt_regs *regs, long id) and (regs, long ret)): every
 * system call on the host then runs these two programs, once per host, whoever is selected. */
SEC("tp_btf/sys_enter")
int BPF_PROG(iob_sys_enter, struct pt_regs *regs, long id)
{
	int what = call_of(id);
	if (what < 0)
		return 0;
	return enter(what, (long)PT_REGS_PARM1_SYSCALL(regs), (long)PT_REGS_PARM4_SYSCALL(regs));
}

SEC("tp_btf/sys_exit")
int BPF_PROG(iob_sys_exit, struct pt_regs *regs, long ret)
{
	if (call_of(regs->orig_ax) < 0)   /* the call's number (x86: arch/x86/entry/common.c keeps it in orig_ax) */
		return 0;                  /* most system calls of the host: not watched, no storage lookup */
	return leave(ret);
}

/* Dirty-page throttling (mm/page-writeback.c): the trace point fires just before the writer sleeps for
 * `pause` ms (include/trace/events/writeback.h converts jiffies to ms); pause <= 0 means no sleep. */
SEC("tp/writeback/balance_dirty_pages")
int iob_dirty_pause(struct trace_event_raw_balance_dirty_pages *ctx)
{
	long pause = BPF_CORE_READ(ctx, pause);
	if (pause <= 0)
		return 0;
	struct iob_select *sel = select_current();
	if (!sel)
		return 0;
	__u32 slot = sel->slot;
	struct iob_state *st = get_state(slot);
	void *task_pause = bpf_map_lookup_elem(&slot_task_pause, &slot);
	if (!st || !task_pause)
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
	struct iob_task_pause *tp = bpf_map_lookup_elem(task_pause, &tid);
	if (!tp) {
		struct iob_task_pause fresh = {};
		bpf_get_current_comm(fresh.comm, sizeof(fresh.comm));
		bpf_map_update_elem(task_pause, &tid, &fresh, BPF_NOEXIST);
		tp = bpf_map_lookup_elem(task_pause, &tid);
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
	__u64 dev = BPF_CORE_READ(ctx, dev);
	struct iob_disk *disk = bpf_map_lookup_elem(&disks, &dev);
	if (!disk)
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
	__u64 before = __sync_lock_test_and_set(&disk->next, sector + sectors + 1);
	if (before == sector + 1) {
		__sync_fetch_and_add(&disk->seq_bytes, sectors * 512);
	} else {
		__sync_fetch_and_add(&disk->random_bytes, sectors * 512);
		__sync_fetch_and_add(&disk->random_ios, 1);
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
	struct iob_select *sel = select_current();
	struct iob_state *st = sel ? get_state(sel->slot) : NULL;
	if (!st)
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
	if (ret <= 0)
		return 0;
	struct iob_select *sel = select_current();
	struct iob_state *st = sel ? get_state(sel->slot) : NULL;
	if (st)
		__sync_fetch_and_add(&st->sock_sent, ret);
	return 0;
}

#define IOB_MSG_PEEK 2

SEC("raw_tp/sock_recv_length")
int iob_sock_recv(struct bpf_raw_tracepoint_args *ctx)
{
	int ret = (int)ctx->args[1];
	int flags = (int)ctx->args[2];
	if (ret <= 0 || (flags & IOB_MSG_PEEK))
		return 0;
	struct iob_select *sel = select_current();
	struct iob_state *st = sel ? get_state(sel->slot) : NULL;
	if (st)
		__sync_fetch_and_add(&st->sock_received, ret);
	return 0;
}

/* The task finder: the thread-group leader whose pid in the pid namespace find_ns_inum is find_pid. */
SEC("iter/task")
int iob_find_task(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	__u32 zero = 0;
	struct iob_host *st = bpf_map_lookup_elem(&host, &zero);
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
