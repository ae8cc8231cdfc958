/*
 * iobatch_interpose: an LD_PRELOAD library that times every file I/O call of a dynamically linked
 * program and writes per-process records for the profiler sidecar (profiling/probes/interpose.py).
 *
 * Environment:
 *   IOBATCH_INTERPOSE_DIR          directory for records (required; without it the library only passes
 *                                  calls through)
 *   IOBATCH_INTERPOSE_INTERVAL_MS  record interval, default 1000
 *   IOBATCH_INTERPOSE_DEPTH        path components kept per fd, default 3 ("/scratch/job/in")
 *
 * Records: <dir>/calls-<pid>-<since_ns>.jsonl, one file per program run (from its start, or its fork),
 * one JSON line per interval in which something changed, one at exit ("final": true), and one whenever
 * the generation changes (below). Each line holds cumulative figures since the program started (or the
 * process forked):
 *   {"pid":P,"since":MONO_S,"born":G0,"gen":G,"t":MONO_S,"wall":UNIX_S,"final":B,"paths":["",...],
 *    "cells":[[path_index,call,size_class,count,bytes,total_ns,min_ns,max_ns,{"k":n,...}],...]}
 * since: when these counters started (a program exec'd in the same pid starts again from zero);
 * born: the generation then; gen: the generation the record answers.
 *
 * Generation: the size in bytes of <dir>/generation (0 while it does not exist). The profiler appends
 * a byte at each stage boundary and waits for every live recording process to write a record tagged
 * with the new size: the timer thread stat()s the file every FLUSH_POLL_MS and writes that record at
 * once, so a stage gets exactly the calls made before its end (profiling/probes/interpose.py). The
 * size is read with stat(2), which never tears, and no fd of ours stays open for the program to close.
 * call: 0 read, 1 write, 2 open, 3 close, 4 fsync. size_class: -1 for calls without a size, else the
 * bit length of the bytes transferred (0 for 0 bytes; k covers [2^(k-1), 2^k)). Latency histogram
 * bucket k counts calls that took [2^k, 2^(k+1)) ns (bucket 0 also holds 0 ns).
 *
 * Design: the hot path touches only the calling thread's block (initial-exec TLS, no locks, no
 * allocation after the first call of a thread). A background thread sums all blocks every interval;
 * 64-bit loads of counters another thread is updating are not torn on the supported 64-bit targets,
 * and a record that is one call behind is fine. A mutex guards only the thread list (thread start and
 * exit, dumping) and the path table (open of a new prefix). errno and return values pass through
 * untouched. Internal I/O calls the real functions, so it is never counted here; the kernel does count the
 * record lines as the process's writes (/proc/<pid>/io wchar), and the profiler adds the bytes it read
 * from the record files to what the library saw. The timer thread runs with every signal blocked. The
 * final record is written at exit by the process the counters belong to (not by a vfork child, which
 * shares its memory), and never waits on the lock: a signal handler may call _exit.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

enum { C_READ, C_WRITE, C_OPEN, C_CLOSE, C_FSYNC, NCALL };
#define NSIZE 41   /* size classes 0..40 (class 40 holds everything >= 2^39 bytes) */
#define NLAT 40    /* latency buckets 0..39 ns log2 (bucket 39 holds >= 2^39 ns) */
#define NPATH 32   /* distinct path prefixes per process; index 0 is "unknown" (sockets, pipes, ...) */
#define NFD 65536  /* fds above this are attributed to "unknown" */
#define PATHLEN 256
/* How often the timer thread looks at the generation: a boundary waits up to this for a record. The
 * profiler's FLUSH_POLL_MS (profiling/probes/interpose.py) is this one; its FLUSH_WAIT_S allows many. */
#define FLUSH_POLL_MS 20

struct cell {
    uint64_t count, bytes, total_ns, min_ns, max_ns;
    uint32_t hist[NLAT];
};

/* Sized calls (read, write) have a cell per size class; the others one cell (size class -1). */
#define SIZED_CELLS (2 * NSIZE)
#define CELLS_PER_PATH (SIZED_CELLS + 3)

