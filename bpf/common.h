/* Shared by every otelbpf probe family: the fixed-size event record, the
 * process filter and the drop counters. Every event kind (EV_*, SEV_*) and
 * event flag (EVF_*) lives here, so the kind and flag spaces are seen whole;
 * a family's C file keeps only constants private to it. Mirrored by
 * otelbpf/base/events.py; tests/base/test_events_parity.py parses this file
 * and fails on any difference. A constant whose comment starts with
 * "internal" never reaches user space and has no mirror.
 *
 * Every record on the `events` ring buffer is exactly 64 bytes so user space
 * can drain it in bulk as a numpy structured array (see sensor/ringbuf.py).
 * Records are submitted with BPF_RB_NO_WAKEUP: user space drains on a timer,
 * so a traced program never pays for waking the reader; the one exception is
 * the record that fills another eighth of a ring (ring_wake below). */
#include <uapi/linux/ptrace.h>

struct event {
    u64 ts_ns;        /* bpf_ktime_get_ns() at entry (CLOCK_MONOTONIC) */
    u64 duration_ns;  /* entry -> return; 0 for entry-only events */
    u32 pid;          /* tgid */
    u32 tid;
    u8  kind;         /* EV_* */
    u8  func;         /* family-specific function id */
    u16 flags;        /* EVF_* */
    s32 ret;          /* return value (CUDA error code), 0 for entry-only */
    u64 a0, a1, a2, a3;  /* kind-specific arguments */
};

/* Variable-length facts (library paths, kernel names) are rare: a second ring
 * with 256-byte records carries them. */
struct strevent {
    u32 pid;
    u8  kind;
    u8  paused;     /* LIB_OPEN, IBV_CONTEXT: the process was stopped (SIGSTOP) */
    u8  exec;       /* LIB_OPEN: the program itself, at exec (discovery.c) */
    u8  pad;
    u64 a0;
    char s[240];
};

#define EV_PROC_EXEC 1
#define EV_PROC_EXIT 2
#define EV_CUDA_LAUNCH 10
#define EV_CUDA_MEMCPY 11
#define EV_CUDA_MALLOC 12
#define EV_CUDA_FREE 13
#define EV_CUDA_SYNC 14
#define EV_CUDA_CALL 15         /* other paired calls: events, stream waits, VMM handles */
#define EV_CUDA_HOST_ALLOC 16   /* page-locked host memory: a0 bytes, a1 address */
#define EV_CUDA_HOST_FREE 17    /* a0 address */
#define EV_CUDA_KERNEL_NAME 18  /* a0 host stub (registration), a1 pointer to its device name */
#define EV_CUDA_KERNEL_ALIAS 19 /* a0 handle, a1 what it stands for (host stub, CUkernel) */
#define EV_CUDA_LAUNCH_SITE 60  /* first launch of (process, API, handle): a0 handle, a1 return address, a2 the caller's (frame pointer) */
#define EV_CUDA_GRAPH 61        /* a CUDA Graphs call returned (capture, construction, instantiation, update, destruction, launch): a0..a3 per function, see cuda.c */
#define EV_CUDA_CAPTURED 62     /* a kernel launch made while its thread was capturing a stream: a0 handle, a1 return address, a2 the caller's (frame pointer), a3 stream */
#define EV_NCCL_ENTER 20        /* NCCL: see bpf/nccl.c for each kind's arguments */
#define EV_NCCL_RETURN 21
#define EV_NCCL_COMM 22
#define EV_IBV_OPEN 30          /* ibverbs: see bpf/ibverbs.c for each kind's arguments */
#define EV_IBV_CLOSE 31
#define EV_IBV_CREATE_QP 32
#define EV_IBV_MODIFY_QP 33
#define EV_IBV_QP_GID 34
#define EV_IBV_DESTROY_QP 35
#define EV_IBV_REG_MR 36
#define EV_IBV_DEREG_MR 37
#define EV_IBV_CREATE_CQ 38
#define EV_IBV_COMPLETION 39
#define EV_SOCK_DATA 40
#define EV_SOCK_CONNECT 41
#define EV_SOCK_ACCEPT 42
#define EV_SOCK_CLOSE 43
#define EV_SOCK_UNKNOWN 44
#define EV_SOCK_LOCAL 45        /* the local address of a connect()ed socket (bpf/sockets.c) */
#define EV_SOCK_COUNTED 46      /* an HTTP/2 connection's streams are counted in the kernel from here on (bpf/h2_frames.h) */
#define EV_PROFILE_PROC 50      /* first CPU sample or CUDA allocation of a process (bpf/profile.c) */
#define EV_TORCH_OP 70          /* a torch operator returned (bpf/torch.c): a0 entry address, a1 depth, a2 exit address */
#define EV_HANDOFF 80           /* the wake-up that handed the thread its work, reported at its next CUDA call: ts_ns the wake-up, a0 the waker's tid (0: that work is done, none known since), a1 the waker's own waker's tid (0: none), a2 when that one woke it */
#define EV_CUDA_FUNC_NAME 100   /* internal (cuda.c): cuModuleGetFunction / cuLibraryGetKernel: out handle, name */
#define EV_CUDA_GET_HANDLE 101  /* internal (cuda.c): __cudaGetKernel / cudaGetKernel / cuKernelGetFunction: out handle, target */

