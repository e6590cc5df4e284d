/* Profiles: CPU samples and CUDA memory, by merged native + Python stack.
 *
 * Everything is aggregated here, in the kernel; user space reads the maps on
 * a timer (families/profiling/profiler.py):
 * - cpu_samples: (process, user stack, kernel stack, Python stack) -> count,
 *   fed by a perf cpu-clock event on every CPU (on_cpu_sample);
 * - cpu_times: the same samples in time, for the processes that use a probed
 *   library (lib_users: CUDA, NCCL): (process, thread, 65 us bucket) -> the
 *   stacks of the bucket's first sample and the bucket's count. The GPU-idle
 *   accounting joins them with the thread's CUDA calls (analyze/idle.py); the
 *   exported pprof is cpu_samples' alone, whatever this map holds;
 * - mem_alloc / mem_inuse: (process, API, user stack, Python stack) -> bytes
 *   and allocations, fed by the CUDA family's malloc/free return probes
 *   (profile_cuda_alloc / profile_cuda_free, compiled in with
 *   CUDA_MEMORY_PROFILE); mem_live remembers each live device address's
 *   stack and size so a free subtracts from the stack that allocated it;
 * - cuda_calls: (process, API, user stack, Python stack, kernel) -> calls, time
 *   in them, bytes copied and launches, fed by the same return probes for every
 *   copy and synchronize that succeeded (profile_cuda_call), and by the launch
 *   probes for one launch in LAUNCH_STACK_EVERY per kernel (profile_cuda_launch,
 *   counted LAUNCH_STACK_EVERY times): the code that waited for the GPU, copied
 *   or launched, for the AI flame graphs (cuda_wait, cuda_copy, cuda_launches).
 *
 * Stacks are stored once, keyed by a 64-bit hash of their content (no
 * hash-bucket collisions as with BPF_STACK_TRACE ids, memory only as used).
 *
 * Python frames (CPython 3.10-3.13) are read at the sample from the
 * interrupted thread itself. User space puts each Python process's layout in
 * py_procs (families/profiling/python_offsets.py says where every offset comes from);
 * the thread's PyThreadState is the one whose thread_id (pthread_self())
 * equals the thread's TLS base, task_struct.thread.fsbase, at an offset
 * taken from the running kernel's BTF. Each frame is (code object, byte
 * offset of the instruction, flags): ENTRY when the frame was entered from
 * C, i.e. is the first of one _PyEval_EvalFrameDefault call (3.10: every
 * frame; 3.11: is_entry), SHIM for 3.12+'s marker frame that the C stack
 * owns below each such call (user space turns it into ENTRY on the frame
 * above). A code object's name and file are copied once per process into
 * py_codes, its line table (up to PY_TABLE_MAX bytes) in chunks into
 * py_tables, so a process that exits before user space reads the maps, and
 * code freed since (a module's top level, once imported), are still named.
 *
 * Code objects are freed and their addresses reused (a module's code after
 * its import, code made by compile()): every frame carries a tag hashed from
 * its code object's name, file and line table pointers and first line, read
 * at the walk, and a code object is known by (process, tag, address).
 *
 * The Python walk and the code capture run as tail calls (one program per
 * interpreter layout, the layout a compile-time constant in each): one
 * program with every loop inlined costs the verifier over a million steps. */

#define NATIVE_MAX_FRAMES 127
#define PY_FRAME_MASK (PY_MAX_FRAMES - 1)   /* PY_MAX_FRAMES is a power of two */
#define PY_MAX_THREADS 128                  /* thread states searched for a thread */
#define PY_NAME_LEN 128
#define PY_FILE_LEN 256
#define PY_CHUNK_LEN 256                    /* line table bytes per py_tables entry */
#define PY_TABLE_CHUNKS 64                  /* line table bytes copied: 16 KiB at most */
#define PY_TABLE_ENTRIES 8192               /* chunks not yet taken by user space */
#define PY_CAPTURES_PER_SAMPLE 8            /* a later sample captures the rest */
#define PY_CAPTURES_PER_ALLOC 12            /* an allocation may be the only sight of its code
                                               (2 tail calls per code, 33 at most in all) */
#define PY_NO_FIELD 0xffff

#define PYF_ENTRY 1        /* frame: first Python frame of a C-level eval call */
#define PYF_SHIM 2         /* frame: 3.12+ marker frame owned by the C stack (no Python) */
#define STACKF_TRUNCATED 1 /* stack: deeper than could be read */

#define PY_PENDING 0       /* py_procs states */
#define PY_NATIVE 1
#define PY_PYTHON 2

#define LAYOUT_310 1       /* PyFrameObject chain, f_lasti in code units */
#define LAYOUT_311 2       /* _PyInterpreterFrame, is_entry flag */
#define LAYOUT_312 3       /* _PyInterpreterFrame, entry frames owned by the C stack */
#define LAYOUT_313 4       /* as 3.12, and f_executable may be other than code */
#define PROG_TABLE 6       /* index of the line-table program in the prog arrays */
#define PROG_CAPTURE 7     /* index of the code-capture program in the prog arrays */

