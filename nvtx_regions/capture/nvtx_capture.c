/*
 * nvtx_capture.c -- an NVTX v3 injection library that records what a process
 * emits, for nvtx_regions.testing.  Built on first use by
 * nvtx_regions/testing/tool.py; no CUDA, GPU or Nsight needed.
 *
 * NVTX loads the library named by NVTX_INJECTION64_PATH at the first NVTX call
 * of each NVTX instance (every header-only NVTX user in a process is its own
 * instance) and calls InitializeInjectionNvtx2 once per instance; all instances
 * share this one loaded copy, so it sees every one of them.
 *
 * Environment, read once, at the first NVTX call (or the first ctypes call):
 *   NVTX_REGIONS_CAPTURE_MODE  "events" (default): record every event;
 *                              "count": only count events per kind (cheap).
 *   NVTX_REGIONS_CAPTURE_DIR   if set, each process appends JSON lines to
 *                              DIR/nvtx-<pid>.jsonl: a "process" header, one
 *                              "event" line per event, an "end" line with the
 *                              counts at normal exit. Lines are copied into a
 *                              shared mapping of the file (a memory copy, no
 *                              system call per event); the kernel owns those
 *                              pages, so a crash, even SIGKILL, loses nothing
 *                              already recorded. Memory stays bounded: one
 *                              1 MiB window of the file is mapped at a time.
 *                              After a crash the file ends in NUL padding up
 *                              to the window's end, which readers skip; at
 *                              normal exit it is truncated to its content.
 *   RANK, LOCAL_RANK, WORLD_SIZE  copied into the header (torchrun sets them).
 *
 * Python reads the in-memory buffer through the nvtx_capture_* functions
 * (ctypes); recording into it is off until nvtx_capture_set_recording(1).
 *
 * Semantics: the default domain is a NULL handle and is written as null.
 * Push returns the 0-based level of the new range and pop the level it ended
 * (-1 if nothing was open), per thread and domain, as NVTX specifies.
 * Category 0 means "no category" and is written as null.
 */
#define _GNU_SOURCE
#define NVTX_NO_IMPL /* only the types: this library implements, never calls, NVTX */
#include <nvtx3/nvToolsExt.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#define EXPORT __attribute__((visibility("default")))
#define PROBE_MESSAGE "nvtx_regions.testing:probe"
#define ABI_VERSION 1

enum Kind {
    K_PUSH, K_POP, K_START, K_END, K_MARK,
    K_DOMAIN_CREATE, K_DOMAIN_DESTROY, K_REGISTER_STRING,
    K_NAME_CATEGORY, K_NAME_THREAD,
    K_COUNT
};
static const char *const kKindNames[K_COUNT] = {
    "push", "pop", "start", "end", "mark",
    "domain_create", "domain_destroy", "register_string",
    "name_category", "name_thread",
};

/* Domain and registered-string handles are pointers to these; never freed,
 * so a handle stays valid for any event that still names it. */
typedef struct Domain {
    struct Domain *next;
    char *name; /* UTF-8 */
} Domain;

typedef struct StringReg {
    const Domain *domain;
    char *text; /* UTF-8 */
} StringReg;

typedef struct Buf {
    char *data;
    size_t len, cap;
} Buf;

typedef struct Event {
    int kind;
    const Domain *domain; /* NULL: default domain */
    const char *msg;      /* UTF-8 or NULL */
    int has_color;
    uint32_t color;
    uint32_t category; /* 0: none */
    int has_range;
    uint64_t range_id;
    int has_depth;
    int depth;
    int payload_kind; /* 0 none, 1 unsigned, 2 signed, 3 floating */
    uint64_t payload_u;
    int64_t payload_i;
    double payload_d;
    int has_target;
    uint32_t target_tid;
} Event;

typedef struct DepthSlot {
    const Domain *domain;
    int depth;
} DepthSlot;

typedef struct ThreadState {
    pid_t tid; /* cached gettid(); 0: not yet (reset in a forked child) */
    DepthSlot *slots;
    size_t n, cap;
    Buf line;
} ThreadState;