struct block {
    struct block *next;
    struct cell cells[NPATH][CELLS_PER_PATH];
};

typedef ssize_t (*read_fn)(int, void *, size_t);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*readv_fn)(int, const struct iovec *, int);
typedef ssize_t (*preadv_fn)(int, const struct iovec *, int, off_t);
typedef ssize_t (*preadv2_fn)(int, const struct iovec *, int, off_t, int);
typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef int (*open2_fn)(const char *, int);
typedef int (*openat2_fn)(int, const char *, int);
typedef int (*creat_fn)(const char *, mode_t);
typedef int (*fd_fn)(int);
typedef ssize_t (*readchk_fn)(int, void *, size_t, size_t);
typedef ssize_t (*preadchk_fn)(int, void *, size_t, off_t, size_t);
typedef void (*exit_fn)(int);

static struct {
    read_fn read;
    write_fn write;
    pread_fn pread, pread64;
    pwrite_fn pwrite, pwrite64;
    readv_fn readv, writev;
    preadv_fn preadv, preadv64, pwritev, pwritev64;
    preadv2_fn preadv2, preadv64v2, pwritev2, pwritev64v2;
    open_fn open, open64;
    openat_fn openat, openat64;
    open2_fn open_2, open64_2;
    openat2_fn openat_2, openat64_2;
    creat_fn creat, creat64;
    fd_fn close, fsync, fdatasync;
    readchk_fn read_chk;
    preadchk_fn pread_chk, pread64_chk;
    exit_fn exit_, Exit_;
} real;

static __thread struct block *my_block __attribute__((tls_model("initial-exec")));
static __thread int in_hook __attribute__((tls_model("initial-exec")));

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t block_key;
static struct block *blocks;        /* live threads */
static struct block *retired;       /* figures of threads that exited */
static char paths[NPATH][PATHLEN];
static volatile int npaths = 1;     /* paths[0] = "" (unknown) */
static unsigned char fd_path[NFD];  /* fd -> path index, set at open */
static int enabled;
static int depth = 3;
static long interval_ms = 1000;
static char record_path[PATH_MAX];
static char generation_path[PATH_MAX];
static long born_gen;               /* the generation when these counters started */
static double since_s;              /* monotonic time when these counters started */
static int recording;               /* a record directory was given */
static volatile int dumper_pending; /* a forked child starts its dumper on its first call */
static int finished;
static pid_t owner_pid;             /* the process these counters belong to (set at start and after fork) */
static int stderr_fd = -1;          /* a dup of fd 2: some programs close stderr before exit */
static uint64_t last_total;         /* calls in the last record written, to skip idle intervals */
static pthread_t dumper;

#define RESOLVE(field, name)                                  \
    do {                                                      \
        if (!real.field) {                                    \
            *(void **)(&real.field) = dlsym(RTLD_NEXT, name); \
        }                                                     \
    } while (0)

