/* ibverbs_workload: drives libibverbs the way NCCL's IB transport does.
 *
 * Like NCCL (src/misc/ibvwrap.cc, ibvsymbols.cc) it dlopen()s libibverbs.so.1
 * and takes every exported function with dlvsym() at the version callers
 * link to (IBVERBS_1.1; ibv_reg_mr_iova2 at IBVERBS_1.8); the data path
 * (ibv_post_send, ibv_post_recv, ibv_poll_cq) is the inline code of
 * <infiniband/verbs.h>, a call through the context's ops table.
 *
 * Phases, run in order on one device (--phases, comma-separated):
 *   transfer  QPs A <-> B, both ways, --iterations times: B posts a receive
 *             (2 SGEs); A posts SEND (2 SGEs) + RDMA_WRITE (unsignaled) +
 *             RDMA_READ as one chain; A posts a receive with no SGE; B posts
 *             RDMA_WRITE_WITH_IMM into A (NCCL's way to say "data is there").
 *             With --qp-ex, B is created with ibv_create_qp_ex.
 *   errors    C -> a QP number nobody has (retry exceeded, then flushes);
 *             D -> E with no receive posted (RNR retry exceeded); F is moved
 *             RESET -> RTR, which fails (ibv_modify_qp returns EINVAL).
 * Then everything is destroyed, unless --exit-open (exit with QPs, CQs and
 * MRs still open). --reload then unloads libibverbs and its provider and runs
 * the phases again on a fresh dlopen (see unload_all()).
 * --bench N instead times N posts, N polls that each find one completion,
 * and N polls of an empty CQ, --rounds times. --settle-ms M waits M ms after
 * opening the device (time for an agent in host mode to probe the provider).
 *
 * The last line of stdout is JSON with what the program did and saw: per QP,
 * work requests posted (count, bytes by opcode) and completions polled
 * (count, byte_len sum by opcode and status), so tests can compare a
 * tracer's numbers with the truth. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BUF_BYTES (1 << 20)
#define MAX_QPS 8

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ibverbs_workload: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

/* -- libibverbs, loaded like NCCL loads it ------------------------------- */

struct verbs {
    void *handle;
    struct ibv_device **(*get_device_list)(int *);
    void (*free_device_list)(struct ibv_device **);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*close_device)(struct ibv_context *);
    int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
    int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    int (*dealloc_pd)(struct ibv_pd *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *, void *, size_t, uint64_t, unsigned int);
    int (*dereg_mr)(struct ibv_mr *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
    int (*destroy_cq)(struct ibv_cq *);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*destroy_qp)(struct ibv_qp *);
};

static void *sym(void *h, const char *name, const char *version)
{
    void *p = dlvsym(h, name, version);
    if (!p)
        die("libibverbs has no %s@%s: %s", name, version, dlerror());
    return p;
}

static void load_verbs(struct verbs *v)
{
    v->handle = dlopen("libibverbs.so.1", RTLD_NOW);
    if (!v->handle)
        die("cannot load libibverbs.so.1 (apt-get install libibverbs1): %s", dlerror());
    const char *V = "IBVERBS_1.1";
    v->get_device_list = sym(v->handle, "ibv_get_device_list", V);
    v->free_device_list = sym(v->handle, "ibv_free_device_list", V);
    v->get_device_name = sym(v->handle, "ibv_get_device_name", V);
    v->open_device = sym(v->handle, "ibv_open_device", V);
    v->close_device = sym(v->handle, "ibv_close_device", V);
    v->query_device = sym(v->handle, "ibv_query_device", V);
    v->query_port = sym(v->handle, "ibv_query_port", V);
    v->query_gid = sym(v->handle, "ibv_query_gid", V);
    v->alloc_pd = sym(v->handle, "ibv_alloc_pd", V);
    v->dealloc_pd = sym(v->handle, "ibv_dealloc_pd", V);
    v->reg_mr = sym(v->handle, "ibv_reg_mr", V);
    v->reg_mr_iova2 = sym(v->handle, "ibv_reg_mr_iova2", "IBVERBS_1.8");
    v->dereg_mr = sym(v->handle, "ibv_dereg_mr", V);
    v->create_cq = sym(v->handle, "ibv_create_cq", V);
    v->destroy_cq = sym(v->handle, "ibv_destroy_cq", V);
    v->create_qp = sym(v->handle, "ibv_create_qp", V);
    v->modify_qp = sym(v->handle, "ibv_modify_qp", V);
    v->destroy_qp = sym(v->handle, "ibv_destroy_qp", V);
}

