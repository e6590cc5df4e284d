/* ibverbs: queue pairs, memory regions and the RDMA data path.
 *
 * Control path: uprobes on libibverbs' exported ibv_* functions (the default
 * symbol version, see families/ibverbs/probes.py), paired entry -> return
 * through the shared `inflight` map and emitted as one event each.
 *
 * Data path: ibv_post_send / ibv_post_recv / ibv_poll_cq are inline calls
 * through the context's ops table into the provider (mlx5, rxe, ...), so the
 * probes below go on the provider functions user space finds in a live
 * context. They are the hot path (millions per second with small messages):
 * everything is counted here, per QP, in one `ibv_qps` value (one hash lookup
 * per call), latency included: a reliable connection completes each queue's
 * work requests in order, so a completion is matched to its post through a
 * small ring of post times per queue, not a map keyed by wr_id. Only error
 * and slow completions become events.
 *
 * Struct offsets (IBV_*) come from families/ibverbs/abi.py as -D flags.
 *
 * Events (struct event), by kind:
 *   EV_IBV_OPEN       a0 device, a1 context (0 on failure); ret 0 / -1
 *   EV_IBV_CLOSE      a0 context; ret
 *   EV_IBV_CREATE_QP  a0 context, a1 qp, a2 qpn | qp_type << 32 | sq_sig_all << 40,
 *                     a3 max_send_wr | max_recv_wr << 32; ret 0 / -1. ts is the new
 *                     QP's incarnation (ibv_qps .gen)
 *   EV_IBV_MODIFY_QP  a0 context, a1 see pack_modify(), a2 attr_mask | dlid << 32 |
 *                     ah port << 48 | port << 56, a3 qp; ret (an errno)
 *   EV_IBV_QP_GID     (before its MODIFY_QP, when the address vector is global)
 *                     a0 context, a1 qpn, a2 a3 the remote GID's 16 bytes
 *   EV_IBV_DESTROY_QP a0 context, a1 qpn, a3 qp; ret (on success the QP's counts move
 *                     to ibv_retired)
 *   EV_IBV_REG_MR     a0 context, a1 address (iova for dmabuf), a2 length, a3 mr; ret 0 / -1
 *   EV_IBV_DEREG_MR   a0 context, a1 address, a2 length, a3 mr; ret
 *   EV_IBV_CREATE_CQ  a0 context, a1 cqe, a2 cq; ret 0 / -1
 *   EV_IBV_COMPLETION ts: post time (EVF_IBV_POSTED) or poll time; duration: post ->
 *                     completion; func: WC opcode slot; ret: status; a0 context,
 *                     a1 qpn | vendor_err << 32, a2 wr_id, a3 byte_len | posted bytes << 32
 *
 * The data path needs BPF task storage (kernel 5.11+).
 */

#define IBV_MAX_WR 16          /* work requests read per post call */
#define IBV_MAX_SGE 8          /* scatter/gather entries summed per work request */
#define IBV_MAX_WC 16          /* completions read per poll call */
#define IBV_RING 32            /* signaled posts remembered per queue (NCCL keeps <= 32 in flight) */
#define IBV_SCAN 4             /* ring entries skipped at most to find a completion's post */
#define IBV_LAT_BUCKETS 36     /* log2(ns) buckets: 1 ns .. 2^35 ns (34 s); the last also holds longer */
#define IBV_NEST_NS 1000000    /* an ibv_* entry this soon after another on one thread is a tail call */

struct ibv_qp_key {
    u32 pid;
    u32 qpn;
    u64 ctx;
};

/* A signaled post waiting for its completion. */
struct ibv_posted {
    u64 ts;
    u32 wr_id;    /* low 32 bits: enough to tell in-order neighbours apart */
    u32 bytes;
};

/* One queue (send or receive) of a QP: its posts in flight and its latency histogram. */
struct ibv_queue {
    u64 posted;                   /* signaled posts seen (the ring's write sequence) */
    u64 done;                     /* the sequence of the oldest one not completed */
    struct ibv_posted ring[IBV_RING];
    u64 lat_sum_ns;
    u64 lat_count;
    u64 lat_buckets[IBV_LAT_BUCKETS];
};