/* profile_stats[] slots: drops counted here, exported by the profiler. */
#define PSTAT_SAMPLES_FULL 0     /* cpu_samples full */
#define PSTAT_STACKS_FULL 1      /* stacks / py_stacks full */
#define PSTAT_CODES_FULL 2       /* py_codes full (or no memory for it here and now) */
#define PSTAT_PROCS_FULL 3       /* py_procs full */
#define PSTAT_MEM_FULL 4         /* mem_alloc / mem_inuse / cuda_calls full */
#define PSTAT_LIVE_FULL 5        /* mem_live full: an allocation is not in inuse */
#define PSTAT_EVENT_LOST 6       /* ring full: a new process was not announced */
#define PSTAT_TABLES_FULL 7      /* py_tables full: a line table is cut */
#define PSTAT_TIMES_FULL 8       /* cpu_times full: a sample is in the profile, not in the timeline */
#define PSTAT_MAX 9

/* cpu_times buckets: 2^16 ns (65.5 us), fine enough to place a sample in a 0.5 ms gap between
 * CUDA calls (2^20 ns buckets lost about half the samples of such gaps: a sample is placed at
 * its bucket's middle). At up to 1,000 Hz a thread has one sample per bucket either way: as
 * many entries. */
#define TIME_BUCKET_SHIFT 16
#ifndef TIME_ENTRIES
#define TIME_ENTRIES 16384
#endif

struct native_stack {
    u32 len;
    u32 flags;
    u64 ip[NATIVE_MAX_FRAMES];
};

struct py_frame {
    u64 code;
    s32 offset;     /* bytes from the first instruction; negative: not started */
    u32 flags;      /* PYF_* */
    u32 tag;        /* which code object lives at `code` (see code_tag) */
    u32 pad;
};

struct py_stack {
    u32 len;
    u32 flags;
    struct py_frame f[PY_MAX_FRAMES];
};

/* Where things are in one CPython build (a u16 byte offset each). */
struct py_offsets {
    u16 runtime_interp_head;  /* _PyRuntimeState.interpreters.head */
    u16 interp_threads_head;  /* PyInterpreterState.threads.head (3.10: tstate_head) */
    u16 tstate_next;
    u16 tstate_thread_id;
    u16 tstate_frame;         /* 3.10 frame, 3.11/3.12 cframe, 3.13 current_frame */
    u16 cframe_current;       /* _PyCFrame.current_frame, PY_NO_FIELD without cframe */
    u16 frame_previous;
    u16 frame_code;
    u16 frame_instr;          /* 3.10 f_lasti (int), else prev_instr / instr_ptr */
    u16 frame_owner;          /* u8, PY_NO_FIELD in 3.10 */
    u16 frame_is_entry;       /* u8, 3.11 only */
    u16 frame_size;           /* bytes read per frame, covering every field above */
    u16 code_filename;
    u16 code_name;            /* co_qualname where it exists, else co_name */
    u16 code_firstlineno;
    u16 code_linetable;
    u16 code_adaptive;        /* co_code_adaptive (3.11+) */
    u16 code_size;            /* bytes read per code object */
    u16 code_tag_start;       /* the walker reads [start, start + size) of each code object: */
    u16 code_tag_size;        /* first line, file, name, line table, version, type */
    u16 code_version;         /* co_version (3.12+), PY_NO_FIELD before */
    u16 unicode_state;
    u16 unicode_length;
    u16 unicode_ascii_data;   /* sizeof(PyASCIIObject) */
    u16 unicode_compact_data; /* sizeof(PyCompactUnicodeObject) */
    u16 bytes_size;
    u16 bytes_data;
    u16 object_type;
    u8 layout;                /* LAYOUT_* */
    u8 owner_cstack;          /* FRAME_OWNED_BY_CSTACK (3.12+) */
};

struct py_proc {
    u32 state;                /* PY_* */
    u32 pad;
    u64 runtime;              /* &_PyRuntime in this process */
    u64 code_type;            /* &PyCode_Type, checked in 3.13 (f_executable) */
    struct py_offsets o;
};

struct py_code_key {
    u32 pid;
    u32 tag;
    u64 code;
};

/* Part `index` of a code object's line table. */
struct py_chunk_key {
    struct py_code_key code;
    u32 index;
    u32 pad;
};

struct py_chunk {
    u8 b[PY_CHUNK_LEN];
};

struct py_code {
    u32 firstlineno;
    u16 name_len;
    u16 file_len;
    u8 name_kind;             /* 0 ASCII, else PyUnicode kind: 1 latin-1, 2 UCS-2, 4 UCS-4 */
    u8 file_kind;
    u8 file_cut;              /* the file name was longer: these are its last bytes */
    u8 pad;
    u32 table_len;            /* bytes of the line table copied (into py_tables) */
    u32 table_size;           /* its full size */
    u64 table_addr;           /* where the rest is, while the process lives */
    u64 captured_ns;          /* of two code objects at one address, the later is live */
    char name[PY_NAME_LEN];
    char file[PY_FILE_LEN];
};

struct sample_key {
    u32 pid;
    u32 pad;
    u64 user;                 /* stack hashes; 0: none */
    u64 kernel;
    u64 py;
};

struct time_key {
    u32 pid;
    u32 tid;
    u64 bucket;               /* bpf_ktime_get_ns() >> TIME_BUCKET_SHIFT */
};