static void resolve_all(void) {
    RESOLVE(read, "read");
    RESOLVE(write, "write");
    RESOLVE(pread, "pread");
    RESOLVE(pread64, "pread64");
    RESOLVE(pwrite, "pwrite");
    RESOLVE(pwrite64, "pwrite64");
    RESOLVE(readv, "readv");
    RESOLVE(writev, "writev");
    RESOLVE(preadv, "preadv");
    RESOLVE(preadv64, "preadv64");
    RESOLVE(pwritev, "pwritev");
    RESOLVE(pwritev64, "pwritev64");
    RESOLVE(preadv2, "preadv2");
    RESOLVE(preadv64v2, "preadv64v2");
    RESOLVE(pwritev2, "pwritev2");
    RESOLVE(pwritev64v2, "pwritev64v2");
    RESOLVE(open, "open");
    RESOLVE(open64, "open64");
    RESOLVE(openat, "openat");
    RESOLVE(openat64, "openat64");
    RESOLVE(open_2, "__open_2");
    RESOLVE(open64_2, "__open64_2");
    RESOLVE(openat_2, "__openat_2");
    RESOLVE(openat64_2, "__openat64_2");
    RESOLVE(creat, "creat");
    RESOLVE(creat64, "creat64");
    RESOLVE(close, "close");
    RESOLVE(fsync, "fsync");
    RESOLVE(fdatasync, "fdatasync");
    RESOLVE(read_chk, "__read_chk");
    RESOLVE(pread_chk, "__pread_chk");
    RESOLVE(pread64_chk, "__pread64_chk");
    RESOLVE(exit_, "_exit");
    RESOLVE(Exit_, "_Exit");
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline int bit_length(uint64_t v) { return v ? 64 - __builtin_clzll(v) : 0; }

/* The profiler's generation: the size of <dir>/generation (see the header). */
static long read_gen(void) {
    struct stat st;
    return generation_path[0] && stat(generation_path, &st) == 0 ? (long)st.st_size : 0;
}

static void block_destroy(void *arg);

/* The calling thread's block, created on its first call. NULL while the library is off. */
static struct block *thread_block(void) {
    struct block *b = my_block;
    if (LIKELY(b != NULL)) return b;
    if (!enabled || in_hook) return NULL;
    in_hook = 1;
    b = mmap(NULL, sizeof(struct block), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) {
        in_hook = 0;
        return NULL;
    }
    pthread_mutex_lock(&lock);
    b->next = blocks;
    blocks = b;
    pthread_mutex_unlock(&lock);
    my_block = b;
    pthread_setspecific(block_key, b); /* so block_destroy runs when the thread exits */
    in_hook = 0;
    return b;
}

static void start_dumper(void);

/* One call of `ns` nanoseconds into a cell: count, total, min, max and the log2 histogram. */
static inline void cell_add(struct cell *c, uint64_t ns) {
    if (c->count == 0 || ns < c->min_ns) c->min_ns = ns;
    if (ns > c->max_ns) c->max_ns = ns;
    c->count++;
    c->total_ns += ns;
    int h = ns ? bit_length(ns) - 1 : 0;
    if (h >= NLAT) h = NLAT - 1;
    c->hist[h]++;
}

static inline void account(int call, int fd, int64_t size, uint64_t ns) {
    if (UNLIKELY(dumper_pending)) {
        dumper_pending = 0;
        born_gen = read_gen(); /* no call was counted since the fork: this one starts the figures */
        start_dumper();
    }
    struct block *b = thread_block();
    if (UNLIKELY(b == NULL)) return;
    unsigned p = (fd >= 0 && fd < NFD) ? fd_path[fd] : 0;
    struct cell *c;
    if (call <= C_WRITE) {
        int k = size > 0 ? bit_length((uint64_t)size) : 0;
        if (k >= NSIZE) k = NSIZE - 1;
        c = &b->cells[p][call * NSIZE + k];
        if (size > 0) c->bytes += (uint64_t)size;
    } else {
        c = &b->cells[p][SIZED_CELLS + (call - C_OPEN)];
    }
    cell_add(c, ns);
}

/* ---- path attribution ---------------------------------------------------------------------------- */

static int path_index(const char *prefix) {
    int n = npaths;
    for (int i = 1; i < n; i++)
        if (strcmp(paths[i], prefix) == 0) return i;
    pthread_mutex_lock(&lock);
    n = npaths;
    int found = 0;
    for (int i = 1; i < n; i++)
        if (strcmp(paths[i], prefix) == 0) found = i;
    if (!found && n < NPATH) {
        snprintf(paths[n], PATHLEN, "%s", prefix);
        __atomic_store_n(&npaths, n + 1, __ATOMIC_RELEASE);
        found = n;
    }
    pthread_mutex_unlock(&lock);
    if (!found) {
        /* Table full: the longest known prefix of this path, else "unknown". */
        size_t best = 0;
        for (int i = 1; i < n; i++) {
            size_t len = strlen(paths[i]);
            if (len > best && strncmp(paths[i], prefix, len) == 0 && (prefix[len] == '/' || prefix[len] == 0)) {
                best = len;
                found = i;
            }
        }
    }
    return found;
}

/* Record which path prefix fd refers to. Relative paths are made absolute against the cwd (or dirfd). */
static void note_open(int fd, int dirfd, const char *path) {
    if (fd < 0 || fd >= NFD || path == NULL || !enabled) return;
    char full[PATH_MAX];
    size_t used = 0;
    if (path[0] != '/') {
        int ok = 0;
        if (dirfd == AT_FDCWD) {
            ok = getcwd(full, sizeof full) != NULL;
        } else {
            char link[64];
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            ssize_t n = readlink(link, full, sizeof full - 1);
            if (n > 0) {
                full[n] = 0;
                ok = 1;
            }
        }
        if (!ok) full[0] = 0;
        used = strlen(full);
        if (used + 1 < sizeof full) full[used++] = '/';
    }
    snprintf(full + used, sizeof full - used, "%s", path);
    /* Keep the first `depth` components; "." and ".." are left as written (good enough for a prefix). */
    char prefix[PATHLEN];
    int comps = 0;
    size_t j = 0;
    for (size_t i = 0; full[i] && j < PATHLEN - 1; i++) {
        if (full[i] == '/') {
            if (j > 0 && prefix[j - 1] == '/') continue; /* collapse "//" */
            if (comps == depth) break;
            comps++;
        }
        prefix[j++] = full[i];
    }
    if (j > 1 && prefix[j - 1] == '/') j--;
    prefix[j] = 0;
    fd_path[fd] = (unsigned char)path_index(prefix);
}

/* ---- records ------------------------------------------------------------------------------------- */

static void add_cell(struct cell *dst, const struct cell *src) {
    if (src->count == 0) return;
    if (dst->count == 0 || src->min_ns < dst->min_ns) dst->min_ns = src->min_ns;
    if (src->max_ns > dst->max_ns) dst->max_ns = src->max_ns;
    dst->count += src->count;
    dst->bytes += src->bytes;
    dst->total_ns += src->total_ns;
    for (int h = 0; h < NLAT; h++) dst->hist[h] += src->hist[h];
}

static void block_destroy(void *arg) {
    struct block *b = arg;
    pthread_mutex_lock(&lock);
    struct block **pp = &blocks;
    while (*pp && *pp != b) pp = &(*pp)->next;
    if (*pp) *pp = b->next;
    if (retired == NULL) {
        retired = mmap(NULL, sizeof(struct block), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (retired == MAP_FAILED) retired = NULL;
    }
    if (retired)
        for (int p = 0; p < NPATH; p++)
            for (int i = 0; i < CELLS_PER_PATH; i++) add_cell(&retired->cells[p][i], &b->cells[p][i]);
    pthread_mutex_unlock(&lock);
    my_block = NULL;
    munmap(b, sizeof(struct block));
}

struct out {
    char buf[1 << 16];
    size_t len;
};

static void out_flush(struct out *o, int fd) {
    size_t off = 0;
    while (off < o->len) {
        ssize_t n = real.write(fd, o->buf + off, o->len - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        off += (size_t)n;
    }
    o->len = 0;
}

static void out_printf(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_printf(struct out *o, const char *fmt, ...) {
    if (o->len > sizeof o->buf - 1024) return; /* a record never gets near 64 KiB: NPATH*85 cells max */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, sizeof o->buf - o->len, fmt, ap);
    va_end(ap);
    if (n > 0) o->len += (size_t)n < sizeof o->buf - o->len ? (size_t)n : sizeof o->buf - o->len - 1;
}

static void out_json_string(struct out *o, const char *s) {
    out_printf(o, "\"");
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            out_printf(o, "\\%c", ch);
        else if (ch < 0x20)
            out_printf(o, "\\u%04x", ch);
        else
            out_printf(o, "%c", ch);
    }
    out_printf(o, "\"");
}

enum { RECORD_REGULAR, RECORD_FLUSH, RECORD_FINAL };

/* Sum every thread's figures and append one record line tagged with generation `gen`. A regular record
 * is skipped when no call happened since the last record; a flush (the profiler's boundary) or the
 * final record is always written. */
static void write_record(int kind, long gen) {
    int final = kind == RECORD_FINAL;
    static struct block sum; /* only ever used under `lock` */
    static struct out out;
    if (!recording) return;
    int saved_errno = errno;
    int saved_hook = in_hook;
    in_hook = 1;
    if (final) {
        /* The exit path may run in a signal handler that interrupted this very thread inside a record:
         * never block on `lock` there. Another thread's dump holds it for well under a millisecond. */
        int tries = 0;
        struct timespec ms = {0, 1000000L};
        while (pthread_mutex_trylock(&lock) != 0) {
            if (++tries > 50) {
                in_hook = saved_hook;
                errno = saved_errno;
                return;
            }
            nanosleep(&ms, NULL);
        }
    } else {
        pthread_mutex_lock(&lock);
    }
    memset(&sum, 0, sizeof sum);
    for (struct block *b = blocks; b; b = b->next)
        for (int p = 0; p < NPATH; p++)
            for (int i = 0; i < CELLS_PER_PATH; i++) add_cell(&sum.cells[p][i], &b->cells[p][i]);
    if (retired)
        for (int p = 0; p < NPATH; p++)
            for (int i = 0; i < CELLS_PER_PATH; i++) add_cell(&sum.cells[p][i], &retired->cells[p][i]);
    uint64_t total = 0;
    for (int p = 0; p < NPATH; p++)
        for (int i = 0; i < CELLS_PER_PATH; i++) total += sum.cells[p][i].count;
    if (total == last_total && kind == RECORD_REGULAR) {
        pthread_mutex_unlock(&lock);
        in_hook = saved_hook;
        errno = saved_errno;
        return;
    }
    last_total = total;
    struct timespec mono, wall;
    clock_gettime(CLOCK_MONOTONIC, &mono);
    clock_gettime(CLOCK_REALTIME, &wall);
    out.len = 0;
    out_printf(&out, "{\"pid\":%d,\"since\":%.6f,\"born\":%ld,\"gen\":%ld,\"t\":%.6f,\"wall\":%.6f,\"final\":%s,"
               "\"paths\":[", (int)getpid(), since_s, born_gen, gen, mono.tv_sec + mono.tv_nsec / 1e9,
               wall.tv_sec + wall.tv_nsec / 1e9, final ? "true" : "false");
    int n = npaths;
    for (int p = 0; p < n; p++) {
        if (p) out_printf(&out, ",");
        out_json_string(&out, paths[p]);
    }
    out_printf(&out, "],\"cells\":[");
    int first = 1;
    for (int p = 0; p < n; p++)
        for (int i = 0; i < CELLS_PER_PATH; i++) {
            struct cell *c = &sum.cells[p][i];
            if (c->count == 0) continue;
            int call, size;
            if (i < SIZED_CELLS) {
                call = i / NSIZE;
                size = i % NSIZE;
            } else {
                call = C_OPEN + (i - SIZED_CELLS);
                size = -1;
            }
            out_printf(&out, "%s[%d,%d,%d,%llu,%llu,%llu,%llu,%llu,{", first ? "" : ",", p, call, size,
                       (unsigned long long)c->count, (unsigned long long)c->bytes,
                       (unsigned long long)c->total_ns, (unsigned long long)c->min_ns,
                       (unsigned long long)c->max_ns);
            first = 0;
            int hfirst = 1;
            for (int h = 0; h < NLAT; h++)
                if (c->hist[h]) {
                    out_printf(&out, "%s\"%d\":%u", hfirst ? "" : ",", h, c->hist[h]);
                    hfirst = 0;
                }
            out_printf(&out, "}]");
        }
    out_printf(&out, "]}\n");
    /* Opened per record, so the program never sees (or closes) an fd of ours. */
    int fd = real.open(record_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        out_flush(&out, fd);
        real.close(fd);
    }
    pthread_mutex_unlock(&lock);
    in_hook = saved_hook;
    errno = saved_errno;
}

/* The timer thread: a record every interval, and one at once when the profiler changes the generation
 * (a stage boundary; the calling threads may all be blocked then, so they cannot be the ones to look). */
static void *dumper_main(void *arg) {
    (void)arg;
    in_hook = 1; /* this thread's own calls are never counted */
    long tick_ms = interval_ms < FLUSH_POLL_MS ? interval_ms : FLUSH_POLL_MS;
    struct timespec tick = {tick_ms / 1000, (tick_ms % 1000) * 1000000L};
    long seen = born_gen;
    /* A first record at once: from now on the profiler knows this process records and waits for it. */
    write_record(RECORD_FLUSH, seen);
    uint64_t next = now_ns() + (uint64_t)interval_ms * 1000000ull;
    for (;;) {
        nanosleep(&tick, NULL);
        long gen = read_gen();
        if (gen != seen) {
            seen = gen;
            write_record(RECORD_FLUSH, gen);
        } else if (now_ns() >= next) {
            write_record(RECORD_REGULAR, seen);
            next = now_ns() + (uint64_t)interval_ms * 1000000ull;
        }
    }
    return NULL;
}

static void open_record_file(void) {
    const char *dir = getenv("IOBATCH_INTERPOSE_DIR");
    recording = 0;
    if (dir == NULL || dir[0] == 0) return;
    /* One file per program run: a pid the kernel reuses, or a program exec'd in the same pid, starts a new
     * file, so a file whose final record the profiler has read never grows again. */
    uint64_t since = now_ns();
    snprintf(record_path, sizeof record_path, "%s/calls-%d-%llu.jsonl", dir, (int)getpid(),
             (unsigned long long)since);
    snprintf(generation_path, sizeof generation_path, "%s/generation", dir);
    since_s = since / 1e9;
    born_gen = read_gen();
    int fd = real.open(record_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        real.close(fd);
        recording = 1;
    } else if (stderr_fd >= 0) {
        char msg[PATH_MAX + 80];
        int n = snprintf(msg, sizeof msg, "iobatch_interpose: cannot write %s: %s; not recording\n", record_path,
                         strerror(errno));
        if (n > 0) real.write(stderr_fd, msg, (size_t)n);
    }
}

static void start_dumper(void) {
    if (!recording) return;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* A new thread inherits the creator's signal mask (pthread_create(3)): the timer thread starts with
     * every signal blocked, so the kernel never picks it to run one of the program's handlers. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    if (pthread_create(&dumper, &attr, dumper_main, NULL) != 0) dumper_pending = 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
}

/* fork: hold the lock across fork so the child never inherits it locked mid-update. */
static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&lock); }
static void after_fork_child(void) {
    pthread_mutex_unlock(&lock);
    /* The child starts from zero: its own record file, only its own thread, no inherited figures.
     * The other threads' blocks stay mapped (they do not exist in the child) but are dropped. */
    blocks = my_block;
    if (my_block) {
        my_block->next = NULL;
        memset(my_block->cells, 0, sizeof my_block->cells);
    }
    if (retired) memset(retired->cells, 0, sizeof retired->cells);
    last_total = 0;
    owner_pid = (pid_t)syscall(SYS_getpid);
    open_record_file();
    /* Not here: a child that only execs should not pay for a thread. Started on its first call. */
    dumper_pending = recording;
}

