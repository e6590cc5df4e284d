/* The sched family: off-CPU time and run-queue latency of the watched threads.
 *
 * Tracepoints only (sched:sched_switch, sched:sched_wakeup, sched:sched_wakeup_new),
 * read through their format-file arguments (prev_pid, prev_state, next_pid, pid),
 * never through kernel structs: the headers BCC compiles against are not the running
 * kernel's.
 *
 * A busy host switches 100k times a second, so nothing is emitted per switch.
 * A thread of a traced process (the watched pids in command/--pid mode, else the
 * processes in lib_users: those that use a probed library) that leaves the CPU
 * gets an entry in sched_threads (when, why: its state and kernel stack); its
 * wakeup stamps the entry; its next switch-in closes it:
 *
 *   off-CPU = switch-out -> switch-in = blocked (-> wakeup) + run-queue (wakeup ->)
 *
 * A preempted thread (still runnable at switch-out) was waiting on the run queue
 * the whole time. Each interval is added to sched_off (per thread, state and kernel
 * stack: count, blocked and run-queue ns) and its run-queue part to sched_runq (a
 * log2 histogram per thread). Intervals of at least SCHED_SPAN_NS go on the
 * schedevents ring, one record each, for spans. Shorter ones of at least
 * SCHED_AGG_MIN_NS (a 0.3 ms fsync, a pipe wait; not the few-us switches of threads
 * handing work back and forth, which would make a record per thread and window) are
 * summed per thread in its entry over a window of SCHED_AGG_NS (from the window's first
 * interval; 0: not summed, only counted in sched_off), with the shorter ones that fall in
 * a window already open (they cost no record there), and go on the ring
 * as one record when the next interval falls past the window, crosses into or out of a
 * CUDA call, or is a long one: at most one record per thread and window, however often
 * it switches. The record carries the window's first switch-out and last switch-in, the
 * count and the blocked and run-queue sums; its reason (state, kernel stack) is that of
 * its longest blocked interval.
 *
 * Every other thread costs a map lookup at each switch-out (is its process traced?),
 * at each switch-in and at each wakeup (does it have an entry?). */

#define SCHED_PREEMPTED 0   /* runnable at switch-out: it waited on the run queue */
#define SCHED_SLEEPING 1    /* TASK_INTERRUPTIBLE (S) or idle (I) */
#define SCHED_DISK 2        /* TASK_UNINTERRUPTIBLE (D): mostly I/O */
#define SCHED_OTHER 3       /* stopped, traced, ... */
#define SCHED_NEW 4         /* a new task's first run (sched_wakeup_new) */

#define SCHED_STAT_RING_FULL 0
#define SCHED_STAT_MAP_FULL 1
#define SCHED_STAT_STACK_LOST 2
#define SCHED_STAT_MAX 3

#define SCHED_SLOTS 40      /* log2(ns) buckets: up to ~9 minutes */

struct sched_thread {
    u64 off_ts;             /* switch-out; 0 once closed */
    u64 wake_ts;            /* wakeup after off_ts; 0 before */
    u64 first_runq_ns;      /* SCHED_NEW: run-queue wait of the first run, kept until the tgid is known */
    u32 tgid;               /* 0: not known yet (SCHED_NEW) */
    s32 kstack;             /* sched_stacks id at switch-out; < 0: none */
    u32 state;              /* SCHED_* */
    u32 in_cuda;            /* off-CPU inside a CUDA call (the inflight map held one) */
    char comm[16];
    /* short intervals summed since agg_start (SCHED_AGG_NS); agg_count 0: none */
    u64 agg_start;          /* switch-out of the first */
    u64 agg_end;            /* switch-in of the last */
    u64 agg_blocked;
    u64 agg_runq;
    u64 agg_top;            /* the longest blocked part: its state and stack name the record */
    u32 agg_count;
    s32 agg_kstack;
    u32 agg_state;          /* SCHED_* | 0x100 inside a CUDA call */
    u32 agg_pad;
};

struct sched_off_key {
    u32 tgid;
    u32 tid;
    s32 kstack;
    u32 state;              /* SCHED_*; | 0x100 when inside a CUDA call */
};

struct sched_off_val {
    u64 count;
    u64 blocked_ns;
    u64 runq_ns;
    char comm[16];
};

struct sched_runq_key {
    u32 tgid;
    u32 tid;
    u32 slot;               /* floor(log2(ns)) */
    u32 pad;
};

/* One long off-CPU interval (>= SCHED_SPAN_NS), or a window's short ones summed (count > 1,
 * or a short one alone). Mirrored in families/sched/probes.py. */
struct sched_rec {
    u64 off_ts;
    u64 end_ts;             /* switch-in (of the last interval) */
    u64 blocked_ns;
    u64 runq_ns;
    u32 tgid;
    u32 tid;
    s32 kstack;
    u32 state;
    u32 count;              /* intervals summed */
    u32 pad;
    char comm[16];
};