/* ---- global state ---- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* guards everything below it */
static pthread_key_t g_thread_key;
static int g_count_only;
static int g_clients;                /* atomic: successful InitializeInjectionNvtx2 calls */
static int g_mem_recording;          /* atomic */
static uint64_t g_counts[K_COUNT];   /* atomic */
static uint64_t g_probes;            /* atomic */
static uint64_t g_next_range_id = 1; /* atomic */
static char *g_dir;                  /* NULL: no file output */
static int g_fd = -1;
static pid_t g_fd_pid;
static pid_t g_pid;      /* cached getpid(), renewed in a forked child */
#define WINDOW ((off_t)1 << 20) /* bytes of the output file mapped at a time; a multiple of the page size */
static char *g_map;      /* the mapped window [g_map_off, g_map_off + WINDOW) of the file, or NULL */
static off_t g_map_off;
static off_t g_size;     /* bytes of content in the file */
static int g_map_ok = 1; /* 0: append with write() (mmap failed, or after the end record) */
static Buf g_mem;
static pid_t g_mem_pid;
static Domain *g_domains;
static __thread ThreadState *t_state;

/* ---- small helpers ---- */

static int buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) return 0;
    b->data = p;
    b->cap = cap;
    return 1;
}

static void buf_put(Buf *b, const char *s, size_t n) {
    if (!buf_reserve(b, n)) return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

static void buf_puts(Buf *b, const char *s) { buf_put(b, s, strlen(s)); }

static void buf_printf(Buf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) buf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Decimal integers without printf: format_event runs for every event. */
static void buf_u64(Buf *b, unsigned long long v) {
    char tmp[24];
    int i = sizeof tmp;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    buf_put(b, tmp + i, sizeof tmp - (size_t)i);
}

static void buf_i64(Buf *b, long long v) {
    if (v < 0) {
        buf_put(b, "-", 1);
        buf_u64(b, 0ull - (unsigned long long)v);
    } else {
        buf_u64(b, (unsigned long long)v);
    }
}

/* JSON string; bytes >= 0x80 pass through (Python decodes UTF-8 with errors="replace"). */
static void buf_json_str(Buf *b, const char *s) {
    if (!s) {
        buf_puts(b, "null");
        return;
    }
    buf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; ++p) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            buf_put(b, esc, 2);
        } else if (*p < 0x20) {
            buf_printf(b, "\\u%04x", *p);
        } else {
            buf_put(b, (const char *)p, 1);
        }
    }
    buf_put(b, "\"", 1);
}

static char *xstrdup(const char *s) { return s ? strdup(s) : NULL; }

/* wchar_t is UTF-32 on Linux; invalid code points become U+FFFD. */
static char *wide_to_utf8(const wchar_t *w) {
    if (!w) return NULL;
    Buf b = {0};
    for (; *w; ++w) {
        uint32_t c = (uint32_t)*w;
        char u[4];
        if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) c = 0xFFFD;
        if (c < 0x80) {
            u[0] = (char)c;
            buf_put(&b, u, 1);
        } else if (c < 0x800) {
            u[0] = (char)(0xC0 | (c >> 6));
            u[1] = (char)(0x80 | (c & 0x3F));
            buf_put(&b, u, 2);
        } else if (c < 0x10000) {
            u[0] = (char)(0xE0 | (c >> 12));
            u[1] = (char)(0x80 | ((c >> 6) & 0x3F));
            u[2] = (char)(0x80 | (c & 0x3F));
            buf_put(&b, u, 3);
        } else {
            u[0] = (char)(0xF0 | (c >> 18));
            u[1] = (char)(0x80 | ((c >> 12) & 0x3F));
            u[2] = (char)(0x80 | ((c >> 6) & 0x3F));
            u[3] = (char)(0x80 | (c & 0x3F));
            buf_put(&b, u, 4);
        }
    }
    if (!b.data) return strdup("");
    return b.data;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Append to the output file (lock held): through the mapped window, or with write() when mapping is off. */