#define SEV_LIB_OPEN 1
#define SEV_CUDA_FUNC_NAME 2
#define SEV_IBV_CONTEXT 30     /* ibv_open_device returned: a0 context, s device name */

#define EVF_INCOMPLETE 1          /* the thread exited before the call returned */
#define EVF_NCCL_UNKNOWN_COMM 2   /* NCCL: the communicator predates the probes: a0 is its pointer */
#define EVF_DRIVER 4              /* CUDA: a driver API call (libcuda) */
#define EVF_OUT_PTR 8             /* internal (CUDA): a1 is an out-pointer, read at return */
#define EVF_SHED 0x10             /* CUDA, torch: made while its thread served an HTTP request head sampling shed (sockets.c) */
#define EVF_IBV_POSTED 0x100      /* EV_IBV_COMPLETION: the post was seen, ts/duration are real */
/* CUDA: bits 9-15 of event.flags: the thread's current device + 1 when the call was made (0: none
 * known; cuda.c says how it is kept) */
#define CUDA_DEVICE_SHIFT 9

/* stats[] slots: every drop in the kernel is counted here. */
#define STAT_EVENTS_LOST 0
#define STAT_STR_LOST 1
#define STAT_INFLIGHT_FULL 2
#define STAT_LAUNCH_MAP_FULL 3
#define STAT_SOCK_LOST 4       /* sockdata ring full */
#define STAT_SOCK_MAP_FULL 5   /* sock_state / sock_args full */
#define STAT_IBV_MAP_FULL 6    /* an ibverbs per-QP, latency, error or pending-WR map full */
#define STAT_IBV_TRUNCATED 7   /* WR chain, SGE list or polled batch longer than the probe reads */
#define STAT_TORCH_UNWOUND 8   /* torch operator frames left by an exception (no return seen) */
#define STAT_TORCH_DEPTH 9     /* torch operators nested deeper than the probe tracks */
#define STAT_CALL_LOST 10      /* a CUDA call's shared program (cuda.c cuda_call) not reached */
#define STAT_MAX 11

BPF_RINGBUF_OUTPUT(events, EVENTS_RING_PAGES);
BPF_RINGBUF_OUTPUT(strevents, STR_RING_PAGES);

/* Wake-on-fill. The drain thread reads every ring on a timer (50 ms, up to 8 times that when
 * idle), so the rings had to hold what a burst writes in the longest wait. It also waits in
 * epoll on them: the record that takes the bytes ever written to a ring past a multiple of an
 * eighth of its size is submitted with BPF_RB_FORCE_WAKEUP, and the ring is drained then,
 * whatever the timer. One wake-up per eighth (at 1M events/s into a 4 MiB ring, ~120 a
 * second), none for a trickle. The count is the ring's, over every CPU: an atomic add, read
 * just before it (two CPUs racing on one boundary may both wake, or, rarely, neither: the
 * next eighth or the timer drains). */
#define RING_WAKE_PARTS 8  /* internal: a wake-up per eighth of a ring */
#define RING_EVENTS 0      /* internal: ring_written slots, one per ring */
#define RING_SOCKDATA 1    /* internal: sockets.c's ring */
#define RING_SCHED 2       /* internal: sched.c's ring */
BPF_ARRAY(ring_written, u64, 3);