struct time_val {
    u64 user;                 /* the bucket's first sample's stacks (as sample_key) */
    u64 kernel;
    u64 py;
    u64 count;
};

struct mem_key {
    u32 pid;
    u32 func;                 /* CudaFunc of the allocating call */
    u64 user;
    u64 py;
};

struct mem_val {
    u64 bytes;
    u64 count;
};

struct call_val {
    u64 calls;
    u64 ns;                   /* time in the calls (the thread blocked: waiting for the GPU, or staging) */
    u64 bytes;                /* copied (copies only) */
    u64 launches;             /* kernel launches: LAUNCH_STACK_EVERY per sampled one */
};

/* cuda_calls' key: the call's stacks, and for a launch the kernel's handle (0 otherwise). */
struct call_key {
    struct mem_key k;
    u64 kernel;
};

struct live_key {
    u32 pid;
    u32 pad;
    u64 addr;
};

struct live_val {
    struct mem_key k;
    u64 size;
};

struct py_thread {
    u64 tstate;               /* 0: no Python thread state when last searched */
    u64 checked_ns;
};

struct frame_buf {
    u8 b[256 + 8];
};

/* What a sample or an allocation carries across its tail calls (per CPU). */
struct pending_sample {
    struct sample_key k;
    u32 captures;
    u32 pad;
};

/* An allocation, or a copy or synchronize (PENDING_CALL: `size` bytes copied,
 * `addr` the ns in the call), waiting for its Python stack. */
#define PENDING_ALLOC 1
#define PENDING_CALL 2
#define PENDING_LAUNCH 3          /* a sampled launch: `kernel` launched, weighs LAUNCH_STACK_EVERY */
#ifndef LAUNCH_STACK_EVERY
#define LAUNCH_STACK_EVERY 0
#endif
struct pending_alloc {
    struct mem_key k;
    u64 size;
    u64 addr;
    u32 active;               /* 0, PENDING_ALLOC, PENDING_CALL or PENDING_LAUNCH */
    u32 captures;
    u64 kernel;               /* PENDING_LAUNCH: the kernel's handle */
};