static void out_append(const char *p, size_t n) {
    while (n > 0) {
        if (g_map && g_size >= g_map_off + WINDOW) {
            munmap(g_map, (size_t)WINDOW);
            g_map = NULL;
        }
        if (!g_map && g_map_ok) {
            off_t off = g_size & ~(WINDOW - 1);
            void *m = MAP_FAILED;
            if (ftruncate(g_fd, off + WINDOW) == 0)
                m = mmap(NULL, (size_t)WINDOW, PROT_READ | PROT_WRITE, MAP_SHARED, g_fd, off);
            if (m == MAP_FAILED) {
                g_map_ok = 0;
                if (ftruncate(g_fd, g_size) != 0) return;
            } else {
                g_map = m;
                g_map_off = off;
            }
        }
        if (!g_map) {
            write_all(g_fd, p, n);
            g_size += (off_t)n;
            return;
        }
        size_t room = (size_t)(g_map_off + WINDOW - g_size);
        size_t k = n < room ? n : room;
        memcpy(g_map + (g_size - g_map_off), p, k);
        g_size += (off_t)k;
        p += k;
        n -= k;
    }
}

/* Unmap and cut the file to its content; later lines are appended with write(). */
static void out_finish(void) {
    if (g_map) {
        munmap(g_map, (size_t)WINDOW);
        g_map = NULL;
    }
    if (g_fd >= 0 && g_map_ok && ftruncate(g_fd, g_size) != 0) { /* keep the padding; readers skip it */
    }
    g_map_ok = 0;
}

static void json_env(Buf *b, const char *key, const char *var) {
    buf_printf(b, ",\"%s\":", key);
    buf_json_str(b, getenv(var));
}

/* ---- output file (lock held) ---- */

static void write_header(pid_t pid) {
    Buf b = {0};
    buf_printf(&b, "{\"type\":\"process\",\"abi\":%d,\"pid\":%d,\"ppid\":%d", ABI_VERSION, (int)pid,
               (int)getppid());
    json_env(&b, "rank", "RANK");
    json_env(&b, "local_rank", "LOCAL_RANK");
    json_env(&b, "world_size", "WORLD_SIZE");
    buf_printf(&b, ",\"mode\":\"%s\",\"ts_ns\":%llu}\n", g_count_only ? "count" : "events",
               (unsigned long long)now_ns());
    if (b.data) out_append(b.data, b.len);
    free(b.data);
}

/* The file belongs to the pid that writes it: a forked child opens its own. */
static int ensure_file(pid_t pid) {
    if (!g_dir) return 0;
    if (g_fd >= 0 && g_fd_pid == pid) return 1;
    if (g_fd >= 0) close(g_fd);
    g_map = NULL; /* a forked child unmapped its parent's window in fork_child */
    g_size = 0;
    g_map_ok = 1;
    Buf path = {0};
    buf_printf(&path, "/nvtx-%d.jsonl", (int)pid);
    size_t dlen = strlen(g_dir);
    char *full = malloc(dlen + path.len + 1);
    if (!full) {
        free(path.data);
        return 0;
    }
    memcpy(full, g_dir, dlen);
    memcpy(full + dlen, path.data, path.len + 1);
    free(path.data);
    g_fd = open(full, O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644); /* RDWR: mmap needs it */
    if (g_fd < 0) fprintf(stderr, "nvtx_capture: cannot open %s: %s\n", full, strerror(errno));
    free(full);
    g_fd_pid = pid;
    if (g_fd < 0) return 0;
    write_header(pid);
    return 1;
}

static void format_counts(Buf *b) {
    buf_puts(b, "{");
    for (int k = 0; k < K_COUNT; ++k)
        buf_printf(b, "%s\"%s\":%llu", k ? "," : "", kKindNames[k],
                   (unsigned long long)__atomic_load_n(&g_counts[k], __ATOMIC_RELAXED));
    buf_puts(b, "}");
}

static void at_exit(void) {
    pthread_mutex_lock(&g_lock);
    pid_t pid = getpid();
    if (ensure_file(pid)) {
        Buf b = {0};
        buf_printf(&b, "{\"type\":\"end\",\"pid\":%d,\"ts_ns\":%llu,\"probes\":%llu,\"counts\":", (int)pid,
                   (unsigned long long)now_ns(),
                   (unsigned long long)__atomic_load_n(&g_probes, __ATOMIC_RELAXED));
        format_counts(&b);
        buf_puts(&b, "}\n");
        if (b.data) out_append(b.data, b.len);
        free(b.data);
        out_finish();
    }
    pthread_mutex_unlock(&g_lock);
}

/* ---- fork: the child starts with no events, counts or pending buffer ---- */