/* Everything counted per QP (read by families/ibverbs/correlator.py). */
struct ibv_qp_stats {
    u64 posted[IBV_SLOTS];        /* work requests, by WR opcode slot (receives: IBV_WR_SLOT_RECV) */
    u64 posted_bytes[IBV_SLOTS];  /* sum of their SGE lengths */
    u64 done[IBV_SLOTS];          /* successful completions, by WC opcode slot */
    u64 done_bytes[IBV_SLOTS];    /* their byte_len */
    u64 unmatched;                /* completions whose post was not seen (or not remembered) */
    u64 sig_all;                  /* created with sq_sig_all: every send WR completes */
    u64 gen;                      /* this QP's incarnation: its create call's entry time, else first sight */
    struct ibv_queue q[2];        /* 0: send queue, 1: receive queue */
};
/* Live QPs (allocated on first use). A QP number can come back after a
 * destroy: the old QP moves to ibv_retired, with its incarnation in the key,
 * until user space has read it. */
BPF_F_TABLE("hash", struct ibv_qp_key, struct ibv_qp_stats, ibv_qps, IBV_QP_ENTRIES, BPF_F_NO_PREALLOC);
struct ibv_gen_key {
    u32 pid;
    u32 qpn;
    u64 ctx;
    u64 gen;
};
BPF_F_TABLE("hash", struct ibv_gen_key, struct ibv_qp_stats, ibv_retired, 1024, BPF_F_NO_PREALLOC);
BPF_ARRAY(ibv_zero, struct ibv_qp_stats, 1);             /* never written: all zeros */

/* Error completions of each QP incarnation, by opcode and status. */
struct ibv_err_key {
    u32 pid;
    u32 qpn;
    u64 ctx;
    u64 gen;
    u16 slot;
    u16 status;
    u32 pad;
};
BPF_HASH(ibv_errors, struct ibv_err_key, u64, 4096);

/* poll_cq's arguments between entry and return, in the polling thread's own storage. */
struct ibv_poll_args {
    u64 wc;
    u64 cq;
};
BPF_TASK_STORAGE(ibv_polls, struct ibv_poll_args);

static __always_inline u64 read_u64(u64 addr)
{
    u64 v = 0;
    read_user(&v, sizeof(v), (void *)addr);
    return v;
}

static __always_inline u32 read_u32(u64 addr)
{
    u32 v = 0;
    read_user(&v, sizeof(v), (void *)addr);
    return v;
}

static __always_inline u32 wr_slot(u32 opcode)
{
    if (opcode < IBV_WR_SLOT_ATOMIC_WRITE)
        return opcode;
    return opcode == 15 ? IBV_WR_SLOT_ATOMIC_WRITE : IBV_SLOT_OTHER;
}

static __always_inline u32 wc_slot(u32 opcode)
{
    if (opcode < 10)
        return opcode;
    if (opcode == IBV_WC_RECV_BIT)
        return 10;
    if (opcode == IBV_WC_RECV_BIT + 1)
        return 11;
    if (opcode <= IBV_WC_RECV_BIT + 6)
        return 12;
    return opcode <= IBV_WC_RECV_BIT + 9 ? 13 : IBV_SLOT_OTHER;
}

/* Start counting a QP afresh (retiring an older one with the same number). */
static __always_inline struct ibv_qp_stats *new_qp(struct ibv_qp_key *k, u64 gen, u64 sig_all)
{
    struct ibv_qp_stats *old = ibv_qps.lookup(k);
    if (old) {
        struct ibv_gen_key rk = {.pid = k->pid, .qpn = k->qpn, .ctx = k->ctx, .gen = old->gen};
        if (ibv_retired.update(&rk, old) != 0)
            count_stat(STAT_IBV_MAP_FULL);
        ibv_qps.delete(k);
    }
    int zero = 0;
    struct ibv_qp_stats *init = ibv_zero.lookup(&zero);
    if (!init)
        return 0;
    ibv_qps.insert(k, init);
    struct ibv_qp_stats *s = ibv_qps.lookup(k);
    if (!s) {
        count_stat(STAT_IBV_MAP_FULL);
        return 0;
    }
    s->gen = gen;
    s->sig_all = sig_all;
    return s;
}