BPF_HASH(cpu_samples, struct sample_key, u64, SAMPLE_ENTRIES);
BPF_HASH(cpu_times, struct time_key, struct time_val, TIME_ENTRIES);
BPF_F_TABLE("hash", u64, struct native_stack, stacks, STACK_ENTRIES, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", u64, struct py_stack, py_stacks, STACK_ENTRIES, BPF_F_NO_PREALLOC);
BPF_HASH(py_procs, u32, struct py_proc, 16384);
BPF_TABLE("lru_hash", u32, struct py_thread, py_threads, 16384);
/* Without preallocation, an update takes its element from a small per-CPU
 * cache (refilled after the program, not during it): fewer in it the larger
 * the element. So py_code holds no line table (one element of ~500 bytes,
 * 16 cached at least; with the table in it, 1.5 KiB, the fifth capture in a
 * row could fail), and tables go to a preallocated map of small chunks that
 * user space empties at every read. */
BPF_F_TABLE("hash", struct py_code_key, struct py_code, py_codes, CODE_ENTRIES, BPF_F_NO_PREALLOC);
BPF_HASH(py_tables, struct py_chunk_key, struct py_chunk, PY_TABLE_ENTRIES);
BPF_HASH(mem_alloc, struct mem_key, struct mem_val, MEM_ENTRIES);
BPF_HASH(mem_inuse, struct mem_key, struct mem_val, MEM_ENTRIES);
BPF_F_TABLE("hash", struct live_key, struct live_val, mem_live, LIVE_ENTRIES, BPF_F_NO_PREALLOC);
BPF_HASH(cuda_calls, struct call_key, struct call_val, MEM_ENTRIES);
BPF_PERCPU_ARRAY(profile_stats, u64, PSTAT_MAX);
/* Per-CPU scratch: these are too big for the 512-byte BPF stack. */
BPF_PERCPU_ARRAY(scratch_native, struct native_stack, 1);
BPF_PERCPU_ARRAY(scratch_py, struct py_stack, 1);
BPF_PERCPU_ARRAY(scratch_code, struct py_code, 1);
BPF_PERCPU_ARRAY(scratch_code_key, struct py_code_key, 1);  /* the code scratch_code describes */
BPF_PERCPU_ARRAY(scratch_chunk, struct py_chunk, 1);
BPF_PERCPU_ARRAY(scratch_buf, struct frame_buf, 1);
BPF_PERCPU_ARRAY(pending_samples, struct pending_sample, 1);
BPF_PERCPU_ARRAY(pending_allocs, struct pending_alloc, 1);
/* Tail-call targets, by layout (and PROG_TABLE, PROG_CAPTURE); filled by user space. */
BPF_PROG_ARRAY(cpu_progs, 8);
BPF_PROG_ARRAY(mem_progs, 8);

static __always_inline void profile_stat(u32 slot)
{
    u64 *v = profile_stats.lookup(&slot);
    if (v)
        (*v)++;
}

/* splitmix64's finaliser over the running hash: stacks differing anywhere
 * get different keys with overwhelming probability. */
static __always_inline u64 mix(u64 h, u64 v)
{
    h ^= v;
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return h;
}

static __always_inline u64 load64(struct frame_buf *fb, u16 off)
{
    return *(u64 *)&fb->b[off & 0xff];
}

static __always_inline u32 load32(struct frame_buf *fb, u16 off)
{
    return *(u32 *)&fb->b[off & 0xff];
}

/* The user (BPF_F_USER_STACK) or kernel stack of ctx, stored in `stacks`;
 * returns its hash, 0 when there is none. */
static __always_inline u64 native_stack(void *ctx, u64 flags)
{
    u32 zero = 0;
    struct native_stack *s = scratch_native.lookup(&zero);
    if (!s)
        return 0;
    long n = bpf_get_stack(ctx, s->ip, sizeof(s->ip), flags);
    if (n <= 0)
        return 0;
    u32 len = n / 8;
    s->len = len;
    s->flags = len >= NATIVE_MAX_FRAMES ? STACKF_TRUNCATED : 0;
    u64 h = mix(0x6f74656c627066ULL, flags);
    for (int i = 0; i < NATIVE_MAX_FRAMES; i++) {
        if (i >= len)
            break;
        h = mix(h, s->ip[i]);
    }
    if (h == 0)
        h = 1;
    if (!stacks.lookup(&h) && stacks.update(&h, s) != 0) {
        profile_stat(PSTAT_STACKS_FULL);
        return 0;
    }
    return h;
}

/* Copy a PyUnicode object's characters (compact strings only: names and
 * file names always are). `tail`: keep the last bytes of a long string. */
static __always_inline u32 read_pystr(struct py_proc *p, u64 obj, char *dst, u32 cap, u8 *kind_out, u8 *cut, int tail)
{
    u32 state = 0;
    u64 length = 0;
    if (!obj)
        return 0;
    read_user(&state, sizeof(state), (void *)(obj + p->o.unicode_state));
    read_user(&length, sizeof(length), (void *)(obj + p->o.unicode_length));
    u32 kind = (state >> 2) & 7;
    if (!((state >> 5) & 1) || kind == 0 || kind == 3 || kind > 4)
        return 0;
    u32 ascii = (state >> 6) & 1;
    u64 data = obj + (ascii ? p->o.unicode_ascii_data : p->o.unicode_compact_data);
    u64 bytes = length * kind;
    if (bytes > cap) {
        if (tail) {
            data += bytes - cap;
            *cut = 1;
        }
        bytes = cap;
    }
    u32 n = bytes;
    if (n > cap)
        n = cap;
    read_user(dst, n, (void *)data);
    *kind_out = ascii ? 0 : kind;
    return n;
}

/* The line table into py_tables, before the code's py_codes entry (which
 * tells user space to look there); returns the bytes copied. A module's top
 * level, long as it often is, runs once and is freed: its table cannot be
 * read from the process later. */
static __always_inline u32 copy_table(struct py_code_key *k, u64 addr, u64 size)
{
    u32 zero = 0;
    struct py_chunk *chunk = scratch_chunk.lookup(&zero);
    if (!chunk)
        return 0;
    struct py_chunk_key ck = {.code = *k};
    u32 i = 0;
    /* Offsets from i alone: a running total makes each iteration's states
     * differ, and the verifier walks 2^PY_TABLE_CHUNKS of them. */
    for (; i < PY_TABLE_CHUNKS; i++) {
        u64 off = (u64)i * PY_CHUNK_LEN;
        if (off >= size)
            break;
        u32 n = size - off > PY_CHUNK_LEN ? PY_CHUNK_LEN : size - off;
        if (read_user(chunk->b, n, (void *)(addr + off)) != 0)
            break;
        ck.index = i;
        if (py_tables.update(&ck, chunk) != 0) {
            profile_stat(PSTAT_TABLES_FULL);
            break;
        }
    }
    u64 copied = (u64)i * PY_CHUNK_LEN;
    return copied > size ? size : copied;
}

/* Name, file and first line of a code object, into scratch_code (its line
 * table is copied by the PROG_TABLE program, which stores the code: the two
 * loops in one program are more than the verifier takes); returns whether
 * the code object could be read. */
static __always_inline int capture_code(struct py_proc *p, struct py_code_key *k)
{
    u32 zero = 0;
    struct py_code *c = scratch_code.lookup(&zero);
    struct py_code_key *ck = scratch_code_key.lookup(&zero);
    struct frame_buf *fb = scratch_buf.lookup(&zero);
    if (!c || !ck || !fb)
        return 0;
    if (read_user(fb->b, p->o.code_size & 0xff, (void *)k->code) != 0)
        return 0;
    *ck = *k;
    c->firstlineno = load32(fb, p->o.code_firstlineno);
    c->captured_ns = bpf_ktime_get_ns();
    c->name_kind = c->file_kind = c->file_cut = 0;
    u8 ignored = 0;
    c->name_len = read_pystr(p, load64(fb, p->o.code_name), c->name, PY_NAME_LEN, &c->name_kind, &ignored, 0);
    c->file_len = read_pystr(p, load64(fb, p->o.code_filename), c->file, PY_FILE_LEN, &c->file_kind, &c->file_cut, 1);
    u64 table = load64(fb, p->o.code_linetable);
    u64 size = 0;
    read_user(&size, sizeof(size), (void *)(table + p->o.bytes_size));
    c->table_size = size;
    c->table_addr = table + p->o.bytes_data;
    c->table_len = 0;
    return 1;
}

/* The line table of the code in scratch_code, then the code itself. */
static __always_inline void store_code(void)
{
    u32 zero = 0;
    struct py_code *c = scratch_code.lookup(&zero);
    struct py_code_key *k = scratch_code_key.lookup(&zero);
    if (!c || !k)
        return;
    c->table_len = copy_table(k, c->table_addr, c->table_size);
    if (py_codes.update(k, c) != 0)
        profile_stat(PSTAT_CODES_FULL);
}

/* Which code object lives at an address, from fields fixed for its life
 * (read into fb from code_tag_start): a code object freed and another made
 * at its address gets another tag, so neither is named as the other. 3.12+
 * number every code object made (co_version). Before, an allocator hands a
 * freed code's name, file and table addresses to the next code of the same
 * shape: the table's size and first bytes tell them apart. */
static __always_inline u32 code_tag(struct py_proc *p, struct frame_buf *fb, const u8 layout)
{
    u16 start = p->o.code_tag_start;
    u64 table = load64(fb, p->o.code_linetable - start);
    u64 t = mix(load32(fb, p->o.code_firstlineno - start), load64(fb, p->o.code_filename - start));
    t = mix(t, load64(fb, p->o.code_name - start));
    t = mix(t, table);
    if (layout == LAYOUT_310 || layout == LAYOUT_311) {
        u64 head[4] = {};  /* ob_size, ob_shash (cached late: not used), 16 bytes of data */
        read_user(head, sizeof(head), (void *)(table + p->o.bytes_size));
        t = mix(mix(mix(t, head[0]), head[2]), head[3]);
    } else {
        t = mix(t, load32(fb, p->o.code_version - start));
    }
    return (u32)(t ^ (t >> 32));
}

/* This thread's PyThreadState, or 0. Cached per thread and checked against
 * the thread id each time (thread states are freed and reused). */
static __always_inline u64 find_tstate(struct py_proc *p, u32 tid)
{
    u64 fsbase = 0;
    u64 task = bpf_get_current_task();
    bpf_probe_read_kernel(&fsbase, sizeof(fsbase), (void *)(task + TASK_FSBASE_OFFSET));
    if (!fsbase)
        return 0;
    u64 now = bpf_ktime_get_ns();
    struct py_thread *cached = py_threads.lookup(&tid);
    if (cached) {
        if (cached->tstate) {
            u64 id = 0;
            read_user(&id, sizeof(id), (void *)(cached->tstate + p->o.tstate_thread_id));
            if (id == fsbase)
                return cached->tstate;
        } else if (now - cached->checked_ns < 1000000000ULL) {
            return 0;  /* searched within the last second: not a Python thread */
        }
    }
    struct py_thread found = {.tstate = 0, .checked_ns = now};
    u64 interp = 0, t = 0;
    read_user(&interp, sizeof(interp), (void *)(p->runtime + p->o.runtime_interp_head));
    if (interp)
        read_user(&t, sizeof(t), (void *)(interp + p->o.interp_threads_head));
    for (int i = 0; i < PY_MAX_THREADS; i++) {
        if (!t)
            break;
        u64 id = 0;
        read_user(&id, sizeof(id), (void *)(t + p->o.tstate_thread_id));
        if (id == fsbase) {
            found.tstate = t;
            break;
        }
        u64 next = 0;
        read_user(&next, sizeof(next), (void *)(t + p->o.tstate_next));
        t = next;
    }
    py_threads.update(&tid, &found);
    return found.tstate;
}

/* Walk the thread's Python frames into scratch_py and py_stacks; returns
 * the stack's hash, 0 when the thread runs no Python. `layout` is a
 * constant in every caller, so each walker program has only its own
 * version's branches. */
static __always_inline u64 python_stack(struct py_proc *p, u32 tid, const u8 layout)
{
    u64 tstate = find_tstate(p, tid);
    if (!tstate)
        return 0;
    u64 frame = 0;
    read_user(&frame, sizeof(frame), (void *)(tstate + p->o.tstate_frame));
    if (layout == LAYOUT_311 || layout == LAYOUT_312) {
        u64 cframe = frame;
        frame = 0;
        if (cframe)
            read_user(&frame, sizeof(frame), (void *)(cframe + p->o.cframe_current));
    }
    if (!frame)
        return 0;
    u32 zero = 0;
    struct py_stack *st = scratch_py.lookup(&zero);
    struct frame_buf *fb = scratch_buf.lookup(&zero);
    if (!st || !fb)
        return 0;
    st->len = 0;
    st->flags = 0;
    u64 h = 0x7079737461636bULL;
    for (int i = 0; i < PY_MAX_FRAMES + 8; i++) {
        if (!frame)
            break;
        if (read_user(fb->b, p->o.frame_size & 0xff, (void *)frame) != 0) {
            st->flags |= STACKF_TRUNCATED;
            frame = 0;
            break;
        }
        u64 code = load64(fb, p->o.frame_code);
        u64 previous = load64(fb, p->o.frame_previous);
        u32 n = st->len;
        if (n >= PY_MAX_FRAMES)
            break;
        struct py_frame *f = &st->f[n & PY_FRAME_MASK];
        if (layout == LAYOUT_310) {
            f->offset = (s32)load32(fb, p->o.frame_instr) * 2;
            f->flags = PYF_ENTRY;
        } else {
            f->offset = (s32)(load64(fb, p->o.frame_instr) - code - p->o.code_adaptive);
            if (layout == LAYOUT_311)
                f->flags = fb->b[p->o.frame_is_entry & 0xff] != 0 ? PYF_ENTRY : 0;
            else  /* the C stack's marker below each eval call: user space drops it */
                f->flags = fb->b[p->o.frame_owner & 0xff] == p->o.owner_cstack ? PYF_SHIM : 0;
        }
        f->tag = 0;
        if (code && read_user(fb->b, p->o.code_tag_size & 0xff, (void *)(code + p->o.code_tag_start)) == 0) {
            f->tag = code_tag(p, fb, layout);
            /* 3.13: f_executable is not always code */
            if (layout == LAYOUT_313 && load64(fb, p->o.object_type - p->o.code_tag_start) != p->code_type)
                code = 0;
        } else {
            code = 0;
        }
        f->code = code;
        f->pad = 0;
        st->len = n + 1;
        h = mix(h, code);
        h = mix(h, ((u64)f->flags << 32) | (u32)f->offset);
        h = mix(h, f->tag);
        frame = previous;
    }
    if (frame)
        st->flags |= STACKF_TRUNCATED;
    if (st->len == 0)
        return 0;
    h = mix(h, st->flags);
    if (h == 0)
        h = 1;
    if (!py_stacks.lookup(&h) && py_stacks.update(&h, st) != 0) {
        profile_stat(PSTAT_STACKS_FULL);
        return 0;
    }
    return h;
}

/* Read one code object of the walked stack (scratch_py) that this process
 * has not had copied yet into scratch_code; returns whether there was one.
 * The capture program tail-calls the table program, which stores it and
 * tail-calls the capture for the next, PY_CAPTURES_PER_SAMPLE at most. */
static __always_inline int capture_missing(u32 tgid)
{
    u32 zero = 0;
    struct py_proc *p = py_procs.lookup(&tgid);
    struct py_stack *st = scratch_py.lookup(&zero);
    if (!p || !st)
        return 0;
    struct py_code_key k = {.pid = tgid};
    u32 len = st->len;
    for (int i = 0; i < PY_MAX_FRAMES; i++) {
        if (i >= len)
            return 0;
        k.code = st->f[i & PY_FRAME_MASK].code;
        k.tag = st->f[i & PY_FRAME_MASK].tag;
        if (k.code && !py_codes.lookup(&k))
            break;
    }
    if (!k.code)
        return 0;
    return capture_code(p, &k);
}

/* First sight of a process: mark it pending and ask user space what it is. */
static __always_inline struct py_proc *announce_process(u64 id)
{
    u32 tgid = id >> 32;
    struct py_proc *p = py_procs.lookup(&tgid);
    if (p)
        return p;
    struct py_proc pending = {.state = PY_PENDING};
    if (py_procs.insert(&tgid, &pending) != 0) {
        profile_stat(PSTAT_PROCS_FULL);
        return 0;
    }
    struct event e = {};
    new_event(&e, id, EV_PROFILE_PROC, 0);
    u64 flags = events_wake();
    if (events.ringbuf_output(&e, sizeof(e), flags) != 0)
        profile_stat(PSTAT_EVENT_LOST);
    return 0;
}

/* The sample in time, for processes that use a probed library (sched.c's set). */
static __always_inline void time_sample(struct sample_key *k)
{
    u32 tgid = k->pid;
    if (!lib_users.lookup(&tgid))
        return;
    struct time_key tk = {.pid = tgid, .tid = (u32)bpf_get_current_pid_tgid(),
                          .bucket = bpf_ktime_get_ns() >> TIME_BUCKET_SHIFT};
    struct time_val *v = cpu_times.lookup(&tk);
    if (v) {
        __sync_fetch_and_add(&v->count, 1);
        return;
    }
    struct time_val first = {.user = k->user, .kernel = k->kernel, .py = k->py, .count = 1};
    if (cpu_times.insert(&tk, &first) != 0) {
        v = cpu_times.lookup(&tk);  /* another CPU created it first */
        if (v)
            __sync_fetch_and_add(&v->count, 1);
        else
            profile_stat(PSTAT_TIMES_FULL);
    }
}

static __always_inline void count_sample(struct sample_key *k)
{
    time_sample(k);
    u64 *count = cpu_samples.lookup(k);
    if (count) {
        __sync_fetch_and_add(count, 1);
        return;
    }
    u64 one = 1;
    if (cpu_samples.insert(k, &one) != 0) {
        count = cpu_samples.lookup(k);  /* another CPU created it first */
        if (count)
            __sync_fetch_and_add(count, 1);
        else
            profile_stat(PSTAT_SAMPLES_FULL);
    }
}

/* perf cpu-clock, every CPU: native stacks here, then the Python walker
 * for the process's layout and the code capture, as tail calls. Each step
 * counts the sample itself if the next cannot run. */
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (tgid == 0 || !is_watched(tgid))
        return 0;
    u32 zero = 0;
    struct pending_sample *ps = pending_samples.lookup(&zero);
    if (!ps)
        return 0;
    struct py_proc *p = announce_process(id);
    ps->k.pid = tgid;
    ps->k.pad = 0;
    ps->k.user = native_stack(ctx, BPF_F_USER_STACK);
    ps->k.kernel = native_stack(ctx, 0);
    ps->k.py = 0;
    ps->captures = 0;
#if TASK_FSBASE_OFFSET > 0
    if (p && p->state == PY_PYTHON)
        cpu_progs.call(ctx, p->o.layout);
#endif
    count_sample(&ps->k);
    return 0;
}