/* The final record. Not in a vfork child (CPython's subprocess uses vfork; its child calls _exit(255) when
 * exec fails): it shares this process's memory but not its pid (vfork(2)), so it must neither mark these
 * counters finished nor write them under its own pid. The raw system call, because glibc's getpid() has
 * not always asked the kernel. */
static void at_exit(void) {
    if (!enabled || finished || (pid_t)syscall(SYS_getpid) != owner_pid) return;
    finished = 1;
    write_record(RECORD_FINAL, read_gen());
}

__attribute__((constructor)) static void init(void) {
    resolve_all();
    stderr_fd = fcntl(2, F_DUPFD_CLOEXEC, 100);
    const char *s = getenv("IOBATCH_INTERPOSE_INTERVAL_MS");
    if (s && atol(s) > 0) interval_ms = atol(s);
    s = getenv("IOBATCH_INTERPOSE_DEPTH");
    if (s && atoi(s) > 0) depth = atoi(s);
    owner_pid = (pid_t)syscall(SYS_getpid);
    open_record_file();
    if (!recording) return;
    pthread_key_create(&block_key, block_destroy);
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    enabled = 1;
    start_dumper();
}

__attribute__((destructor)) static void fini(void) { at_exit(); }

/* ---- the wrappers -------------------------------------------------------------------------------- */