/* The counters of a QP, created at first sight for QPs made before the
 * probes were attached (kept small: the poll loop inlines it many times). */
static __always_inline struct ibv_qp_stats *qp_stats(struct ibv_qp_key *k)
{
    struct ibv_qp_stats *s = ibv_qps.lookup(k);
    if (s)
        return s;
    int zero = 0;
    struct ibv_qp_stats *init = ibv_zero.lookup(&zero);
    if (!init)
        return 0;
    ibv_qps.insert(k, init);  /* fails harmlessly when another CPU was first */
    s = ibv_qps.lookup(k);
    if (!s) {
        count_stat(STAT_IBV_MAP_FULL);
        return 0;
    }
    if (!s->gen)
        s->gen = bpf_ktime_get_ns();
    return s;
}

/* A destroyed QP's counts wait in ibv_retired until user space reads them. */
static __always_inline void retire_qp(struct ibv_qp_key *k)
{
    struct ibv_qp_stats *s = ibv_qps.lookup(k);
    if (!s)
        return;
    struct ibv_gen_key rk = {.pid = k->pid, .qpn = k->qpn, .ctx = k->ctx, .gen = s->gen};
    if (ibv_retired.update(&rk, s) != 0) {
        count_stat(STAT_IBV_MAP_FULL);
        return;  /* keep counting it live rather than lose it */
    }
    ibv_qps.delete(k);
}

static __always_inline void count_error(struct ibv_err_key *k)
{
    u64 one = 1;
    u64 *v = ibv_errors.lookup(k);
    if (v)
        __sync_fetch_and_add(v, 1);
    else if (ibv_errors.insert(k, &one) != 0 && !ibv_errors.lookup(k))
        count_stat(STAT_IBV_MAP_FULL);
}

/* Sum of the lengths of a scatter/gather list (at most IBV_MAX_SGE entries;
 * one read per entry: most lists have one). */
static __always_inline u64 sge_bytes(u64 sg_list, s32 num_sge)
{
    if (num_sge <= 0 || !sg_list)
        return 0;
    if (num_sge > IBV_MAX_SGE)
        count_stat(STAT_IBV_TRUNCATED);
    u64 total = 0;
#pragma unroll
    for (int j = 0; j < IBV_MAX_SGE; j++) {
        if (j >= num_sge)
            break;
        total += read_u32(sg_list + j * IBV_SIZEOF_IBV_SGE + IBV_SGE_LENGTH);
    }
    return total;
}

/* -- data path ------------------------------------------------------------- */

/* The first fields of struct ibv_send_wr / ibv_recv_wr. */
struct ibv_wr_head {
    u64 wr_id;
    u64 next;
    u64 sg_list;
    s32 num_sge;
    u32 opcode;       /* send only */
    u32 send_flags;   /* send only */
    u32 pad;
};

/* Remember a signaled post; the oldest is forgotten when IBV_RING are in flight. */
static __always_inline void ring_push(struct ibv_queue *q, u64 ts, u64 wr_id, u64 bytes)
{
    u64 seq = q->posted;
    if (seq - q->done >= IBV_RING)
        q->done = seq - IBV_RING + 1;
    struct ibv_posted *e = &q->ring[seq & (IBV_RING - 1)];
    e->ts = ts;
    e->wr_id = wr_id;
    e->bytes = bytes;
    q->posted = seq + 1;
}

/* The post of a completion: the oldest in flight, or a few further when the
 * completions of older ones were not seen (polled before the probes). */
static __always_inline int ring_match(struct ibv_queue *q, u64 wr_id, struct ibv_posted *out)
{
    u64 seq = q->done;
    for (int i = 0; i < IBV_SCAN; i++, seq++) {
        if (seq >= q->posted)
            return 0;
        struct ibv_posted *e = &q->ring[seq & (IBV_RING - 1)];
        if (e->wr_id == (u32)wr_id) {
            *out = *e;
            q->done = seq + 1;
            return 1;
        }
    }
    return 0;
}