static __always_inline int walk_sample(struct bpf_perf_event_data *ctx, const u8 layout)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, zero = 0;
    struct pending_sample *ps = pending_samples.lookup(&zero);
    struct py_proc *p = py_procs.lookup(&tgid);
    if (!ps || !p)
        return 0;
    ps->k.py = python_stack(p, (u32)id, layout);
    if (ps->k.py)
        cpu_progs.call(ctx, PROG_CAPTURE);
    count_sample(&ps->k);
    return 0;
}

int py_sample_310(struct bpf_perf_event_data *ctx) { return walk_sample(ctx, LAYOUT_310); }
int py_sample_311(struct bpf_perf_event_data *ctx) { return walk_sample(ctx, LAYOUT_311); }
int py_sample_312(struct bpf_perf_event_data *ctx) { return walk_sample(ctx, LAYOUT_312); }
int py_sample_313(struct bpf_perf_event_data *ctx) { return walk_sample(ctx, LAYOUT_313); }

int py_sample_capture(struct bpf_perf_event_data *ctx)
{
    u32 zero = 0;
    struct pending_sample *ps = pending_samples.lookup(&zero);
    if (!ps)
        return 0;
    if (capture_missing(ps->k.pid))
        cpu_progs.call(ctx, PROG_TABLE);
    count_sample(&ps->k);
    return 0;
}