static __always_inline u64 ring_wake(u32 ring, u64 bytes, u64 ring_bytes)
{
    u64 *written = ring_written.lookup(&ring);
    if (!written)
        return BPF_RB_NO_WAKEUP;
    u64 before = *written;
    __sync_fetch_and_add(written, bytes);
    return ((before + bytes) ^ before) >= ring_bytes / RING_WAKE_PARTS ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

/* The flags for one 64-byte record on `events`. */
static __always_inline u64 events_wake(void)
{
    return ring_wake(RING_EVENTS, sizeof(struct event), EVENTS_RING_PAGES * 4096ULL);
}
BPF_PERCPU_ARRAY(stats, u64, STAT_MAX);
/* Processes being watched (only consulted when built with FILTER_PIDS). */
BPF_HASH(watched, u32, u8, 65536);
/* Processes that opened a library some family probes (CUDA, NCCL, ibverbs), and their
 * children: "the processes that matter", whose requests the sockets family traces by
 * default (discovery.c fills it; user space adds those found running at start). */
BPF_TABLE("lru_hash", u32, u8, lib_users, 65536);  /* LRU: exits are missed under FILTER_PIDS */

/* Calls between entry and return, keyed by pid_tgid: the entry probe stores
 * a half-filled event, the return probe completes and emits it. LRU so that
 * threads killed mid-call cannot fill the map. */
BPF_TABLE("lru_hash", u64, struct event, inflight, INFLIGHT_ENTRIES);

/* Every read of user memory goes through these two wrappers, never a direct
 * call of bpf_probe_read_user or its _str twin. BCC's frontend rewrites each call site of those helpers
 * and resolves the helper in /proc/kallsyms at every one (~60 ms per site on a 2-core VM,
 * 3.5 s of an 8 s compile for the ~60 sites of every family); a single site in an inlined
 * wrapper pays it once and compiles to the same code. tests/sensor/test_bpf_sources.py
 * keeps direct calls out. */
static __always_inline int read_user(void *dst, u32 size, const void *src)
{
    return bpf_probe_read_user(dst, size, src);
}

static __always_inline int read_user_str(void *dst, u32 size, const void *src)
{
    return bpf_probe_read_user_str(dst, size, src);
}

static __always_inline void count_stat(u32 slot)
{
    u64 *v = stats.lookup(&slot);
    if (v)
        (*v)++;
}

/* The agent's own process, which is never traced (its exports are HTTP and gRPC too): set
 * by user space right after the load (0 until then). A map, not a -D flag, so that the
 * compiled program is the same at every start and can be kept (sensor/program_cache.py). */
BPF_ARRAY(agent_self, u32, 1);

static __always_inline int is_agent(u32 tgid)
{
    int zero = 0;
    u32 *self = agent_self.lookup(&zero);
    return self && *self == tgid;
}

static __always_inline int is_watched(u32 tgid)
{
#ifdef FILTER_PIDS
    return watched.lookup(&tgid) != 0;
#else
    return 1;
#endif
}

/* Fill the header every event starts with: now, this process and thread. */
static __always_inline void new_event(struct event *e, u64 pid_tgid, u8 kind, u8 func)
{
    e->ts_ns = bpf_ktime_get_ns();
    e->pid = pid_tgid >> 32;
    e->tid = (u32)pid_tgid;
    e->kind = kind;
    e->func = func;
}

static __always_inline void emit(struct event *e)
{
    u64 flags = events_wake();
    if (events.ringbuf_output(e, sizeof(*e), flags) != 0)
        count_stat(STAT_EVENTS_LOST);
}

/* Entry half of a paired call, shared by the families: a half-filled event in `inflight`
 * until the return probe completes and emits it. */
static __always_inline void remember_call(u64 pid_tgid, u8 kind, u8 func, u16 flags, u64 a0, u64 a1, u64 a2,
                                          u64 a3)
{
    struct event e = {};
    new_event(&e, pid_tgid, kind, func);
    e.flags = flags;
    e.a0 = a0;
    e.a1 = a1;
    e.a2 = a2;
    e.a3 = a3;
    if (inflight.update(&pid_tgid, &e) != 0)
        count_stat(STAT_INFLIGHT_FULL);
}

#ifdef HANDOFFS
/* Work handed between threads (a thread pool): who woke each thread of a traced process
 * with its work, kept by the sched:sched_wakeup(_new) tracepoints (sockets.c, or sched.c
 * when the sched family owns them) and reported once, as an EV_HANDOFF, ahead of the woken
 * thread's next CUDA event (cuda.c): a thread that launches CUDA work with no request of
 * its own is a child of the request its waker was serving (correlate/causality.py). One
 * hop back is kept with each wake-up (the waker's own waker), so work handed on twice is
 * followed; nothing is emitted per wake-up.
 *
 * Which wake-up handed the work: a worker waits long for work and briefly for locks once it
 * has some (Python's GIL: whichever thread drops it wakes the next holder, whatever request
 * it serves). So a later wake-up replaces the one kept only when it ended a longer wait
 * (time since the thread's previous wake-up: an upper bound of the wait, close for a thread
 * that runs briefly between waits). Once the thread, having used the work (a CUDA call
 * reported), wakes the thread that handed it (the result handed back), that work is done:
 * the record says "handed by none" (waker 0) until the next wake-up. A thread that only hands
 * work on (a dispatcher) keeps its record until a longer wait's wake-up replaces it. */
struct handoff {
    u64 ts;         /* the wake-up kept */
    u64 hop_ts;     /* the waker's own kept wake-up (hop != 0) */
    u64 gap;        /* the wait it ended: ts - the thread's wake-up before it */
    u64 last_ts;    /* the thread's latest wake-up, kept or not */
    u32 waker_pid;  /* the waker's process: a wake-up from another process is not a hand-off */
    u32 waker;      /* the waker's tid; 0: the work handed is done, none known since */
    u32 hop;        /* the waker's own waker, of the same process; 0: none */
    u32 reported;   /* EV_HANDOFF emitted for the wake-up kept */
};

/* internal: the wait a thread's first wake-up is taken to have ended (none was seen before it:
 * a new thread, or one evicted): longer than a lock's, shorter than a pool's idle spells. */
#define HANDOFF_FRESH_GAP_NS 100000000ULL

BPF_TABLE("lru_hash", u32, struct handoff, handoffs, HANDOFF_ENTRIES);

/* sched_wakeup(_new) of thread ``wakee`` by the current thread: one lookup for an untraced
 * process (host mode: lib_users, the processes that can launch CUDA work; else the watched
 * pids), two lookups and a write for a traced one. Wake-ups from interrupt context name
 * whatever ran then: user space only trusts one whose waker served exactly one request,
 * still open at the CUDA call, that the thread's other recent wake-ups do not contradict. */
static __always_inline void handoff_wakeup(u32 wakee)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
#ifdef FILTER_PIDS
    if (!watched.lookup(&tgid))
        return;
#else
    if (!lib_users.lookup(&tgid))
        return;
#endif
    if (tid == wakee)
        return;
    u64 now = bpf_ktime_get_ns();
    struct handoff h = {.ts = now, .gap = HANDOFF_FRESH_GAP_NS, .last_ts = now, .waker_pid = tgid, .waker = tid};
    struct handoff *mine = handoffs.lookup(&tid);
    if (mine && mine->waker_pid == tgid) {
        h.hop = mine->waker;
        h.hop_ts = mine->ts;
        if (mine->waker == wakee && mine->reported) {
            /* The result handed back (not a new thread's "started" signal to its creator, nor
             * a lock passed before the work was used): that work is done, and what the thread
             * does next was handed by no one known until its next wake-up (a worker that takes
             * queued work without sleeping). */
            mine->ts = now;
            mine->waker = 0;
            mine->hop = 0;
            mine->gap = 0;
            mine->reported = 0;
        }
    }
    struct handoff *kept = handoffs.lookup(&wakee);
    if (kept) {
        h.gap = now - kept->last_ts;
        if (h.gap < kept->gap) {
            kept->last_ts = now;  /* a shorter wait than the one kept: a lock, not its work */
            return;
        }
    }
    handoffs.update(&wakee, &h);
}