static __always_inline int on_post(struct pt_regs *ctx, int recv)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!is_watched(tgid))
        return 0;
    u64 qp = PT_REGS_PARM1(ctx);
    u64 wr = PT_REGS_PARM2(ctx);
    /* struct ibv_qp up to qp_num in one read: context at 0, qp_num at 52. */
    u32 head[IBV_QP_QP_NUM / 4 + 1] = {};
    read_user(head, sizeof(head), (void *)qp);
    struct ibv_qp_key k = {.pid = tgid, .qpn = head[IBV_QP_QP_NUM / 4]};
    k.ctx = head[IBV_QP_CONTEXT / 4] | ((u64)head[IBV_QP_CONTEXT / 4 + 1] << 32);
    struct ibv_qp_stats *s = qp_stats(&k);
    if (!s)
        return 0;
    u64 now = 0;  /* read once, at the first signaled request */
    struct ibv_queue *q = &s->q[recv ? 1 : 0];
    for (int i = 0; i < IBV_MAX_WR; i++) {
        if (!wr)
            break;
        struct ibv_wr_head h = {};
        if (read_user(&h, recv ? 28 : sizeof(h), (void *)wr))
            break;
        u64 bytes = sge_bytes(h.sg_list, h.num_sge);
        u32 slot = (recv ? IBV_WR_SLOT_RECV : wr_slot(h.opcode)) & (IBV_SLOTS - 1);
        __sync_fetch_and_add(&s->posted[slot], 1);
        __sync_fetch_and_add(&s->posted_bytes[slot], bytes);
        if (recv || (h.send_flags & IBV_SEND_SIGNALED_BIT) || s->sig_all) {
            if (!now)
                now = bpf_ktime_get_ns();
            ring_push(q, now, h.wr_id, bytes);
        }
        wr = h.next;
    }
    if (wr)
        count_stat(STAT_IBV_TRUNCATED);
    return 0;
}

int ibv_post_send_entry(struct pt_regs *ctx) { return on_post(ctx, 0); }
int ibv_post_recv_entry(struct pt_regs *ctx) { return on_post(ctx, 1); }

int ibv_poll_cq_entry(struct pt_regs *ctx)
{
    if (!is_watched(bpf_get_current_pid_tgid() >> 32))
        return 0;
    struct ibv_poll_args *a = ibv_polls.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0,
                                                         BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!a)
        return 0;
    a->wc = PT_REGS_PARM3(ctx);
    a->cq = PT_REGS_PARM1(ctx);
    return 0;
}

/* The first fields of struct ibv_wc. */
struct ibv_wc_head {
    u64 wr_id;
    u32 status;
    u32 opcode;
    u32 vendor_err;
    u32 byte_len;
    u32 imm_data;
    u32 qp_num;
};

/* One completion: count it, match it to its post, report it if it failed or was slow. */
static __always_inline void on_completion(u64 id, struct ibv_qp_key *k, struct ibv_qp_stats *s,
                                          struct ibv_wc_head *w, u64 now)
{
    u32 slot = wc_slot(w->opcode) & (IBV_SLOTS - 1);
    struct ibv_posted posted = {};
    u64 lat = 0;
    if (w->status == 0) {
        __sync_fetch_and_add(&s->done[slot], 1);
        __sync_fetch_and_add(&s->done_bytes[slot], w->byte_len);
    }
    struct ibv_queue *q = &s->q[(w->opcode & IBV_WC_RECV_BIT) ? 1 : 0];
    if (ring_match(q, w->wr_id, &posted)) {
        lat = now - posted.ts;
        u32 b = bpf_log2l(lat);
        if (b >= IBV_LAT_BUCKETS)
            b = IBV_LAT_BUCKETS - 1;
        /* Plain adds, like the ring: a queue has one poller in practice, and a race
         * with a second would lose a latency sample, never a count. */
        q->lat_buckets[b]++;
        q->lat_sum_ns += lat;
        q->lat_count++;
    } else {
        __sync_fetch_and_add(&s->unmatched, 1);
    }
    if (w->status != 0) {
        struct ibv_err_key ek = {.pid = k->pid, .qpn = k->qpn, .ctx = k->ctx, .gen = s->gen, .slot = slot,
                                 .status = w->status};
        count_error(&ek);
    }
    if (w->status != 0 || (posted.ts && lat >= IBV_SLOW_NS)) {
        struct event e = {};
        new_event(&e, id, EV_IBV_COMPLETION, slot);
        if (posted.ts) {
            e.ts_ns = posted.ts;
            e.duration_ns = lat;
            e.flags = EVF_IBV_POSTED;
        }
        e.ret = w->status;
        e.a0 = k->ctx;
        e.a1 = w->qp_num | ((u64)w->vendor_err << 32);
        e.a2 = w->wr_id;
        e.a3 = w->byte_len | ((u64)posted.bytes << 32);
        emit(&e);
    }
}