int py_sample_table(struct bpf_perf_event_data *ctx)
{
    u32 zero = 0;
    struct pending_sample *ps = pending_samples.lookup(&zero);
    if (!ps)
        return 0;
    store_code();
    if (++ps->captures < PY_CAPTURES_PER_SAMPLE)
        cpu_progs.call(ctx, PROG_CAPTURE);
    count_sample(&ps->k);
    return 0;
}

#ifdef CUDA_MEMORY_PROFILE
static __always_inline void mem_account(struct mem_key *k, u64 bytes, int inuse)
{
    struct mem_val *v = inuse ? mem_inuse.lookup(k) : mem_alloc.lookup(k);
    if (!v) {
        struct mem_val zero = {};
        if (inuse)
            mem_inuse.insert(k, &zero);
        else
            mem_alloc.insert(k, &zero);
        v = inuse ? mem_inuse.lookup(k) : mem_alloc.lookup(k);
        if (!v) {
            profile_stat(PSTAT_MEM_FULL);
            return;
        }
    }
    __sync_fetch_and_add(&v->bytes, bytes);
    __sync_fetch_and_add(&v->count, 1);
}

static __always_inline void mem_release(struct live_val *lv)
{
    struct mem_val *v = mem_inuse.lookup(&lv->k);
    if (v) {
        __sync_fetch_and_add(&v->bytes, -lv->size);
        __sync_fetch_and_add(&v->count, -1);
    }
}