BPF_STACK_TRACE(sched_stacks, SCHED_STACK_ENTRIES);
BPF_TABLE("lru_hash", u32, struct sched_thread, sched_threads, SCHED_THREAD_ENTRIES);
BPF_TABLE("lru_hash", struct sched_off_key, struct sched_off_val, sched_off, SCHED_OFF_ENTRIES);
BPF_TABLE("lru_hash", struct sched_runq_key, u64, sched_runq, SCHED_RUNQ_ENTRIES);
BPF_RINGBUF_OUTPUT(schedevents, SCHED_RING_PAGES);
BPF_PERCPU_ARRAY(sched_stats, u64, SCHED_STAT_MAX);

static __always_inline void sched_count(u32 slot)
{
    u64 *v = sched_stats.lookup(&slot);
    if (v)
        (*v)++;
}

static __always_inline int sched_traced(u32 tgid)
{
    if (tgid == 0 || is_agent(tgid))
        return 0;
#ifdef FILTER_PIDS
    return watched.lookup(&tgid) != 0;
#else
    return lib_users.lookup(&tgid) != 0;
#endif
}

static __always_inline u32 sched_log2(u64 v)
{
    u32 r = 0, s;
    s = (v > 0xFFFFFFFFULL) << 5; v >>= s; r |= s;
    s = (v > 0xFFFF) << 4; v >>= s; r |= s;
    s = (v > 0xFF) << 3; v >>= s; r |= s;
    s = (v > 0xF) << 2; v >>= s; r |= s;
    s = (v > 0x3) << 1; v >>= s; r |= s;
    r |= (v >> 1);
    return r < SCHED_SLOTS ? r : SCHED_SLOTS - 1;
}

static __always_inline void sched_add_runq(u32 tgid, u32 tid, u64 ns)
{
    struct sched_runq_key k = {.tgid = tgid, .tid = tid, .slot = sched_log2(ns)};
    u64 *n = sched_runq.lookup(&k);
    if (n) {
        __sync_fetch_and_add(n, 1);
        return;
    }
    u64 one = 1;
    if (sched_runq.update(&k, &one) != 0)
        sched_count(SCHED_STAT_MAP_FULL);
}

static __always_inline u32 sched_state(long prev_state)
{
    long s = prev_state & 0xff;
    if (s == 0)
        return SCHED_PREEMPTED;
    if (s & 0x2)
        return SCHED_DISK;
    if (s & 0x1)
        return SCHED_SLEEPING;
    if (prev_state & 0x80)  /* TASK_REPORT_IDLE */
        return SCHED_SLEEPING;
    return SCHED_OTHER;
}

static __always_inline void sched_emit(u32 tid, struct sched_thread *t, u64 off_ts, u64 end_ts, u64 blocked,
                                       u64 runq, s32 kstack, u32 state, u32 count)
{
    struct sched_rec *r = schedevents.ringbuf_reserve(sizeof(struct sched_rec));
    if (!r) {
        sched_count(SCHED_STAT_RING_FULL);
        return;
    }
    r->off_ts = off_ts;
    r->end_ts = end_ts;
    r->blocked_ns = blocked;
    r->runq_ns = runq;
    r->tgid = t->tgid;
    r->tid = tid;
    r->kstack = kstack;
    r->state = state;
    r->count = count;
    r->pad = 0;
    __builtin_memcpy(r->comm, t->comm, sizeof(r->comm));
    schedevents.ringbuf_submit(r, ring_wake(RING_SCHED, sizeof(*r), SCHED_RING_PAGES * 4096ULL));
}

/* The thread's summed short intervals, if any, on the ring. */
static __always_inline void sched_flush(u32 tid, struct sched_thread *t)
{
    if (!t->agg_count)
        return;
    sched_emit(tid, t, t->agg_start, t->agg_end, t->agg_blocked, t->agg_runq, t->agg_kstack, t->agg_state,
               t->agg_count);
    t->agg_count = 0;
}