static void fork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void fork_parent(void) { pthread_mutex_unlock(&g_lock); }
static void fork_child(void) {
    /* The parent's window maps the parent's file: drop it here (the parent keeps its own). */
    if (g_map) munmap(g_map, (size_t)WINDOW);
    g_map = NULL;
    g_pid = getpid();
    if (t_state) t_state->tid = 0;
    pthread_mutex_unlock(&g_lock);
    for (int k = 0; k < K_COUNT; ++k) g_counts[k] = 0;
    g_probes = 0;
    g_mem.len = 0;
    if (g_mem.data) g_mem.data[0] = 0;
}

/* ---- per-thread state ---- */

static void thread_state_free(void *p) {
    ThreadState *s = p;
    free(s->slots);
    free(s->line.data);
    free(s);
    t_state = NULL; /* a later call on this exiting thread (another key's destructor) makes a new one */
}

static ThreadState *thread_state(void) {
    if (!t_state) {
        t_state = calloc(1, sizeof *t_state);
        if (t_state) pthread_setspecific(g_thread_key, t_state);
    }
    return t_state;
}

static int *depth_of(const Domain *d) {
    ThreadState *s = thread_state();
    if (!s) return NULL;
    for (size_t i = 0; i < s->n; ++i)
        if (s->slots[i].domain == d) return &s->slots[i].depth;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 8;
        DepthSlot *p = realloc(s->slots, cap * sizeof *p);
        if (!p) return NULL;
        s->slots = p;
        s->cap = cap;
    }
    s->slots[s->n].domain = d;
    s->slots[s->n].depth = 0;
    return &s->slots[s->n++].depth;
}

/* ---- init ---- */

static void global_init(void) {
    const char *mode = getenv("NVTX_REGIONS_CAPTURE_MODE");
    if (mode && strcmp(mode, "count") == 0) {
        g_count_only = 1;
    } else if (mode && *mode && strcmp(mode, "events") != 0) {
        fprintf(stderr, "nvtx_capture: unknown NVTX_REGIONS_CAPTURE_MODE=%s (expected events or count); recording events\n",
                mode);
    }
    const char *dir = getenv("NVTX_REGIONS_CAPTURE_DIR");
    if (dir && *dir) g_dir = strdup(dir);
    g_pid = getpid();
    pthread_key_create(&g_thread_key, thread_state_free);
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    pthread_mutex_lock(&g_lock);
    ensure_file(getpid());
    pthread_mutex_unlock(&g_lock);
    atexit(at_exit);
}

static void ensure_init(void) { pthread_once(&g_once, global_init); }

/* ---- recording ---- */

static void format_event(Buf *b, const Event *e, pid_t tid, uint64_t ts) {
    b->len = 0;
    buf_puts(b, "{\"type\":\"event\",\"kind\":\"");
    buf_puts(b, kKindNames[e->kind]);
    buf_puts(b, "\",\"domain\":");
    buf_json_str(b, e->domain ? e->domain->name : NULL);
    buf_puts(b, ",\"message\":");
    buf_json_str(b, e->msg);
    buf_puts(b, ",\"color\":");
    if (e->has_color) buf_u64(b, e->color);
    else buf_puts(b, "null");
    buf_puts(b, ",\"category\":");
    if (e->category) buf_u64(b, e->category);
    else buf_puts(b, "null");
    buf_puts(b, ",\"tid\":");
    buf_i64(b, (long long)tid);
    buf_puts(b, ",\"ts_ns\":");
    buf_u64(b, (unsigned long long)ts);
    buf_puts(b, ",\"range_id\":");
    if (e->has_range) buf_u64(b, (unsigned long long)e->range_id);
    else buf_puts(b, "null");
    buf_puts(b, ",\"depth\":");
    if (e->has_depth) buf_i64(b, e->depth);
    else buf_puts(b, "null");
    buf_puts(b, ",\"payload\":");
    if (e->payload_kind == 1) buf_u64(b, (unsigned long long)e->payload_u);
    else if (e->payload_kind == 2) buf_i64(b, (long long)e->payload_i);
    else if (e->payload_kind == 3 && isfinite(e->payload_d)) buf_printf(b, "%.17g", e->payload_d);
    else buf_puts(b, "null");
    buf_puts(b, ",\"target_tid\":");
    if (e->has_target) buf_u64(b, e->target_tid);
    else buf_puts(b, "null");
    buf_puts(b, "}\n");
}