#define TIMED(call, fd, expr, ret_type, size_expr)              \
    uint64_t t0_ = now_ns();                                   \
    ret_type r_ = (expr);                                      \
    uint64_t t1_ = now_ns();                                   \
    if (enabled && !in_hook) {                                 \
        int e_ = errno;                                        \
        account(call, fd, (size_expr), t1_ - t0_);             \
        errno = e_;                                            \
    }                                                          \
    return r_

#define ENSURE(field)                  \
    if (UNLIKELY(real.field == NULL)) resolve_all()

EXPORT ssize_t read(int fd, void *buf, size_t n) {
    ENSURE(read);
    TIMED(C_READ, fd, real.read(fd, buf, n), ssize_t, (int64_t)r_);
}
EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen) {
    ENSURE(read_chk);
    TIMED(C_READ, fd, real.read_chk(fd, buf, n, buflen), ssize_t, (int64_t)r_);
}
EXPORT ssize_t write(int fd, const void *buf, size_t n) {
    ENSURE(write);
    TIMED(C_WRITE, fd, real.write(fd, buf, n), ssize_t, (int64_t)r_);
}
EXPORT ssize_t pread(int fd, void *buf, size_t n, off_t off) {
    ENSURE(pread);
    TIMED(C_READ, fd, real.pread(fd, buf, n, off), ssize_t, (int64_t)r_);
}
EXPORT ssize_t pread64(int fd, void *buf, size_t n, off_t off) {
    ENSURE(pread64);
    TIMED(C_READ, fd, real.pread64(fd, buf, n, off), ssize_t, (int64_t)r_);
}
EXPORT ssize_t __pread_chk(int fd, void *buf, size_t n, off_t off, size_t buflen) {
    ENSURE(pread_chk);
    TIMED(C_READ, fd, real.pread_chk(fd, buf, n, off, buflen), ssize_t, (int64_t)r_);
}
EXPORT ssize_t __pread64_chk(int fd, void *buf, size_t n, off_t off, size_t buflen) {
    ENSURE(pread64_chk);
    TIMED(C_READ, fd, real.pread64_chk(fd, buf, n, off, buflen), ssize_t, (int64_t)r_);
}
EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    ENSURE(pwrite);
    TIMED(C_WRITE, fd, real.pwrite(fd, buf, n, off), ssize_t, (int64_t)r_);
}
EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    ENSURE(pwrite64);
    TIMED(C_WRITE, fd, real.pwrite64(fd, buf, n, off), ssize_t, (int64_t)r_);
}
EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt) {
    ENSURE(readv);
    TIMED(C_READ, fd, real.readv(fd, iov, cnt), ssize_t, (int64_t)r_);
}
EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    ENSURE(writev);
    TIMED(C_WRITE, fd, real.writev(fd, iov, cnt), ssize_t, (int64_t)r_);
}
EXPORT ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off) {
    ENSURE(preadv);
    TIMED(C_READ, fd, real.preadv(fd, iov, cnt, off), ssize_t, (int64_t)r_);
}
EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off_t off) {
    ENSURE(preadv64);
    TIMED(C_READ, fd, real.preadv64(fd, iov, cnt, off), ssize_t, (int64_t)r_);
}
EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
    ENSURE(pwritev);
    TIMED(C_WRITE, fd, real.pwritev(fd, iov, cnt, off), ssize_t, (int64_t)r_);
}
EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off_t off) {
    ENSURE(pwritev64);
    TIMED(C_WRITE, fd, real.pwritev64(fd, iov, cnt, off), ssize_t, (int64_t)r_);
}
EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    ENSURE(preadv2);
    TIMED(C_READ, fd, real.preadv2(fd, iov, cnt, off, flags), ssize_t, (int64_t)r_);
}
EXPORT ssize_t preadv64v2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    ENSURE(preadv64v2);
    TIMED(C_READ, fd, real.preadv64v2(fd, iov, cnt, off, flags), ssize_t, (int64_t)r_);
}
EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    ENSURE(pwritev2);
    TIMED(C_WRITE, fd, real.pwritev2(fd, iov, cnt, off, flags), ssize_t, (int64_t)r_);
}
EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int cnt, off_t off, int flags) {
    ENSURE(pwritev64v2);
    TIMED(C_WRITE, fd, real.pwritev64v2(fd, iov, cnt, off, flags), ssize_t, (int64_t)r_);
}

