/* Profiles: CPU samples and CUDA memory, by merged native + Python stack.
 *
 * Everything is aggregated here, in the kernel; user space reads the maps on
 * a timer (correlate/profiles.py):
 * - cpu_samples: (process, user stack, kernel stack, Python stack) -> count,
 *   fed by a perf cpu-clock event on every CPU (on_cpu_sample);
 * - mem_alloc / mem_inuse: (process, API, user stack, Python stack) -> bytes
 *   and allocations, fed by the CUDA family's malloc/free return probes
 *   (profile_cuda_alloc / profile_cuda_free, compiled in with
 *   CUDA_MEMORY_PROFILE); mem_live remembers each live device address's
 *   stack and size so a free subtracts from the stack that allocated it.
 *
 * Stacks are stored once, keyed by a 64-bit hash of their content (no
 * hash-bucket collisions as with BPF_STACK_TRACE ids, memory only as used).
 *
 * Python frames (CPython 3.10-3.13) are read at the sample from the
 * interrupted thread itself. User space puts each Python process's layout in
 * py_procs (sensor/python_offsets.py says where every offset comes from);
 * the thread's PyThreadState is the one whose thread_id (pthread_self())
 * equals the thread's TLS base, task_struct.thread.fsbase, at an offset
 * taken from the running kernel's BTF. Each frame is (code object, byte
 * offset of the instruction, flags): ENTRY when the frame was entered from
 * C, i.e. is the first of one _PyEval_EvalFrameDefault call (3.10: every
 * frame; 3.11: is_entry), SHIM for 3.12+'s marker frame that the C stack
 * owns below each such call (user space turns it into ENTRY on the frame
 * above). A code object's
 * name, file, first line and line table are copied once per process into
 * py_codes, so a process that exits before user space reads the maps is
 * still named.
 *
 * The Python walk and the code capture run as tail calls (one program per
 * interpreter layout, the layout a compile-time constant in each): one
 * program with every loop inlined costs the verifier over a million steps. */

#define EV_PROFILE_PROC 50        /* first sample of a process: user space inspects it */

#define NATIVE_MAX_FRAMES 127
#define PY_FRAME_MASK (PY_MAX_FRAMES - 1)   /* PY_MAX_FRAMES is a power of two */
#define PY_MAX_THREADS 128                  /* thread states searched for a thread */
#define PY_NAME_LEN 128
#define PY_FILE_LEN 256
#define PY_TABLE_LEN 1024
#define PY_CAPTURES_PER_SAMPLE 8
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
#define PROG_CAPTURE 7     /* index of the code-capture program in the prog arrays */

/* profile_stats[] slots: drops counted here, exported by the profiler. */
#define PSTAT_SAMPLES_FULL 0     /* cpu_samples full */
#define PSTAT_STACKS_FULL 1      /* stacks / py_stacks full */
#define PSTAT_CODES_FULL 2       /* py_codes full */
#define PSTAT_PROCS_FULL 3       /* py_procs full */
#define PSTAT_MEM_FULL 4         /* mem_alloc / mem_inuse full */
#define PSTAT_LIVE_FULL 5        /* mem_live full: an allocation is not in inuse */
#define PSTAT_EVENT_LOST 6       /* ring full: a new process was not announced */
#define PSTAT_MAX 8

struct native_stack {
    u32 len;
    u32 flags;
    u64 ip[NATIVE_MAX_FRAMES];
};

struct py_frame {
    u64 code;
    s32 offset;     /* bytes from the first instruction; negative: not started */
    u32 flags;      /* PYF_* */
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
    u32 pad;
    u64 code;
};

struct py_code {
    u32 firstlineno;
    u16 name_len;
    u16 file_len;
    u8 name_kind;             /* 0 ASCII, else PyUnicode kind: 1 latin-1, 2 UCS-2, 4 UCS-4 */
    u8 file_kind;
    u8 file_cut;              /* the file name was longer: these are its last bytes */
    u8 pad;
    u32 table_len;            /* bytes of the line table copied */
    u32 table_size;           /* its full size */
    u64 table_addr;           /* where the rest is, while the process lives */
    char name[PY_NAME_LEN];
    char file[PY_FILE_LEN];
    u8 table[PY_TABLE_LEN];
};