/* -- what the program saw, per QP ----------------------------------------- */

#define NOPS 16
struct tally {
    unsigned long long count[NOPS][32];  /* [opcode slot][status] */
    unsigned long long bytes[NOPS][32];
};

struct qp_record {
    struct ibv_qp *qp;
    struct ibv_cq *cq;
    char name[8];
    uint32_t qpn, remote_qpn;
    int transitions;
    unsigned long long posted[NOPS], posted_bytes[NOPS];  /* by WR opcode; slot NOPS-1: receives */
    struct tally done;                                      /* by WC opcode slot and status */
};

static struct qp_record qps[MAX_QPS * 2];
static int nqps;
static const int RECV_SLOT = NOPS - 1;

static const char *wr_name(int op)
{
    static const char *names[] = {"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM", "RDMA_READ"};
    return op == RECV_SLOT ? "RECV" : op < 5 ? names[op] : "OTHER";
}

static int wc_slot(enum ibv_wc_opcode op)
{
    return op & IBV_WC_RECV ? 8 + (int)(op - IBV_WC_RECV) : (int)op;  /* RECV=8, RECV_RDMA_WITH_IMM=9 */
}

static const char *wc_name(int slot)
{
    static const char *names[] = {"SEND", "RDMA_WRITE", "RDMA_READ", "COMP_SWAP", "FETCH_ADD",
                                  "BIND_MW", "LOCAL_INV", "TSO", "RECV", "RECV_RDMA_WITH_IMM"};
    return slot < 10 ? names[slot] : "OTHER";
}

static const char *status_name(int st)
{
    static const char *names[] = {
        "SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR", "WR_FLUSH_ERR",
        "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR", "REM_OP_ERR",
        "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR",
        "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR", "TM_ERR",
        "TM_RNDV_INCOMPLETE"};
    return st < (int)(sizeof(names) / sizeof(names[0])) ? names[st] : "OTHER";
}

static struct qp_record *record_of(uint32_t qpn)
{
    for (int i = 0; i < nqps; i++)
        if (qps[i].qpn == qpn && qps[i].qp)
            return &qps[i];
    die("completion for unknown QP %u", qpn);
    return NULL;
}

/* -- resources ----------------------------------------------------------- */

struct device {
    struct verbs v;
    struct ibv_device **list;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_port_attr port;
    union ibv_gid gid;
    char *buf_a, *buf_b;
    struct ibv_mr *mr_a, *mr_b;
    unsigned long long mr_bytes;
};

static void open_device(struct device *d)
{
    int n = 0;
    d->list = d->v.get_device_list(&n);
    if (!d->list || n < 1)
        die("no RDMA device (run under examples/ibverbs/fakedev.sh for the fakeverbs provider)");
    d->ctx = d->v.open_device(d->list[0]);
    if (!d->ctx)
        die("ibv_open_device(%s): %s", d->v.get_device_name(d->list[0]), strerror(errno));
    struct ibv_device_attr attr;
    if (d->v.query_device(d->ctx, &attr))
        die("ibv_query_device failed");
    if (d->v.query_port(d->ctx, 1, &d->port))
        die("ibv_query_port failed");
    if (d->v.query_gid(d->ctx, 1, 0, &d->gid))
        die("ibv_query_gid failed");
    d->pd = d->v.alloc_pd(d->ctx);
    if (!d->pd)
        die("ibv_alloc_pd failed");
    d->buf_a = aligned_alloc(4096, BUF_BYTES);
    d->buf_b = aligned_alloc(4096, BUF_BYTES);
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    d->mr_a = d->v.reg_mr(d->pd, d->buf_a, BUF_BYTES, access);
    d->mr_b = d->v.reg_mr_iova2(d->pd, d->buf_b, BUF_BYTES, (uintptr_t)d->buf_b, (unsigned)access);
    if (!d->mr_a || !d->mr_b)
        die("ibv_reg_mr failed: %s", strerror(errno));
    d->mr_bytes = 2ull * BUF_BYTES;
}