static __always_inline void call_account(struct pending_alloc *pa, u32 what)
{
    struct call_key ck = {.k = pa->k, .kernel = what == PENDING_LAUNCH ? pa->kernel : 0};
    struct call_val *v = cuda_calls.lookup(&ck);
    if (!v) {
        struct call_val zero = {};
        cuda_calls.insert(&ck, &zero);
        v = cuda_calls.lookup(&ck);
        if (!v) {
            profile_stat(PSTAT_MEM_FULL);
            return;
        }
    }
    if (what == PENDING_LAUNCH) {
        __sync_fetch_and_add(&v->calls, LAUNCH_STACK_EVERY);
        __sync_fetch_and_add(&v->launches, LAUNCH_STACK_EVERY);
        return;
    }
    __sync_fetch_and_add(&v->calls, 1);
    __sync_fetch_and_add(&v->ns, pa->addr);
    __sync_fetch_and_add(&v->bytes, pa->size);
}

/* Account the pending allocation or call (its stacks are complete now). */
static __always_inline void finish_alloc(struct pending_alloc *pa)
{
    u32 what = pa->active;
    if (!what)
        return;
    pa->active = 0;
    if (what == PENDING_CALL || what == PENDING_LAUNCH) {
        call_account(pa, what);
        return;
    }
    struct live_key lk = {.pid = pa->k.pid, .addr = pa->addr};
    struct live_val *old = mem_live.lookup(&lk);
    if (old)  /* its free was never seen: stop counting it in use */
        mem_release(old);
    struct live_val lv = {.k = pa->k, .size = pa->size};
    mem_account(&lv.k, lv.size, 0);
    if (mem_live.update(&lk, &lv) != 0) {
        profile_stat(PSTAT_LIVE_FULL);
        return;
    }
    mem_account(&lv.k, lv.size, 1);
}