struct sample_key {
    u32 pid;
    u32 pad;
    u64 user;                 /* stack hashes; 0: none */
    u64 kernel;
    u64 py;
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

struct pending_alloc {
    struct mem_key k;
    u64 size;
    u64 addr;
    u32 active;
    u32 captures;
};

BPF_HASH(cpu_samples, struct sample_key, u64, SAMPLE_ENTRIES);
BPF_F_TABLE("hash", u64, struct native_stack, stacks, STACK_ENTRIES, BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", u64, struct py_stack, py_stacks, STACK_ENTRIES, BPF_F_NO_PREALLOC);
BPF_HASH(py_procs, u32, struct py_proc, 16384);
BPF_TABLE("lru_hash", u32, struct py_thread, py_threads, 16384);
BPF_F_TABLE("hash", struct py_code_key, struct py_code, py_codes, CODE_ENTRIES, BPF_F_NO_PREALLOC);
BPF_HASH(mem_alloc, struct mem_key, struct mem_val, MEM_ENTRIES);
BPF_HASH(mem_inuse, struct mem_key, struct mem_val, MEM_ENTRIES);
BPF_F_TABLE("hash", struct live_key, struct live_val, mem_live, LIVE_ENTRIES, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(profile_stats, u64, PSTAT_MAX);
/* Per-CPU scratch: these are too big for the 512-byte BPF stack. */
BPF_PERCPU_ARRAY(scratch_native, struct native_stack, 1);
BPF_PERCPU_ARRAY(scratch_py, struct py_stack, 1);
BPF_PERCPU_ARRAY(scratch_code, struct py_code, 1);
BPF_PERCPU_ARRAY(scratch_buf, struct frame_buf, 1);
BPF_PERCPU_ARRAY(pending_samples, struct pending_sample, 1);
BPF_PERCPU_ARRAY(pending_allocs, struct pending_alloc, 1);
/* Tail-call targets, by layout (and PROG_CAPTURE); filled by user space. */
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
    bpf_probe_read_user(&state, sizeof(state), (void *)(obj + p->o.unicode_state));
    bpf_probe_read_user(&length, sizeof(length), (void *)(obj + p->o.unicode_length));
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
    bpf_probe_read_user(dst, n, (void *)data);
    *kind_out = ascii ? 0 : kind;
    return n;
}

/* Name, file, first line and line table of a code object, once per process. */
static __always_inline void capture_code(struct py_proc *p, struct py_code_key *k)
{
    u32 zero = 0;
    struct py_code *c = scratch_code.lookup(&zero);
    struct frame_buf *fb = scratch_buf.lookup(&zero);
    if (!c || !fb)
        return;
    if (bpf_probe_read_user(fb->b, p->o.code_size & 0xff, (void *)k->code) != 0)
        return;
    c->firstlineno = load32(fb, p->o.code_firstlineno);
    c->name_kind = c->file_kind = c->file_cut = 0;
    u8 ignored = 0;
    c->name_len = read_pystr(p, load64(fb, p->o.code_name), c->name, PY_NAME_LEN, &c->name_kind, &ignored, 0);
    c->file_len = read_pystr(p, load64(fb, p->o.code_filename), c->file, PY_FILE_LEN, &c->file_kind, &c->file_cut, 1);
    u64 table = load64(fb, p->o.code_linetable);
    u64 size = 0;
    bpf_probe_read_user(&size, sizeof(size), (void *)(table + p->o.bytes_size));
    c->table_size = size;
    c->table_addr = table + p->o.bytes_data;
    u32 n = size > PY_TABLE_LEN ? PY_TABLE_LEN : size;
    c->table_len = n;
    bpf_probe_read_user(c->table, n, (void *)c->table_addr);
    if (py_codes.update(k, c) != 0)
        profile_stat(PSTAT_CODES_FULL);
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
            bpf_probe_read_user(&id, sizeof(id), (void *)(cached->tstate + p->o.tstate_thread_id));
            if (id == fsbase)
                return cached->tstate;
        } else if (now - cached->checked_ns < 1000000000ULL) {
            return 0;  /* searched within the last second: not a Python thread */
        }
    }
    struct py_thread found = {.tstate = 0, .checked_ns = now};
    u64 interp = 0, t = 0;
    bpf_probe_read_user(&interp, sizeof(interp), (void *)(p->runtime + p->o.runtime_interp_head));
    if (interp)
        bpf_probe_read_user(&t, sizeof(t), (void *)(interp + p->o.interp_threads_head));
    for (int i = 0; i < PY_MAX_THREADS; i++) {
        if (!t)
            break;
        u64 id = 0;
        bpf_probe_read_user(&id, sizeof(id), (void *)(t + p->o.tstate_thread_id));
        if (id == fsbase) {
            found.tstate = t;
            break;
        }
        u64 next = 0;
        bpf_probe_read_user(&next, sizeof(next), (void *)(t + p->o.tstate_next));
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
    bpf_probe_read_user(&frame, sizeof(frame), (void *)(tstate + p->o.tstate_frame));
    if (layout == LAYOUT_311 || layout == LAYOUT_312) {
        u64 cframe = frame;
        frame = 0;
        if (cframe)
            bpf_probe_read_user(&frame, sizeof(frame), (void *)(cframe + p->o.cframe_current));
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
        if (bpf_probe_read_user(fb->b, p->o.frame_size & 0xff, (void *)frame) != 0) {
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
        if (layout == LAYOUT_313) {
            u64 type = 0;
            bpf_probe_read_user(&type, sizeof(type), (void *)(code + p->o.object_type));
            if (type != p->code_type)  /* f_executable is not always code */
                code = 0;
        }
        f->code = code;
        st->len = n + 1;
        h = mix(h, code);
        h = mix(h, ((u64)f->flags << 32) | (u32)f->offset);
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

/* Copy one code object of the walked stack (scratch_py) that this process
 * has not had copied yet; returns whether there was one. The capture program
 * tail-calls itself for the next, PY_CAPTURES_PER_SAMPLE at most. */
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
        if (k.code && !py_codes.lookup(&k))
            break;
    }
    if (!k.code)
        return 0;
    capture_code(p, &k);
    return 1;
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
    if (events.ringbuf_output(&e, sizeof(e), BPF_RB_NO_WAKEUP) != 0)
        profile_stat(PSTAT_EVENT_LOST);
    return 0;
}

static __always_inline void count_sample(struct sample_key *k)
{
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
    if (capture_missing(ps->k.pid) && ++ps->captures < PY_CAPTURES_PER_SAMPLE)
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

/* Account the pending allocation (its stacks are complete now). */
static __always_inline void finish_alloc(struct pending_alloc *pa)
{
    if (!pa->active)
        return;
    pa->active = 0;
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
    pa->active = 1;
    pa->captures = 0;
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
    if (capture_missing(pa->k.pid) && ++pa->captures < PY_CAPTURES_PER_SAMPLE)
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