/* The thread `tid` is back on a CPU: account its interval. */
static __always_inline void sched_close(u32 tid, struct sched_thread *t, u64 now)
{
    u64 blocked, runq;
    if (t->state == SCHED_NEW) {
        t->first_runq_ns = now - t->wake_ts;
        t->off_ts = 0;
        return;
    }
    if (t->wake_ts) {
        blocked = t->wake_ts - t->off_ts;
        runq = now - t->wake_ts;
    } else if (t->state == SCHED_PREEMPTED) {
        blocked = 0;
        runq = now - t->off_ts;
    } else {  /* woken where no tracepoint saw it */
        blocked = now - t->off_ts;
        runq = 0;
    }
    u32 tgid = t->tgid;
    struct sched_off_key k = {.tgid = tgid, .tid = tid, .kstack = t->kstack,
                              .state = t->state | (t->in_cuda ? 0x100 : 0)};
    struct sched_off_val *v = sched_off.lookup(&k);
    if (v) {
        __sync_fetch_and_add(&v->count, 1);
        __sync_fetch_and_add(&v->blocked_ns, blocked);
        __sync_fetch_and_add(&v->runq_ns, runq);
        /* The thread's current name: one that names itself after its first wait (the same
         * kernel stack as its later ones, so the same key) is counted under the new name. */
        __builtin_memcpy(v->comm, t->comm, sizeof(v->comm));
    } else {
        struct sched_off_val nv = {.count = 1, .blocked_ns = blocked, .runq_ns = runq};
        __builtin_memcpy(nv.comm, t->comm, sizeof(nv.comm));
        if (sched_off.update(&k, &nv) != 0)
            sched_count(SCHED_STAT_MAP_FULL);
    }
    if (runq)
        sched_add_runq(tgid, tid, runq);
    if (blocked + runq >= SCHED_SPAN_NS) {
#if SCHED_AGG_NS
        sched_flush(tid, t);
#endif
        sched_emit(tid, t, t->off_ts, now, blocked, runq, t->kstack, k.state, 1);
    }
#if SCHED_AGG_NS
    else if (blocked + runq < SCHED_AGG_MIN_NS) {
        /* too short to open a window (a hand-off's few us), but inside an open one it costs no
         * record: summed there, so the window's waits are whole (an fsync's small waits beside
         * its long one were lost, a quarter of the off-CPU time of a job fsyncing 0.3 ms) */
        if (t->agg_count && t->off_ts - t->agg_start < SCHED_AGG_NS && !((t->agg_state ^ k.state) & 0x100)) {
            t->agg_end = now;
            t->agg_blocked += blocked;
            t->agg_runq += runq;
            t->agg_count++;
        }
    }
    else {
        if (t->agg_count && (t->off_ts - t->agg_start >= SCHED_AGG_NS || ((t->agg_state ^ k.state) & 0x100)))
            sched_flush(tid, t);
        if (!t->agg_count) {
            t->agg_start = t->off_ts;
            t->agg_blocked = 0;
            t->agg_runq = 0;
            t->agg_top = blocked;
            t->agg_kstack = t->kstack;
            t->agg_state = k.state;
        } else if (blocked > t->agg_top) {
            t->agg_top = blocked;
            t->agg_kstack = t->kstack;
            t->agg_state = k.state;
        }
        t->agg_end = now;
        t->agg_blocked += blocked;
        t->agg_runq += runq;
        t->agg_count++;
    }
#endif
    t->off_ts = 0;
    t->wake_ts = 0;
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    u32 prev = args->prev_pid;
    u32 tgid = id >> 32;
    if (prev != 0 && sched_traced(tgid)) {
        u32 state = sched_state(args->prev_state);
        /* A preempted thread's reason is known without its stack (~0.5-1 us to read). */
        s32 kstack = -1;
        if (state != SCHED_PREEMPTED) {
            kstack = sched_stacks.get_stackid(args, 0);
            if (kstack < 0)
                sched_count(SCHED_STAT_STACK_LOST);
        }
        struct sched_thread *t = sched_threads.lookup(&prev);
        if (t) {  /* the thread's entry from its last switch-out: rewritten in place */
            if (t->tgid == 0 && t->first_runq_ns)  /* a new task: its tgid is known now */
                sched_add_runq(tgid, prev, t->first_runq_ns);
            t->first_runq_ns = 0;
            t->wake_ts = 0;
            t->tgid = tgid;
            t->state = state;
            t->kstack = kstack;
            t->in_cuda = inflight.lookup(&id) != 0;
            bpf_get_current_comm(&t->comm, sizeof(t->comm));
            t->off_ts = now;  /* last: a concurrent wakeup tests off_ts first */
        } else {
            struct sched_thread n = {};
            n.off_ts = now;
            n.tgid = tgid;
            n.state = state;
            n.kstack = kstack;
            n.in_cuda = inflight.lookup(&id) != 0;
            bpf_get_current_comm(&n.comm, sizeof(n.comm));
            if (sched_threads.update(&prev, &n) != 0)
                sched_count(SCHED_STAT_MAP_FULL);
        }
    }
    u32 next = args->next_pid;
    if (next == 0)
        return 0;
    struct sched_thread *t = sched_threads.lookup(&next);
    if (t && t->off_ts)
        sched_close(next, t, now);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
    u32 tid = args->pid;
#ifdef HANDOFFS
    handoff_wakeup(tid);  /* common.h: the sockets family's hand-offs */
#endif
    struct sched_thread *t = sched_threads.lookup(&tid);
    if (t && t->off_ts && !t->wake_ts)
        t->wake_ts = bpf_ktime_get_ns();
    return 0;
}

/* A new thread or child of a traced process (traced too: lib_users and watched follow
 * forks). Its process id is not among the tracepoint's arguments: its first run-queue
 * wait is kept in its entry and accounted at its first switch-out, in its own context. */
TRACEPOINT_PROBE(sched, sched_wakeup_new)
{
#ifdef HANDOFFS
    handoff_wakeup(args->pid);
#endif
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!sched_traced(tgid))
        return 0;
    u32 tid = args->pid;
    u64 now = bpf_ktime_get_ns();
    struct sched_thread t = {};
    t.off_ts = now;
    t.wake_ts = now;
    t.state = SCHED_NEW;
    t.kstack = -1;
    if (sched_threads.update(&tid, &t) != 0)
        sched_count(SCHED_STAT_MAP_FULL);
    return 0;
}