int ibv_poll_cq_return(struct pt_regs *ctx)
{
    s32 polled = PT_REGS_RC(ctx);
    if (polled <= 0)
        return 0;  /* an empty poll, the common case, costs nothing more */
    struct ibv_poll_args *ap = ibv_polls.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0, 0);
    if (!ap || !ap->wc)
        return 0;
    struct ibv_poll_args a = *ap;
    ap->wc = 0;
    if (polled > IBV_MAX_WC)
        count_stat(STAT_IBV_TRUNCATED);
    u32 n = polled;
    u64 id = bpf_get_current_pid_tgid();
    u64 now = bpf_ktime_get_ns();
    struct ibv_qp_key k = {.pid = id >> 32, .ctx = read_u64(a.cq + IBV_CQ_CONTEXT)};
    struct ibv_qp_stats *s = 0;
    for (u32 i = 0; i < IBV_MAX_WC; i++) {
        if (i >= n)
            break;
        struct ibv_wc_head w = {};
        if (read_user(&w, sizeof(w), (void *)(a.wc + i * IBV_SIZEOF_IBV_WC)))
            break;
        if (!s || k.qpn != w.qp_num) {
            k.qpn = w.qp_num;
            s = qp_stats(&k);
            if (!s)
                continue;
        }
        on_completion(id, &k, s, &w, now);
    }
    return 0;
}

/* -- control path ---------------------------------------------------------- */

/* Entry half: remember the arguments until the call returns. A probed ibv_*
 * function that tail-calls another probed one (ibv_reg_mr@@IBVERBS_1.1 jumps
 * to ibv_reg_mr_iova2) fires both entries and both returns: the inner entry
 * is dropped here, and the first return consumes the outer entry. */
static __always_inline int on_ibv_entry(u8 kind, u8 func, u64 a0, u64 a1, u64 a2, u64 a3)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_watched(id >> 32))
        return 0;
    struct event *open = inflight.lookup(&id);
    if (open && open->kind >= EV_IBV_OPEN && open->kind <= EV_IBV_COMPLETION &&
        bpf_ktime_get_ns() - open->ts_ns < IBV_NEST_NS)
        return 0;
    remember_call(id, kind, func, 0, a0, a1, a2, a3);
    return 0;
}

/* a1 of EV_IBV_MODIFY_QP: qpn (0-23) | new state (24-27) | mask has STATE (28) |
 * is_global (29) | mask has AV (30) | mask has DEST_QPN (31) | dest_qpn (32-55) |
 * path_mtu (56-59) | mask has PORT (60). */
static __always_inline u64 pack_modify(u32 qpn, u64 attr, u32 mask, u8 is_global)
{
    u64 state = read_u32(attr + IBV_QPATTR_QP_STATE) & 0xf;
    u64 dest = read_u32(attr + IBV_QPATTR_DEST_QP_NUM) & 0xffffff;
    u64 mtu = read_u32(attr + IBV_QPATTR_PATH_MTU) & 0xf;
    return (qpn & 0xffffff) | (state << 24) | ((u64)!!(mask & IBV_MASK_STATE) << 28) |
           ((u64)!!is_global << 29) | ((u64)!!(mask & IBV_MASK_AV) << 30) |
           ((u64)!!(mask & IBV_MASK_DEST_QPN) << 31) | (dest << 32) | (mtu << 56) |
           ((u64)!!(mask & IBV_MASK_PORT) << 60);
}