/* Ahead of a CUDA event of the current thread: its last wake-up, if not reported yet and
 * from a thread of its own process. */
static __always_inline void report_handoff(u64 id)
{
    u32 tid = (u32)id;
    struct handoff *h = handoffs.lookup(&tid);
    if (!h || h->reported || h->waker_pid != (u32)(id >> 32))
        return;
    h->reported = 1;
    struct event e = {};
    new_event(&e, id, EV_HANDOFF, 0);
    e.ts_ns = h->ts;
    e.a0 = h->waker;
    e.a1 = h->hop;
    e.a2 = h->hop_ts;
    emit(&e);
}
#endif

/* A library path as a process opened it (discovery.c), zero-padded: with its cgroup in host
 * mode, the key of known_libs below. */
struct lib_key {
    u64 cgroup;   /* bpf_get_current_cgroup_id() under PAUSE_NEW_ONLY, else 0 */
    char path[240];
};

#ifndef PAUSE_NEW_ONLY
#define PAUSE_NEW_ONLY 0  /* internal: host mode's pause (see below); a -D flag from sensor/program.py */
#endif

#if PAUSE_ON_LOAD
/* The pause at load is on (1) only while the agent can resume what it stops: the sensor opens
 * it once loaded (in host mode, once its pause guard holds these maps) and closes it first
 * thing when it stops; when the agent dies, its guard (otelbpf/jobguard.py for a command,
 * sensor/pause_guard.py in host mode), which holds this map, closes it. The programs outlive
 * the agent: a dead agent's links go one grace period each, the background releaser
 * (sensor.py) holds them after a stop; with the gate closed they stop nothing. */