/* A device allocation of `size` bytes at `addr` succeeded: called by the
 * CUDA family's return probe, so the stack is the allocating caller's. The
 * Python stack is added by profile_cuda_finish, which that probe calls last. */
static __always_inline void profile_cuda_alloc(struct pt_regs *ctx, u64 id, u8 func, u64 size, u64 addr)
{
    u32 zero = 0;
    struct pending_alloc *pa = pending_allocs.lookup(&zero);
    if (!pa)
        return;
    announce_process(id);
    pa->k.pid = id >> 32;
    pa->k.func = func;
    pa->k.user = native_stack(ctx, BPF_F_USER_STACK);
    pa->k.py = 0;
    pa->size = size;
    pa->addr = addr;
    pa->active = PENDING_ALLOC;
    pa->captures = 0;
    pa->kernel = 0;
}

/* A copy (`bytes` copied) or synchronize that succeeded after `ns` in the call:
 * accounted like an allocation, on the caller's merged stack (cuda_calls). */
static __always_inline void profile_cuda_call(struct pt_regs *ctx, u64 id, u8 func, u64 ns, u64 bytes)
{
    profile_cuda_alloc(ctx, id, func, bytes, ns);
    u32 zero = 0;
    struct pending_alloc *pa = pending_allocs.lookup(&zero);
    if (pa)
        pa->active = PENDING_CALL;
}

/* The `seen`-th launch of kernel `fn` by this process (cuda.c count_launch): one in
 * LAUNCH_STACK_EVERY takes the launching code's merged stack (the first, then every Nth), and
 * counts LAUNCH_STACK_EVERY launches on it, the kernel on top (cuda_calls). 1: the caller
 * then calls profile_cuda_finish for the Python stack. A user stack per launch would cost each
 * launch ~0.6-1.6 us, at up to 10^5-10^6 launches a second. */
static __always_inline int profile_cuda_launch(struct pt_regs *ctx, u64 id, u8 func, u64 fn, u64 seen)
{
#if LAUNCH_STACK_EVERY > 0
    if (seen % LAUNCH_STACK_EVERY)
        return 0;
    profile_cuda_alloc(ctx, id, func, 0, 0);
    u32 zero = 0;
    struct pending_alloc *pa = pending_allocs.lookup(&zero);
    if (!pa)
        return 0;
    pa->active = PENDING_LAUNCH;
    pa->kernel = fn;
    return 1;
#else
    return 0;
#endif
}

static __always_inline void profile_cuda_finish(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct pending_alloc *pa = pending_allocs.lookup(&zero);
    if (!pa || !pa->active)
        return;
#if TASK_FSBASE_OFFSET > 0
    u32 tgid = pa->k.pid;
    struct py_proc *p = py_procs.lookup(&tgid);
    if (p && p->state == PY_PYTHON)
        mem_progs.call(ctx, p->o.layout);
#endif
    finish_alloc(pa);
}

static __always_inline int walk_alloc(struct pt_regs *ctx, const u8 layout)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, zero = 0;
    struct pending_alloc *pa = pending_allocs.lookup(&zero);
    struct py_proc *p = py_procs.lookup(&tgid);
    if (!pa || !p)
        return 0;
    pa->k.py = python_stack(p, (u32)id, layout);
    if (pa->k.py)
        mem_progs.call(ctx, PROG_CAPTURE);
    finish_alloc(pa);
    return 0;
}

int py_alloc_310(struct pt_regs *ctx) { return walk_alloc(ctx, LAYOUT_310); }
int py_alloc_311(struct pt_regs *ctx) { return walk_alloc(ctx, LAYOUT_311); }
int py_alloc_312(struct pt_regs *ctx) { return walk_alloc(ctx, LAYOUT_312); }
int py_alloc_313(struct pt_regs *ctx) { return walk_alloc(ctx, LAYOUT_313); }

int py_alloc_capture(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct pending_alloc *pa = pending_allocs.lookup(&zero);
    if (!pa)
        return 0;
    if (capture_missing(pa->k.pid))
        mem_progs.call(ctx, PROG_TABLE);
    finish_alloc(pa);
    return 0;
}

int py_alloc_table(struct pt_regs *ctx)
{
    u32 zero = 0;
    struct pending_alloc *pa = pending_allocs.lookup(&zero);
    if (!pa)
        return 0;
    store_code();
    if (++pa->captures < PY_CAPTURES_PER_ALLOC)
        mem_progs.call(ctx, PROG_CAPTURE);
    finish_alloc(pa);
    return 0;
}

/* A device address was freed. */
static __always_inline void profile_cuda_free(u64 id, u64 addr)
{
    struct live_key lk = {.pid = id >> 32, .addr = addr};
    struct live_val *lv = mem_live.lookup(&lk);
    if (!lv)
        return;
    mem_release(lv);
    mem_live.delete(&lk);
}
#endif