/* open-type calls: time the call, then remember the fd's path prefix. */
#define TIMED_OPEN(dirfd, path, expr)                          \
    uint64_t t0_ = now_ns();                                   \
    int r_ = (expr);                                           \
    uint64_t t1_ = now_ns();                                   \
    if (enabled && !in_hook) {                                 \
        int e_ = errno;                                        \
        in_hook = 1;                                           \
        note_open(r_, dirfd, path);                            \
        in_hook = 0;                                           \
        account(C_OPEN, r_, -1, t1_ - t0_);                    \
        errno = e_;                                            \
    }                                                          \
    return r_

static inline mode_t mode_arg(int flags, va_list ap) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

EXPORT int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    ENSURE(open);
    TIMED_OPEN(AT_FDCWD, path, real.open(path, flags, mode));
}
EXPORT int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    ENSURE(open64);
    TIMED_OPEN(AT_FDCWD, path, real.open64(path, flags, mode));
}
EXPORT int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    ENSURE(openat);
    TIMED_OPEN(dirfd, path, real.openat(dirfd, path, flags, mode));
}
EXPORT int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    ENSURE(openat64);
    TIMED_OPEN(dirfd, path, real.openat64(dirfd, path, flags, mode));
}
EXPORT int __open_2(const char *path, int flags) {
    ENSURE(open_2);
    TIMED_OPEN(AT_FDCWD, path, real.open_2(path, flags));
}
EXPORT int __open64_2(const char *path, int flags) {
    ENSURE(open64_2);
    TIMED_OPEN(AT_FDCWD, path, real.open64_2(path, flags));
}
EXPORT int __openat_2(int dirfd, const char *path, int flags) {
    ENSURE(openat_2);
    TIMED_OPEN(dirfd, path, real.openat_2(dirfd, path, flags));
}
EXPORT int __openat64_2(int dirfd, const char *path, int flags) {
    ENSURE(openat64_2);
    TIMED_OPEN(dirfd, path, real.openat64_2(dirfd, path, flags));
}
EXPORT int creat(const char *path, mode_t mode) {
    ENSURE(creat);
    TIMED_OPEN(AT_FDCWD, path, real.creat(path, mode));
}
EXPORT int creat64(const char *path, mode_t mode) {
    ENSURE(creat64);
    TIMED_OPEN(AT_FDCWD, path, real.creat64(path, mode));
}