BPF_ARRAY(pause_gate, u32, 1);
#endif

#if PAUSE_NEW_ONLY
/* Host mode (PAUSE_NEW_ONLY): there is no command tree to search for what was stopped, and
 * most opens are of libraries long attached. So only the open of a library path not known
 * to be attached (known_libs, written by user space after the attach, per cgroup: a
 * container's file at a path is not the host's) stops its process, and every process
 * stopped is written in `paused` first (one that cannot be is not stopped, and counted):
 * the agent resumes it once attached, and the pause guard, holding these maps, resumes it
 * after max_pause or at once when the agent dies. A process's exit takes it out. */
struct paused_at {
    u64 since_ns;  /* bpf_ktime_get_ns() when stopped */
    u64 cgroup;    /* its cgroup (v2 id): with the path, the known_libs key user space writes */
};
BPF_HASH(paused, u32, struct paused_at, PAUSED_ENTRIES);
BPF_TABLE("lru_hash", struct lib_key, u8, known_libs, 16384);
#define PAUSE_STOPPED 0    /* internal: pause_stats slots (sensor/pause_guard.py): processes stopped */
#define PAUSE_UNTRACKED 1  /* internal: not stopped: `paused` was full (the process ran unprobed) */
#define PAUSE_TIMEOUTS 2   /* internal: resumed by the guard after max_pause, before the attach (unprobed) */
#define PAUSE_ORPHANED 3   /* internal: resumed by the guard because the agent died */
BPF_ARRAY(pause_stats, u64, 4);

/* Whether the current thread is an agent's (otelbpf's threads are named "otelbpf-...", its
 * main thread while it starts too: sensor.py): an agent is never stopped, by its own
 * programs nor by another agent's on the same host (two agents stopping each other as each
 * reads the libraries it attaches to wait out max_pause, again and again). The name is the
 * thread's own (bpf_get_current_comm): no kernel struct is read. */
static __always_inline int agent_thread(void)
{
    char comm[16];
    if (bpf_get_current_comm(comm, sizeof(comm)) != 0)
        return 0;
    return comm[0] == 'o' && comm[1] == 't' && comm[2] == 'e' && comm[3] == 'l' && comm[4] == 'b' &&
           comm[5] == 'p' && comm[6] == 'f' && comm[7] == '-';
}

static __always_inline void count_pause(u32 slot)
{
    u64 *v = pause_stats.lookup(&slot);
    if (v)
        __sync_fetch_and_add(v, 1);
}
#endif

/* Hand user space a library open (or an RDMA context) at once: submitted with a wake-up,
 * and, when ``pause`` (PAUSE_ON_LOAD, 0 or 1 from user space: where the agent started
 * the process itself, or in host mode a library not attached yet) and the pause gate is open,
 * the process is stopped (SIGSTOP) before it can call into the library; user space attaches,
 * then sends SIGCONT (sensor.py). */
static __always_inline void submit_open(struct strevent *s, int pause)
{
#if PAUSE_ON_LOAD
    int zero = 0;
    u32 *open = pause_gate.lookup(&zero);
    pause = pause && open && *open;
#endif
#if PAUSE_NEW_ONLY
    if (pause && agent_thread())
        pause = 0;  /* an agent (this one or another on the host) reading a library to attach */
    if (pause) {
        u32 pid = s->pid;
        struct paused_at at = {.since_ns = bpf_ktime_get_ns(), .cgroup = bpf_get_current_cgroup_id()};
        /* Written again by a second thread's open: user space may have taken the first
         * thread's entry and resumed before this stop; the record that follows resumes it. */
        if (paused.update(&pid, &at) != 0) {
            count_pause(PAUSE_UNTRACKED);
            pause = 0;  /* nothing could resume it */
        } else {
            count_pause(PAUSE_STOPPED);
        }
    }
#endif
    s->paused = pause;
    if (pause)
        bpf_send_signal(19 /* SIGSTOP */);
    strevents.ringbuf_submit(s, 0);
}
