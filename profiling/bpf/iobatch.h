/* The layout the CO-RE program (iobatch.bpf.c) and its Python loader (profiling/probes/ebpf_maps.py) share.
 * This header owns it; tests/unit/test_ebpf_maps.py checks the Python copy against these lines. */
#ifndef IOBATCH_H
#define IOBATCH_H

#define IOB_CALLS 5        /* read, write, open, close, fsync: profiling.probes.callstats.CALLS, in order */
#define IOB_SIZES 48       /* size class k = bit length of the bytes a read or write moved (0..47) */
#define IOB_HIST 48        /* latency bucket h holds calls that took [2^h, 2^(h+1)) ns (bucket 0 also 0 ns) */
#define IOB_CELLS (IOB_CALLS * IOB_SIZES)   /* cell index = call * IOB_SIZES + size class (0 for open/close/fsync) */
#define IOB_SLOTS 128      /* profilers sharing the host's programs at once (a slot index fits 7 bits) */
#define IOB_DISKS 64       /* disks whose requests are classed at once */
#define IOB_TASKS 1024     /* tasks whose dirty-throttle pause is kept one by one */
#define IOB_FILES 4096     /* files kept one by one (the `files` array holds one more: all later files summed);
			    * the loader reads this cap from the object (the map's size), nowhere else. Directories
			    * get no record: the cap is for files that hold data */
#define IOB_OTHER_PATHS 65536  /* paths past the cap told apart (to count each once) */
#define IOB_PATH 256       /* bytes of a file's path kept (with its NUL); a longer path keeps its head (`cut`) */
#define IOB_ACCESS 8       /* distinct access sizes counted per file, the first 8 seen (Darshan's ACCESS1-4 are
			    * the top 4 of all sizes; here the top 4 of these 8, the rest in access_other) */

/* One (call type, size class): what the program adds per call. min_ns starts at ~0 (unset). */
struct iob_cell {
	__u64 count;
	__u64 bytes;
	__u64 total_ns;
	__u64 min_ns;
	__u64 max_ns;
	__u64 max_bytes;   /* the bytes the slowest call moved (stored after max_ns, not with it: when two
			    * slowest-yet calls finish at once, the size of either) */
	__u64 hist[IOB_HIST];
};

/* One profiler's job-wide counters (its slot's `state`, written by the program). */
struct iob_state {
	__u64 throttle_ms;      /* pauses in balance_dirty_pages, summed over tasks */
	__u64 throttle_wall_ns; /* time during which at least one task was paused */
	__u64 paused_until_ns;  /* end of the latest pause (to merge overlapping ones) */
	__u64 dirtied_pages;    /* page-cache pages the tasks dirtied (writeback_dirty_folio) */
	__u64 sock_sent;        /* bytes sent on sockets (sock_send_length) */
	__u64 sock_received;    /* bytes received on sockets (sock_recv_length) */
	__u64 missed;           /* calls not timed: no per-task slot for their entry time stamp */
	__u64 files;            /* file records handed out: past IOB_FILES, a file goes to the last record */
	__u64 other_files;      /* distinct files summed in the last record (job-wide: the loader takes a stage's
				 * change) */
	__u64 other_lost;       /* files past the cap not told apart (the set of them was full): other_files is
				 * then a lower bound */
};

/* The host's shared settings (one entry, written by the profilers under the host lock) and the task finder's
 * question and answer. */
struct iob_host {
	__u64 levels;           /* bit L set: some selected cgroup is at depth L of the v2 hierarchy */
	__u64 files_cap;        /* the per-slot `files` maps' cap (IOB_FILES, as the object built it) */
	__u64 find_ns_inum;     /* the task finder's question: a pid in this pid namespace ... */
	__u64 find_pid;         /* ... */
	__u64 found_cgroup_id;  /* its answer, 0: not found */
	__u64 found_cgroup_level;
	__u64 found_tgid;       /* the task's pid in the initial pid namespace */
	__u64 joins;            /* profilers that took a slot so far: the next one looks for a free slot from
				 * here on, round the ring, so a slot is not reused at once (a call in flight when its
				 * profiler left would count in the next owner's slot) */
};

/* A selected cgroup (the key of `selection` is its cgroup v2 id): whose slot its tasks' calls go to. */
struct iob_select {
	__u32 slot;             /* the profiler's slot: its maps in the slot_* maps of maps */
	__u32 level;            /* the cgroup's depth in the v2 hierarchy */
	__u64 exclude_tgid;     /* a process (host pid) inside it whose own calls are not counted; 0: none */
};

/* A disk whose requests are classed (the key of `disks` is the kernel's dev_t, major << 20 | minor, of the
 * whole disk: requests name the disk, not a partition). Device-wide: every request to it, whoever caused it
 * (writeback runs outside the job's cgroup), one entry however many profilers watch the disk. */
struct iob_disk {
	__u64 next;             /* 1 + the sector just past the previous request issued to it (0: none yet) */
	__u64 seq_bytes;        /* bytes of read and write requests that started where the previous request ended */
	__u64 random_bytes;     /* bytes of the other read and write requests */
	__u64 random_ios;       /* how many requests those were */
};

/* One call type on one file. min_ns is stored plus one (0: unset), as in iob_cell; max_bytes as there. */
struct iob_file_call {
	__u64 count;
	__u64 bytes;
	__u64 total_ns;
	__u64 min_ns;
	__u64 max_ns;
	__u64 max_bytes;
};

/* One file (by its path, as the opening process saw it): calls per type, and the access pattern as Darshan
 * counts it per file: a read (write) is sequential when it starts at or after the end of the previous read
 * (write), consecutive when exactly at that end (so consecutive ones are sequential too). "Previous" is that
 * of the same open file description (the program keeps it in open_files), so two processes reading one file
 * at once do not spoil each other's counts; Darshan keeps it per process. Unlike Darshan, whose previous end
 * starts at 0 (a first access above offset 0 counts as sequential), a description's first access counts as
 * neither. Offsets: pread/pwrite/preadv/pwritev's own, else the file position at entry (for an O_APPEND write
 * the end the previous one left, which is where it goes while the process appends alone). */
struct iob_file {
	char path[IOB_PATH];
	struct iob_file_call calls[IOB_CALLS];
	__u64 sequential[2];        /* read, write */
	__u64 consecutive[2];
	__u64 access_size[IOB_ACCESS];   /* bytes plus one (0: slot free), claimed in order of first use */
	__u64 access_count[IOB_ACCESS];
	__u64 access_other;         /* reads and writes of a size that found no free slot */
	__u64 cut;                  /* 1: the path is not whole (longer than IOB_PATH - 1 bytes: its head kept;
				     * deeper than the program walks: "..." for its head), so files may share it */
};

struct iob_task_pause {
	__u64 ms;
	char comm[16];
};

#endif