static void record(const Event *e) {
    __atomic_fetch_add(&g_counts[e->kind], 1, __ATOMIC_RELAXED);
    if (g_count_only) return;
    int mem = __atomic_load_n(&g_mem_recording, __ATOMIC_RELAXED);
    if (!g_dir && !mem) return;
    ThreadState *s = thread_state();
    if (!s) return;
    if (!s->tid) s->tid = (pid_t)syscall(SYS_gettid);
    pid_t tid = s->tid;
    pthread_mutex_lock(&g_lock);
    pid_t pid = g_pid;
    /* The timestamp is taken under the lock so buffer order is time order. */
    format_event(&s->line, e, tid, now_ns());
    if (s->line.data) {
        if (ensure_file(pid)) out_append(s->line.data, s->line.len);
        if (__atomic_load_n(&g_mem_recording, __ATOMIC_RELAXED) && g_mem_pid == pid)
            buf_put(&g_mem, s->line.data, s->line.len);
    }
    pthread_mutex_unlock(&g_lock);
}

#define HAS_FIELD(a, f) ((a)->size >= offsetof(nvtxEventAttributes_t, f) + sizeof((a)->f))

/* Fill message, color, category and payload from an attributes struct.
 * Returns a buffer the caller frees (the UTF-8 form of a wide message), or NULL. */
static char *from_attributes(Event *e, const nvtxEventAttributes_t *a) {
    char *owned = NULL;
    if (!a) return NULL;
    if (HAS_FIELD(a, category)) e->category = a->category;
    if (HAS_FIELD(a, color) && a->colorType == NVTX_COLOR_ARGB) {
        e->has_color = 1;
        e->color = a->color;
    }
    if (HAS_FIELD(a, payload)) {
        switch (a->payloadType) {
        case NVTX_PAYLOAD_TYPE_UNSIGNED_INT64: e->payload_kind = 1; e->payload_u = a->payload.ullValue; break;
        case NVTX_PAYLOAD_TYPE_INT64: e->payload_kind = 2; e->payload_i = a->payload.llValue; break;
        case NVTX_PAYLOAD_TYPE_DOUBLE: e->payload_kind = 3; e->payload_d = a->payload.dValue; break;
        case NVTX_PAYLOAD_TYPE_UNSIGNED_INT32: e->payload_kind = 1; e->payload_u = a->payload.uiValue; break;
        case NVTX_PAYLOAD_TYPE_INT32: e->payload_kind = 2; e->payload_i = a->payload.iValue; break;
        case NVTX_PAYLOAD_TYPE_FLOAT: e->payload_kind = 3; e->payload_d = a->payload.fValue; break;
        default: break; /* extended payloads are not decoded */
        }
    }
    if (HAS_FIELD(a, message)) {
        switch (a->messageType) {
        case NVTX_MESSAGE_TYPE_ASCII: e->msg = a->message.ascii; break;
        case NVTX_MESSAGE_TYPE_UNICODE: e->msg = owned = wide_to_utf8(a->message.unicode); break;
        case NVTX_MESSAGE_TYPE_REGISTERED: {
            const StringReg *r = (const StringReg *)a->message.registered;
            e->msg = r ? r->text : NULL;
            break;
        }
        default: break;
        }
    }
    return owned;
}

static int is_probe(const char *msg) { return msg && strcmp(msg, PROBE_MESSAGE) == 0; }

/* ---- event handlers ---- */

static int do_push(const Domain *d, Event *e) {
    int *depth = depth_of(d);
    int level = depth ? (*depth)++ : NVTX_NO_PUSH_POP_TRACKING;
    e->kind = K_PUSH;
    e->domain = d;
    e->has_depth = depth != NULL;
    e->depth = level;
    record(e);
    return level;
}

static int do_pop(const Domain *d) {
    int *depth = depth_of(d);
    int level = !depth ? NVTX_NO_PUSH_POP_TRACKING : (*depth > 0 ? --(*depth) : -1);
    Event e = {.kind = K_POP, .domain = d, .has_depth = depth != NULL, .depth = level};
    record(&e);
    return level;
}

static nvtxRangeId_t do_start(const Domain *d, Event *e) {
    uint64_t id = __atomic_fetch_add(&g_next_range_id, 1, __ATOMIC_RELAXED);
    e->kind = K_START;
    e->domain = d;
    e->has_range = 1;
    e->range_id = id;
    record(e);
    return id;
}