static __always_inline void finish_modify(struct event *e)
{
    u64 qp = e->a0, attr = e->a1;
    u32 mask = e->a2;
    u64 qctx = read_u64(qp + IBV_QP_CONTEXT);
    u32 qpn = read_u32(qp + IBV_QP_QP_NUM);
    u8 is_global = 0, ah_port = 0, port = 0;
    u16 dlid = 0;
    if (mask & IBV_MASK_AV) {
        read_user(&is_global, 1, (void *)(attr + IBV_QPATTR_IS_GLOBAL));
        read_user(&dlid, 2, (void *)(attr + IBV_QPATTR_DLID));
        read_user(&ah_port, 1, (void *)(attr + IBV_QPATTR_AH_PORT));
    }
    if (mask & IBV_MASK_PORT)
        read_user(&port, 1, (void *)(attr + IBV_QPATTR_PORT_NUM));
    if ((mask & IBV_MASK_AV) && is_global) {
        struct event g = *e;
        g.kind = EV_IBV_QP_GID;
        g.a0 = qctx;
        g.a1 = qpn;
        read_user(&g.a2, 16, (void *)(attr + IBV_QPATTR_DGID));
        emit(&g);
    }
    e->a3 = qp;
    e->a0 = qctx;
    e->a1 = pack_modify(qpn, attr, mask, is_global);
    e->a2 = mask | ((u64)dlid << 32) | ((u64)ah_port << 48) | ((u64)port << 56);
}

/* ibv_open_device returned: tell user space the context and device name, so
 * it can find the provider's data-path functions in its ops table (and, in
 * command mode with the data path on, stop the process until they are
 * probed, like discovery.c does at a library open). */
static __always_inline void report_context(struct event *e)
{
    struct strevent *s = strevents.ringbuf_reserve(sizeof(struct strevent));
    if (!s) {
        count_stat(STAT_STR_LOST);
        return;
    }
    s->pid = e->pid;
    s->kind = SEV_IBV_CONTEXT;
    s->exec = 0;
    s->a0 = e->a1;
    u64 dev = read_u64(e->a1 + IBV_CTX_DEVICE);
    read_user_str(s->s, 64, (void *)(dev + IBV_DEVICE_NAME));
    submit_open(s, PAUSE_ON_LOAD && IBV_DATA_PATH);
}

/* Return half, shared by every control-path function. */
int uretprobe_ibv(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct event *open = inflight.lookup(&id);
    if (!open || open->kind < EV_IBV_OPEN || open->kind > EV_IBV_COMPLETION)
        return 0;
    struct event e = *open;
    inflight.delete(&id);
    e.duration_ns = bpf_ktime_get_ns() - e.ts_ns;
    u64 rc = PT_REGS_RC(ctx);
    e.ret = (s32)rc;
    switch (e.kind) {
    case EV_IBV_OPEN:
        e.a1 = rc;
        e.ret = rc ? 0 : -1;
        if (rc)
            report_context(&e);
        break;
    case EV_IBV_CREATE_QP: {
        u64 attr = e.a1;
        e.ret = rc ? 0 : -1;
        e.a1 = rc;
        if (rc) {
            struct ibv_qp_key k = {.pid = e.pid};
            k.ctx = read_u64(rc + IBV_QP_CONTEXT);
            k.qpn = read_u32(rc + IBV_QP_QP_NUM);
            u64 type = read_u32(attr + IBV_QPINIT_QP_TYPE);
            u64 sig_all = read_u32(attr + IBV_QPINIT_SQ_SIG_ALL) != 0;
            e.a0 = k.ctx;
            e.a2 = k.qpn | (type << 32) | (sig_all << 40);
            e.a3 = read_u64(attr + IBV_QPINIT_CAP);  /* max_send_wr, max_recv_wr */
            new_qp(&k, e.ts_ns, sig_all);  /* its incarnation: this event's ts */
        }
        break;
    }
    case EV_IBV_MODIFY_QP:
        finish_modify(&e);
        break;
    case EV_IBV_DESTROY_QP:
        if (rc == 0) {
            struct ibv_qp_key k = {.pid = e.pid, .qpn = e.a1, .ctx = e.a0};
            retire_qp(&k);
        }
        break;
    case EV_IBV_REG_MR:
        e.a3 = rc;
        e.ret = rc ? 0 : -1;
        break;
    case EV_IBV_CREATE_CQ:
        e.a2 = rc;
        e.ret = rc ? 0 : -1;
        break;
    }
    emit(&e);
    return 0;
}