static struct qp_record *new_qp(struct device *d, const char *name, int depth, int use_ex)
{
    if (nqps == (int)(sizeof(qps) / sizeof(qps[0])))
        die("too many QPs");
    struct qp_record *r = &qps[nqps++];
    memset(r, 0, sizeof(*r));
    snprintf(r->name, sizeof(r->name), "%s", name);
    r->cq = d->v.create_cq(d->ctx, depth * 2, NULL, NULL, 0);
    if (!r->cq)
        die("ibv_create_cq failed: %s", strerror(errno));
    struct ibv_qp_cap cap = {.max_send_wr = (uint32_t)depth, .max_recv_wr = (uint32_t)depth,
                             .max_send_sge = 2, .max_recv_sge = 2};
    if (use_ex) {
        /* What the inline ibv_create_qp_ex() does for any mask beyond the PD alone. */
        struct ibv_qp_init_attr_ex ex = {.send_cq = r->cq, .recv_cq = r->cq, .cap = cap, .qp_type = IBV_QPT_RC,
                                         .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS,
                                         .pd = d->pd};
        struct verbs_context *vctx = verbs_get_ctx_op(d->ctx, create_qp_ex);
        if (!vctx)
            die("the provider has no create_qp_ex");
        r->qp = vctx->create_qp_ex(d->ctx, &ex);
    } else {
        struct ibv_qp_init_attr attr = {.send_cq = r->cq, .recv_cq = r->cq, .cap = cap, .qp_type = IBV_QPT_RC};
        r->qp = d->v.create_qp(d->pd, &attr);
    }
    if (!r->qp)
        die("creating QP %s failed: %s", name, strerror(errno));
    r->qpn = r->qp->qp_num;
    return r;
}