static void do_end(const Domain *d, nvtxRangeId_t id) {
    Event e = {.kind = K_END, .domain = d, .has_range = 1, .range_id = id};
    record(&e);
}

static void do_mark(const Domain *d, Event *e) {
    if (is_probe(e->msg)) {
        __atomic_fetch_add(&g_probes, 1, __ATOMIC_RELAXED);
        return;
    }
    e->kind = K_MARK;
    e->domain = d;
    record(e);
}

static void do_name(int kind, const Domain *d, uint32_t id, const char *name) {
    Event e = {.kind = kind, .domain = d, .msg = name};
    if (kind == K_NAME_THREAD) {
        e.has_target = 1;
        e.target_tid = id;
    } else {
        e.category = id;
    }
    record(&e);
}

static const Domain *domain_create(const char *name) {
    if (!name) return NULL;
    pthread_mutex_lock(&g_lock);
    Domain *d = g_domains;
    while (d && strcmp(d->name, name) != 0) d = d->next;
    if (!d && (d = calloc(1, sizeof *d)) != NULL) {
        d->name = xstrdup(name);
        if (!d->name) {
            free(d);
            d = NULL;
        } else {
            d->next = g_domains;
            g_domains = d;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (d) {
        Event e = {.kind = K_DOMAIN_CREATE, .domain = d};
        record(&e);
    }
    return d;
}

static nvtxStringHandle_t register_string(const Domain *d, char *owned_text) {
    StringReg *r = owned_text ? calloc(1, sizeof *r) : NULL;
    if (!r) {
        free(owned_text);
        return NULL;
    }
    r->domain = d;
    r->text = owned_text;
    Event e = {.kind = K_REGISTER_STRING, .domain = d, .msg = r->text};
    record(&e);
    return (nvtxStringHandle_t)r;
}

#define DOM(h) ((const Domain *)(h))

static void h_MarkEx(const nvtxEventAttributes_t *a) {
    Event e = {0};
    char *o = from_attributes(&e, a);
    do_mark(NULL, &e);
    free(o);
}
static void h_MarkA(const char *m) {
    Event e = {.msg = m};
    do_mark(NULL, &e);
}
static void h_MarkW(const wchar_t *m) {
    char *o = wide_to_utf8(m);
    Event e = {.msg = o};
    do_mark(NULL, &e);
    free(o);
}
static nvtxRangeId_t h_RangeStartEx(const nvtxEventAttributes_t *a) {
    Event e = {0};
    char *o = from_attributes(&e, a);
    nvtxRangeId_t id = do_start(NULL, &e);
    free(o);
    return id;
}
static nvtxRangeId_t h_RangeStartA(const char *m) {
    Event e = {.msg = m};
    return do_start(NULL, &e);
}
static nvtxRangeId_t h_RangeStartW(const wchar_t *m) {
    char *o = wide_to_utf8(m);
    Event e = {.msg = o};
    nvtxRangeId_t id = do_start(NULL, &e);
    free(o);
    return id;
}
static void h_RangeEnd(nvtxRangeId_t id) { do_end(NULL, id); }
static int h_RangePushEx(const nvtxEventAttributes_t *a) {
    Event e = {0};
    char *o = from_attributes(&e, a);
    int level = do_push(NULL, &e);
    free(o);
    return level;
}
static int h_RangePushA(const char *m) {
    Event e = {.msg = m};
    return do_push(NULL, &e);
}
static int h_RangePushW(const wchar_t *m) {
    char *o = wide_to_utf8(m);
    Event e = {.msg = o};
    int level = do_push(NULL, &e);
    free(o);
    return level;
}
static int h_RangePop(void) { return do_pop(NULL); }
static void h_NameCategoryA(uint32_t c, const char *n) { do_name(K_NAME_CATEGORY, NULL, c, n); }
static void h_NameCategoryW(uint32_t c, const wchar_t *n) {
    char *o = wide_to_utf8(n);
    do_name(K_NAME_CATEGORY, NULL, c, o);
    free(o);
}
static void h_NameOsThreadA(uint32_t t, const char *n) { do_name(K_NAME_THREAD, NULL, t, n); }
static void h_NameOsThreadW(uint32_t t, const wchar_t *n) {
    char *o = wide_to_utf8(n);
    do_name(K_NAME_THREAD, NULL, t, o);
    free(o);
}

static void h_DomainMarkEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    Event e = {0};
    char *o = from_attributes(&e, a);
    do_mark(DOM(d), &e);
    free(o);
}
static nvtxRangeId_t h_DomainRangeStartEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    Event e = {0};
    char *o = from_attributes(&e, a);
    nvtxRangeId_t id = do_start(DOM(d), &e);
    free(o);
    return id;
}
static void h_DomainRangeEnd(nvtxDomainHandle_t d, nvtxRangeId_t id) { do_end(DOM(d), id); }
static int h_DomainRangePushEx(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) {
    Event e = {0};
    char *o = from_attributes(&e, a);
    int level = do_push(DOM(d), &e);
    free(o);
    return level;
}
static int h_DomainRangePop(nvtxDomainHandle_t d) { return do_pop(DOM(d)); }
static void h_DomainNameCategoryA(nvtxDomainHandle_t d, uint32_t c, const char *n) {
    do_name(K_NAME_CATEGORY, DOM(d), c, n);
}
static void h_DomainNameCategoryW(nvtxDomainHandle_t d, uint32_t c, const wchar_t *n) {
    char *o = wide_to_utf8(n);
    do_name(K_NAME_CATEGORY, DOM(d), c, o);
    free(o);
}
static nvtxStringHandle_t h_DomainRegisterStringA(nvtxDomainHandle_t d, const char *s) {
    return register_string(DOM(d), xstrdup(s));
}
static nvtxStringHandle_t h_DomainRegisterStringW(nvtxDomainHandle_t d, const wchar_t *s) {
    return register_string(DOM(d), wide_to_utf8(s));
}
static nvtxDomainHandle_t h_DomainCreateA(const char *name) { return (nvtxDomainHandle_t)domain_create(name); }
static nvtxDomainHandle_t h_DomainCreateW(const wchar_t *name) {
    char *o = wide_to_utf8(name);
    const Domain *d = domain_create(o);
    free(o);
    return (nvtxDomainHandle_t)d;
}
static void h_DomainDestroy(nvtxDomainHandle_t d) {
    if (!d) return;
    Event e = {.kind = K_DOMAIN_DESTROY, .domain = DOM(d)};
    record(&e);
}
/* nvtxInitialize doubles as a probe: it reaches us only if this tool is attached. */
static void h_Initialize(const void *reserved) {
    (void)reserved;
    __atomic_fetch_add(&g_probes, 1, __ATOMIC_RELAXED);
}