EXPORT int close(int fd) {
    ENSURE(close);
    unsigned p = (fd >= 0 && fd < NFD) ? fd_path[fd] : 0;
    /* Forget the path before the fd is free: once closed, another thread's open may reuse the number. */
    if (p) fd_path[fd] = 0;
    uint64_t t0 = now_ns();
    int r = real.close(fd);
    uint64_t t1 = now_ns();
    if (enabled && !in_hook) {
        int e = errno;
        struct block *b = thread_block();
        if (b) {
            cell_add(&b->cells[p][SIZED_CELLS + 1], t1 - t0);
        }
        errno = e;
    }
    return r;
}
EXPORT int fsync(int fd) {
    ENSURE(fsync);
    TIMED(C_FSYNC, fd, real.fsync(fd), int, -1);
}
EXPORT int fdatasync(int fd) {
    ENSURE(fdatasync);
    TIMED(C_FSYNC, fd, real.fdatasync(fd), int, -1);
}

/* _exit skips atexit and destructors (a forked child usually leaves this way): write the final record. */
EXPORT void _exit(int status) {
    ENSURE(exit_);
    at_exit();
    real.exit_(status);
    __builtin_unreachable();
}
EXPORT void _Exit(int status) {
    ENSURE(Exit_);
    at_exit();
    real.Exit_(status);
    __builtin_unreachable();
}