/* INIT -> RTR (remote QPN, LID, GID, port) -> RTS, as NCCL's ncclIbInitQp / ncclIbRtrQp / ncclIbRtsQp. */
static void connect_qp(struct device *d, struct qp_record *r, uint32_t remote_qpn)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
    if (d->v.modify_qp(r->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die("INIT failed");
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = d->gid;
    a.ah_attr.grh.hop_limit = 255;
    a.ah_attr.dlid = d->port.lid;
    a.ah_attr.port_num = 1;
    if (d->v.modify_qp(r->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die("RTR failed");
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    if (d->v.modify_qp(r->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        die("RTS failed");
    r->remote_qpn = remote_qpn;
    r->transitions += 3;
}

/* -- data path (the inline calls of verbs.h) ------------------------------ */

static void post_send(struct qp_record *r, struct ibv_send_wr *wr)
{
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(r->qp, wr, &bad);
    if (rc)
        die("ibv_post_send on %s: %s", r->name, strerror(rc));
    for (; wr; wr = wr->next) {
        r->posted[wr->opcode]++;
        for (int i = 0; i < wr->num_sge; i++)
            r->posted_bytes[wr->opcode] += wr->sg_list[i].length;
    }
}

static void post_recv(struct qp_record *r, struct ibv_recv_wr *wr)
{
    struct ibv_recv_wr *bad = NULL;
    int rc = ibv_post_recv(r->qp, wr, &bad);
    if (rc)
        die("ibv_post_recv on %s: %s", r->name, strerror(rc));
    r->posted[RECV_SLOT]++;
    for (int i = 0; i < wr->num_sge; i++)
        r->posted_bytes[RECV_SLOT] += wr->sg_list[i].length;
}

/* Poll `cq` four at a time (NCCL's batch) until `want` completions arrived. */
static void drain(struct ibv_cq *cq, int want)
{
    struct ibv_wc wc[4];
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (want > 0) {
        int n = ibv_poll_cq(cq, want < 4 ? want : 4, wc);
        if (n < 0)
            die("ibv_poll_cq failed");
        for (int i = 0; i < n; i++) {
            struct qp_record *r = record_of(wc[i].qp_num);
            int slot = wc_slot(wc[i].opcode);
            r->done.count[slot][wc[i].status]++;
            if (wc[i].status == IBV_WC_SUCCESS)
                r->done.bytes[slot][wc[i].status] += wc[i].byte_len;
        }
        want -= n;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 10)
            die("completions did not arrive within 10 s (%d missing)", want);
    }
}

static void transfer(struct device *d, int iterations, int use_ex)
{
    struct qp_record *a = new_qp(d, "A", 64, 0);
    struct qp_record *b = new_qp(d, "B", 64, use_ex);
    connect_qp(d, a, b->qpn);
    connect_qp(d, b, a->qpn);
    for (int i = 0; i < iterations; i++) {
        uint64_t id = (uint64_t)(i + 1) << 8;
        memset(d->buf_a, 'a' + i % 26, 3000);
        struct ibv_sge rsge[2] = {{(uintptr_t)d->buf_b, 4096, d->mr_b->lkey},
                                  {(uintptr_t)d->buf_b + 4096, 4096, d->mr_b->lkey}};
        struct ibv_recv_wr rwr = {.wr_id = id | 1, .sg_list = rsge, .num_sge = 2};
        post_recv(b, &rwr);

        struct ibv_sge s0[2] = {{(uintptr_t)d->buf_a, 1000, d->mr_a->lkey},
                                {(uintptr_t)d->buf_a + 1000, 2000, d->mr_a->lkey}};
        struct ibv_sge s1 = {(uintptr_t)d->buf_a + 65536, 65536, d->mr_a->lkey};
        struct ibv_sge s2 = {(uintptr_t)d->buf_a + 262144, 8192, d->mr_a->lkey};
        struct ibv_send_wr w2 = {.wr_id = id | 4, .sg_list = &s2, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
                                 .send_flags = IBV_SEND_SIGNALED};
        w2.wr.rdma.remote_addr = (uintptr_t)d->buf_b + 131072;
        w2.wr.rdma.rkey = d->mr_b->rkey;
        struct ibv_send_wr w1 = {.wr_id = id | 3, .next = &w2, .sg_list = &s1, .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_WRITE};
        w1.wr.rdma.remote_addr = (uintptr_t)d->buf_b + 65536;
        w1.wr.rdma.rkey = d->mr_b->rkey;
        struct ibv_send_wr w0 = {.wr_id = id | 2, .next = &w1, .sg_list = s0, .num_sge = 2,
                                 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
        post_send(a, &w0);

        struct ibv_recv_wr ack = {.wr_id = id | 5, .num_sge = 0};
        post_recv(a, &ack);
        struct ibv_sge s3 = {(uintptr_t)d->buf_b + 524288, 4096, d->mr_b->lkey};
        struct ibv_send_wr w3 = {.wr_id = id | 6, .sg_list = &s3, .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
                                 .imm_data = htobe32(4096)};
        w3.wr.rdma.remote_addr = (uintptr_t)d->buf_a + 524288;
        w3.wr.rdma.rkey = d->mr_a->rkey;
        post_send(b, &w3);

        drain(a->cq, 3);  /* SEND, RDMA_READ, RECV_RDMA_WITH_IMM */
        drain(b->cq, 2);  /* RECV, RDMA_WRITE */
        if (d->buf_b[0] != 'a' + i % 26 || d->buf_b[2999] != 'a' + i % 26)
            die("the SEND payload did not arrive");
    }
}

static void errors(struct device *d)
{
    struct qp_record *c = new_qp(d, "C", 8, 0);
    connect_qp(d, c, 0xdead01);  /* no such QP: nobody will ever acknowledge */
    struct ibv_sge s = {(uintptr_t)d->buf_a, 100, d->mr_a->lkey};
    struct ibv_send_wr w[3];
    for (int i = 0; i < 3; i++)
        w[i] = (struct ibv_send_wr){.wr_id = 0xc00 + (uint64_t)i, .next = i < 2 ? &w[i + 1] : NULL, .sg_list = &s,
                                    .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
    post_send(c, w);
    drain(c->cq, 3);  /* RETRY_EXC_ERR, then two WR_FLUSH_ERR */

    struct qp_record *dq = new_qp(d, "D", 8, 0);
    struct qp_record *e = new_qp(d, "E", 8, 0);
    connect_qp(d, dq, e->qpn);
    connect_qp(d, e, dq->qpn);
    struct ibv_send_wr one = {.wr_id = 0xd00, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
                              .send_flags = IBV_SEND_SIGNALED};
    post_send(dq, &one);
    drain(dq->cq, 1);  /* RNR_RETRY_EXC_ERR: E never posted a receive */

    struct qp_record *f = new_qp(d, "F", 8, 0);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .dest_qp_num = e->qpn};
    if (d->v.modify_qp(f->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_DEST_QPN) != EINVAL)
        die("RESET -> RTR should have failed");
}

static void teardown(struct device *d)
{
    for (int i = 0; i < nqps; i++) {
        if (!qps[i].qp)
            continue;
        if (d->v.destroy_qp(qps[i].qp) || d->v.destroy_cq(qps[i].cq))
            die("destroying QP %s failed", qps[i].name);
        qps[i].qp = NULL;
    }
    if (d->v.dereg_mr(d->mr_a) || d->v.dereg_mr(d->mr_b) || d->v.dealloc_pd(d->pd) || d->v.close_device(d->ctx))
        die("teardown failed");
    d->v.free_device_list(d->list);
    free(d->buf_a);
    free(d->buf_b);
}

/* libibverbs never dlclose()s a provider, and a loaded provider keeps
 * libibverbs loaded. To see both files leave the address space (and come
 * back, maybe elsewhere) the provider's references are dropped by hand. */
static int mapped(const char *needle)
{
    char line[4096];
    int found = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    while (f && fgets(line, sizeof(line), f))
        found |= strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return found;
}

static void unload_all(struct device *d, void *provider_fn)
{
    Dl_info info;
    if (!dladdr(provider_fn, &info))
        die("dladdr on the provider's post_send failed");
    void *p = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (!p)
        die("provider %s not loaded?", info.dli_fname);
    dlclose(p);
    dlclose(p);  /* the reference libibverbs' load_driver() took */
    dlclose(d->v.handle);
    if (mapped("libibverbs.so") || mapped("-rdmav34.so"))
        die("libibverbs or its provider is still mapped after dlclose");
}

/* -- benchmark ------------------------------------------------------------ */

static double elapsed_ns(struct timespec a, struct timespec b)
{
    return (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
}

static void bench(struct device *d, int n, int rounds)
{
    struct qp_record *a = new_qp(d, "A", n, 0);
    struct qp_record *b = new_qp(d, "B", 8, 0);
    connect_qp(d, a, b->qpn);
    connect_qp(d, b, a->qpn);
    struct ibv_sge s = {(uintptr_t)d->buf_a, 64, d->mr_a->lkey};
    struct ibv_send_wr w = {.sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
    w.wr.rdma.remote_addr = (uintptr_t)d->buf_b;
    w.wr.rdma.rkey = d->mr_b->rkey;
    struct ibv_wc wc;
    printf("{\"bench\": [");
    for (int r = 0; r < rounds; r++) {
        struct timespec t0, t1, t2, t3;
        struct ibv_send_wr *bad;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < n; i++) {
            w.wr_id = (uint64_t)i;
            if (ibv_post_send(a->qp, &w, &bad))
                die("bench post failed");
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        for (int i = 0; i < n; i++)
            if (ibv_poll_cq(a->cq, 1, &wc) != 1 || wc.status != IBV_WC_SUCCESS)
                die("bench poll found no completion (run with FAKEVERBS_DELAY_NS=0)");
        clock_gettime(CLOCK_MONOTONIC, &t2);
        for (int i = 0; i < n; i++)
            if (ibv_poll_cq(a->cq, 1, &wc) != 0)
                die("bench: unexpected completion");
        clock_gettime(CLOCK_MONOTONIC, &t3);
        printf("%s{\"post_ns\": %.1f, \"poll_ns\": %.1f, \"poll_empty_ns\": %.1f}", r ? ", " : "",
               elapsed_ns(t0, t1) / n, elapsed_ns(t1, t2) / n, elapsed_ns(t2, t3) / n);
    }
    printf("], \"pid\": %d}\n", getpid());
}

/* -- report --------------------------------------------------------------- */

static void report(struct device *d, int reloads, int exit_open)
{
    char gid[64];
    const uint8_t *g = d->gid.raw;
    snprintf(gid, sizeof(gid), "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x", g[0], g[1],
             g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15]);
    printf("{\"pid\": %d, \"device\": \"%s\", \"lid\": %u, \"gid\": \"%s\", \"mr_bytes\": %llu, \"reloads\": %d, "
           "\"exit_open\": %s, \"qps\": [",
           getpid(), d->v.get_device_name(d->ctx->device), d->port.lid, gid, d->mr_bytes, reloads,
           exit_open ? "true" : "false");
    for (int i = 0; i < nqps; i++) {
        struct qp_record *r = &qps[i];
        printf("%s{\"name\": \"%s\", \"qpn\": %u, \"remote_qpn\": %u, \"transitions\": %d, \"posted\": {", i ? ", " : "",
               r->name, r->qpn, r->remote_qpn, r->transitions);
        int first = 1;
        for (int op = 0; op < NOPS; op++) {
            if (!r->posted[op])
                continue;
            printf("%s\"%s\": [%llu, %llu]", first ? "" : ", ", wr_name(op), r->posted[op], r->posted_bytes[op]);
            first = 0;
        }
        printf("}, \"completions\": {");
        first = 1;
        for (int op = 0; op < NOPS; op++) {
            for (int st = 0; st < 32; st++) {
                if (!r->done.count[op][st])
                    continue;
                printf("%s\"%s:%s\": [%llu, %llu]", first ? "" : ", ", wc_name(op),
                       status_name(st), r->done.count[op][st], r->done.bytes[op][st]);
                first = 0;
            }
        }
        printf("}}");
    }
    printf("]}\n");
}

static void usage(void)
{
    fprintf(stderr, "usage: ibverbs_workload [--iterations N] [--phases transfer,errors] [--qp-ex] [--exit-open]\n"
                    "                        [--reload] [--settle-ms M] | --bench N [--rounds R] [--settle-ms M]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    int iterations = 10, use_ex = 0, exit_open = 0, reload = 0, bench_ops = 0, rounds = 5, settle_ms = 0;
    int do_transfer = 1, do_errors = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iterations") && i + 1 < argc) {
            iterations = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--phases") && i + 1 < argc) {
            const char *p = argv[++i];
            do_transfer = strstr(p, "transfer") != NULL;
            do_errors = strstr(p, "errors") != NULL;
        } else if (!strcmp(argv[i], "--qp-ex")) {
            use_ex = 1;
        } else if (!strcmp(argv[i], "--exit-open")) {
            exit_open = 1;
        } else if (!strcmp(argv[i], "--reload")) {
            reload = 1;
        } else if (!strcmp(argv[i], "--bench") && i + 1 < argc) {
            bench_ops = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--settle-ms") && i + 1 < argc) {
            settle_ms = atoi(argv[++i]);
        } else {
            usage();
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct device d = {0};
    load_verbs(&d.v);
    open_device(&d);
    if (settle_ms > 0)
        usleep((useconds_t)settle_ms * 1000);
    if (bench_ops > 0) {
        bench(&d, bench_ops, rounds);
        return 0;
    }
    for (int round = 0; round <= reload; round++) {
        if (round) {
            void *provider_fn = (void *)d.ctx->ops.post_send;
            teardown(&d);
            unload_all(&d, provider_fn);
            memset(&d, 0, sizeof(d));
            load_verbs(&d.v);
            open_device(&d);
        }
        if (do_transfer)
            transfer(&d, iterations, use_ex);
        if (do_errors)
            errors(&d);
    }
    report(&d, reload, exit_open);
    if (exit_open)
        exit(0);  /* QPs, CQs, MRs and the device stay open: the process just ends */
    teardown(&d);
    return 0;
}