/* ---- installation ---- */

typedef struct Entry {
    unsigned id;
    NvtxFunctionPointer fn;
} Entry;

#define E(id, fn) {id, (NvtxFunctionPointer)(fn)}

static const Entry kCore[] = {
    E(NVTX_CBID_CORE_MarkEx, h_MarkEx),
    E(NVTX_CBID_CORE_MarkA, h_MarkA),
    E(NVTX_CBID_CORE_MarkW, h_MarkW),
    E(NVTX_CBID_CORE_RangeStartEx, h_RangeStartEx),
    E(NVTX_CBID_CORE_RangeStartA, h_RangeStartA),
    E(NVTX_CBID_CORE_RangeStartW, h_RangeStartW),
    E(NVTX_CBID_CORE_RangeEnd, h_RangeEnd),
    E(NVTX_CBID_CORE_RangePushEx, h_RangePushEx),
    E(NVTX_CBID_CORE_RangePushA, h_RangePushA),
    E(NVTX_CBID_CORE_RangePushW, h_RangePushW),
    E(NVTX_CBID_CORE_RangePop, h_RangePop),
    E(NVTX_CBID_CORE_NameCategoryA, h_NameCategoryA),
    E(NVTX_CBID_CORE_NameCategoryW, h_NameCategoryW),
    E(NVTX_CBID_CORE_NameOsThreadA, h_NameOsThreadA),
    E(NVTX_CBID_CORE_NameOsThreadW, h_NameOsThreadW),
};

static const Entry kCore2[] = {
    E(NVTX_CBID_CORE2_DomainMarkEx, h_DomainMarkEx),
    E(NVTX_CBID_CORE2_DomainRangeStartEx, h_DomainRangeStartEx),
    E(NVTX_CBID_CORE2_DomainRangeEnd, h_DomainRangeEnd),
    E(NVTX_CBID_CORE2_DomainRangePushEx, h_DomainRangePushEx),
    E(NVTX_CBID_CORE2_DomainRangePop, h_DomainRangePop),
    E(NVTX_CBID_CORE2_DomainNameCategoryA, h_DomainNameCategoryA),
    E(NVTX_CBID_CORE2_DomainNameCategoryW, h_DomainNameCategoryW),
    E(NVTX_CBID_CORE2_DomainRegisterStringA, h_DomainRegisterStringA),
    E(NVTX_CBID_CORE2_DomainRegisterStringW, h_DomainRegisterStringW),
    E(NVTX_CBID_CORE2_DomainCreateA, h_DomainCreateA),
    E(NVTX_CBID_CORE2_DomainCreateW, h_DomainCreateW),
    E(NVTX_CBID_CORE2_DomainDestroy, h_DomainDestroy),
    E(NVTX_CBID_CORE2_Initialize, h_Initialize),
};

static int install(const NvtxExportTableCallbacks *cb, NvtxCallbackModule module, const Entry *entries,
                   size_t n) {
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;
    if (!cb->GetModuleFunctionTable(module, &table, &size) || !table) return 0;
    for (size_t i = 0; i < n; ++i)
        if (entries[i].id < size && table[entries[i].id]) *table[entries[i].id] = entries[i].fn;
    return 1;
}

EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t getExportTable) {
    ensure_init();
    const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)getExportTable(NVTX_ETID_CALLBACKS);
    if (!cb || cb->struct_size < sizeof *cb || !cb->GetModuleFunctionTable) return 0;
    const NvtxExportTableVersionInfo *vi =
        (const NvtxExportTableVersionInfo *)getExportTable(NVTX_ETID_VERSIONINFO);
    if (vi && vi->struct_size >= sizeof *vi && vi->SetInjectionNvtxVersion) vi->SetInjectionNvtxVersion(NVTX_VERSION);
    if (!install(cb, NVTX_CB_MODULE_CORE, kCore, sizeof kCore / sizeof *kCore)) return 0;
    if (!install(cb, NVTX_CB_MODULE_CORE2, kCore2, sizeof kCore2 / sizeof *kCore2)) return 0;
    __atomic_fetch_add(&g_clients, 1, __ATOMIC_RELAXED);
    return 1;
}

/* ---- API for Python (ctypes) ---- */

EXPORT int nvtx_capture_abi_version(void) { return ABI_VERSION; }

EXPORT int nvtx_capture_clients(void) { return __atomic_load_n(&g_clients, __ATOMIC_RELAXED); }

EXPORT int nvtx_capture_count_mode(void) {
    ensure_init();
    return g_count_only;
}

EXPORT int nvtx_capture_num_kinds(void) { return K_COUNT; }

EXPORT const char *nvtx_capture_kind_name(int kind) {
    return kind >= 0 && kind < K_COUNT ? kKindNames[kind] : NULL;
}

EXPORT void nvtx_capture_counts(uint64_t *out, int n) {
    for (int k = 0; k < n && k < K_COUNT; ++k) out[k] = __atomic_load_n(&g_counts[k], __ATOMIC_RELAXED);
}

EXPORT uint64_t nvtx_capture_probes(void) { return __atomic_load_n(&g_probes, __ATOMIC_RELAXED); }

EXPORT void nvtx_capture_set_recording(int on) {
    ensure_init();
    pthread_mutex_lock(&g_lock);
    g_mem_pid = getpid();
    __atomic_store_n(&g_mem_recording, on ? 1 : 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g_lock);
}

/* Hand the recorded JSON lines to the caller, who frees them with nvtx_capture_free. */
EXPORT size_t nvtx_capture_drain(char **out) {
    pthread_mutex_lock(&g_lock);
    size_t len = g_mem.len;
    *out = g_mem.data;
    if (g_mem_pid != getpid()) len = 0; /* a forked child: these are the parent's */
    g_mem.data = NULL;
    g_mem.len = g_mem.cap = 0;
    pthread_mutex_unlock(&g_lock);
    return len;
}

EXPORT void nvtx_capture_free(void *p) { free(p); }
