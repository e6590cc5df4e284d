/* fakeverbs: an RDMA provider for the real libibverbs, without hardware.
 *
 * libibverbs loads it like any provider (RDMAV_DRIVERS=<path>/libfakeverbs
 * loads libfakeverbs-rdmav34.so) and binds it to a device found in sysfs
 * (examples/ibverbs/fakedev.sh makes one: "fakeverbs0"). From then on the
 * real library's ibv_open_device, ibv_create_qp, ibv_modify_qp, ibv_reg_mr,
 * ... run their real code and call the operations below through the private
 * ops table, and verbs_set_ops() fills the public struct ibv_context ops that
 * the inline ibv_post_send / ibv_post_recv / ibv_poll_cq call through: the
 * same path a program takes on an mlx5 NIC.
 *
 * Behaviour: a loopback fabric inside one process. A reliable-connected QP
 * connected (INIT -> RTR with a remote QP number) to another QP of this
 * process moves real bytes: SEND consumes a posted receive of the peer,
 * RDMA_WRITE/RDMA_READ copy to/from the peer's memory region named by rkey.
 * A work request completes FAKEVERBS_DELAY_NS (default 10 us) after it was
 * posted, in order per QP, when some thread polls a CQ. Errors happen as on a
 * fabric: no such remote QP -> IBV_WC_RETRY_EXC_ERR; no receive posted at
 * the peer -> IBV_WC_RNR_RETRY_EXC_ERR; bad rkey -> IBV_WC_REM_ACCESS_ERR;
 * after an error the QP is in the error state and everything outstanding
 * completes with IBV_WC_WR_FLUSH_ERR. FAKEVERBS_FAIL_EVERY=N additionally
 * fails every Nth send-queue work request with status FAKEVERBS_FAIL_STATUS
 * (a number, default 12 = IBV_WC_RETRY_EXC_ERR). FAKEVERBS_LID sets the port
 * LID (default 1).
 *
 * Like real providers, every function is static: nothing but the
 * constructor's registration is visible, so a tracer has to find post_send
 * and friends through a live context's ops table. */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "verbs_private.h"

/* The private layouts, checked against what libibverbs 44 reads (see the
 * disassembly notes in verbs_private.h). */
_Static_assert(sizeof(struct ibv_device) == 0x298, "struct ibv_device changed");
_Static_assert(offsetof(struct verbs_device, sysfs) == 0x2b8, "verbs_device layout");
_Static_assert(offsetof(struct verbs_device_ops, alloc_context) == 0x28, "verbs_device_ops layout");
_Static_assert(sizeof(struct verbs_context_ops) == 76 * sizeof(void *), "verbs_context_ops layout");
_Static_assert(offsetof(struct verbs_mr, access) == 0x34, "verbs_mr layout");

#define FV_MAX_SGE 4
#define FV_MAX_WR (1u << 20)
#define FV_VENDOR_ERR 0xf5  /* any non-zero value: real providers report theirs */

struct fv_wr {
    uint64_t wr_id;
    uint64_t due_ns;
    uint64_t remote_addr;
    uint32_t rkey;
    uint32_t imm_data;
    int opcode;        /* enum ibv_wr_opcode; receives do not use it */
    int signaled;
    int with_imm;
    uint32_t num_sge;
    struct ibv_sge sge[FV_MAX_SGE];
};

struct fv_queue {
    struct fv_wr *wr;
    uint32_t cap, head, count;
};

struct fv_qp {
    struct ibv_qp qp;
    struct fv_queue sq, rq;
    struct ibv_qp_cap cap;
    int sq_sig_all;
    uint32_t remote_qpn;
    struct fv_qp *next;
};

struct fv_cq {
    struct ibv_cq cq;
    struct ibv_wc *ring;
    uint32_t cap, head, count;
    uint64_t overruns;
};

struct fv_mr {
    struct verbs_mr vmr;
    uint64_t iova;
    struct fv_mr *next;
};

struct fv_context {
    struct verbs_context vctx;
};

/* One fabric per process: every context, QP and MR of the provider. */
static pthread_mutex_t fv_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fv_qp *fv_qps;
static struct fv_mr *fv_mrs;
static uint32_t fv_next_qpn = 0x1a4;
static uint32_t fv_next_key = 0x1100;
static uint64_t fv_sends_executed;

static struct {
    uint64_t delay_ns;
    uint64_t fail_every;
    int fail_status;
    uint16_t lid;
} fv_cfg;

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 0) : dflt;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* -- queues ---------------------------------------------------------------- */

static int queue_init(struct fv_queue *q, uint32_t cap)
{
    q->cap = cap ? cap : 1;
    q->head = q->count = 0;
    q->wr = calloc(q->cap, sizeof(*q->wr));
    return q->wr ? 0 : ENOMEM;
}

static struct fv_wr *queue_tail(struct fv_queue *q)
{
    return q->count < q->cap ? &q->wr[(q->head + q->count) % q->cap] : NULL;
}

static struct fv_wr *queue_head(struct fv_queue *q)
{
    return q->count ? &q->wr[q->head] : NULL;
}

static void queue_pop(struct fv_queue *q)
{
    q->head = (q->head + 1) % q->cap;
    q->count--;
}

static void cq_push(struct ibv_cq *ibcq, const struct ibv_wc *wc)
{
    struct fv_cq *cq = (struct fv_cq *)ibcq;
    if (cq->count == cq->cap) {
        cq->overruns++;  /* a real CQ overrun is fatal to the QP; counted here */
        return;
    }
    cq->ring[(cq->head + cq->count) % cq->cap] = *wc;
    cq->count++;
}

static struct fv_qp *find_qp(uint32_t qpn)
{
    for (struct fv_qp *q = fv_qps; q; q = q->next)
        if (q->qp.qp_num == qpn)
            return q;
    return NULL;
}

static struct fv_mr *find_mr(uint32_t rkey, uint64_t iova, uint64_t len, int access)
{
    for (struct fv_mr *m = fv_mrs; m; m = m->next) {
        struct ibv_mr *mr = &m->vmr.ibv_mr;
        if (mr->rkey == rkey && iova >= m->iova && iova + len <= m->iova + mr->length &&
            (m->vmr.access & access) == access)
            return m;
    }
    return NULL;
}

static uint64_t sge_bytes(const struct fv_wr *w)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < w->num_sge; i++)
        n += w->sge[i].length;
    return n;
}

/* -- execution ------------------------------------------------------------- */

static void complete(struct ibv_cq *cq, struct fv_qp *qp, uint64_t wr_id, enum ibv_wc_status status,
                     enum ibv_wc_opcode opcode, uint32_t byte_len, uint32_t src_qp)
{
    struct ibv_wc wc = {
        .wr_id = wr_id,
        .status = status,
        .opcode = opcode,
        .vendor_err = status == IBV_WC_SUCCESS ? 0 : FV_VENDOR_ERR,
        .byte_len = byte_len,
        .qp_num = qp->qp.qp_num,
        .src_qp = src_qp,
        .slid = fv_cfg.lid,
    };
    cq_push(cq, &wc);
}

static enum ibv_wc_opcode wc_opcode(int wr_opcode)
{
    switch (wr_opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
        return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
        return IBV_WC_RDMA_READ;
    default:
        return IBV_WC_SEND;
    }
}

/* Every outstanding request of a QP in error completes with a flush error. */
static void flush_qp(struct fv_qp *qp)
{
    struct fv_wr *w;
    while ((w = queue_head(&qp->sq))) {
        complete(qp->qp.send_cq, qp, w->wr_id, IBV_WC_WR_FLUSH_ERR, wc_opcode(w->opcode), 0, qp->remote_qpn);
        queue_pop(&qp->sq);
    }
    while ((w = queue_head(&qp->rq))) {
        complete(qp->qp.recv_cq, qp, w->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0);
        queue_pop(&qp->rq);
    }
}

static void fail_qp(struct fv_qp *qp, const struct fv_wr *w, enum ibv_wc_status status)
{
    complete(qp->qp.send_cq, qp, w->wr_id, status, wc_opcode(w->opcode), 0, qp->remote_qpn);
    queue_pop(&qp->sq);
    qp->qp.state = IBV_QPS_ERR;
    flush_qp(qp);
}

/* Copy between a gather/scatter list and one flat buffer. */
static void copy_sges(struct ibv_sge *sge, uint32_t n, char *flat, int to_flat)
{
    for (uint32_t i = 0; i < n; i++) {
        void *p = (void *)(uintptr_t)sge[i].addr;
        if (to_flat)
            memcpy(flat, p, sge[i].length);
        else
            memcpy(p, flat, sge[i].length);
        flat += sge[i].length;
    }
}

/* Run the send-queue head of `qp`; returns 0 when it cannot run yet. */
static int execute_one(struct fv_qp *qp, uint64_t now)
{
    struct fv_wr *w = queue_head(&qp->sq);
    if (!w || w->due_ns > now)
        return 0;
    if (qp->qp.state == IBV_QPS_ERR) {
        flush_qp(qp);
        return 1;
    }
    uint64_t len = sge_bytes(w);
    if (fv_cfg.fail_every && ++fv_sends_executed % fv_cfg.fail_every == 0) {
        fail_qp(qp, w, (enum ibv_wc_status)fv_cfg.fail_status);
        return 1;
    }
    struct fv_qp *peer = find_qp(qp->remote_qpn);
    if (!peer || peer->qp.state < IBV_QPS_RTR || peer->qp.state == IBV_QPS_ERR) {
        fail_qp(qp, w, IBV_WC_RETRY_EXC_ERR);  /* nobody acknowledges: the retries run out */
        return 1;
    }
    int consumes_recv = w->opcode == IBV_WR_SEND || w->with_imm;
    struct fv_wr *r = consumes_recv ? queue_head(&peer->rq) : NULL;
    if (consumes_recv && !r) {
        fail_qp(qp, w, IBV_WC_RNR_RETRY_EXC_ERR);
        return 1;
    }
    char *flat = malloc(len ? len : 1);
    if (!flat) {
        fail_qp(qp, w, IBV_WC_GENERAL_ERR);
        return 1;
    }
    enum ibv_wc_status status = IBV_WC_SUCCESS;
    if (w->opcode == IBV_WR_SEND || w->opcode == IBV_WR_SEND_WITH_IMM) {
        if (len > sge_bytes(r)) {
            status = IBV_WC_REM_INV_REQ_ERR;
        } else {
            copy_sges(w->sge, w->num_sge, flat, 1);
            copy_sges(r->sge, r->num_sge, flat, 0);  /* scatter; the tail of the list stays untouched */
        }
    } else {
        int access = w->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
        struct fv_mr *m = find_mr(w->rkey, w->remote_addr, len, access);
        if (!m) {
            status = IBV_WC_REM_ACCESS_ERR;
        } else {
            char *remote = (char *)m->vmr.ibv_mr.addr + (w->remote_addr - m->iova);
            if (w->opcode == IBV_WR_RDMA_READ) {
                copy_sges(w->sge, w->num_sge, remote, 0);
            } else {
                copy_sges(w->sge, w->num_sge, flat, 1);
                memcpy(remote, flat, len);
            }
        }
    }
    free(flat);
    if (status != IBV_WC_SUCCESS) {
        fail_qp(qp, w, status);
        return 1;
    }
    if (r) {
        struct ibv_wc wc = {
            .wr_id = r->wr_id,
            .status = IBV_WC_SUCCESS,
            .opcode = w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV,
            .byte_len = (uint32_t)len,
            .qp_num = peer->qp.qp_num,
            .src_qp = qp->qp.qp_num,
            .wc_flags = w->with_imm ? IBV_WC_WITH_IMM : 0,
            .imm_data = w->imm_data,
            .slid = fv_cfg.lid,
        };
        cq_push(peer->qp.recv_cq, &wc);
        queue_pop(&peer->rq);
    }
    if (w->signaled || qp->sq_sig_all)
        complete(qp->qp.send_cq, qp, w->wr_id, IBV_WC_SUCCESS, wc_opcode(w->opcode), (uint32_t)len, peer->qp.qp_num);
    queue_pop(&qp->sq);
    return 1;
}

static void progress(void)
{
    uint64_t now = now_ns();
    for (struct fv_qp *q = fv_qps; q; q = q->next)
        while (execute_one(q, now))
            ;
}

/* -- data path: reached through ibv_context.ops ---------------------------- */

static int fv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    struct fv_qp *qp = (struct fv_qp *)ibqp;
    int rc = 0;
    pthread_mutex_lock(&fv_lock);
    uint64_t due = now_ns() + fv_cfg.delay_ns;
    for (; wr; wr = wr->next) {
        if (qp->qp.state != IBV_QPS_RTS && qp->qp.state != IBV_QPS_ERR) {
            rc = EINVAL;
        } else if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge) {
            rc = EINVAL;
        } else if (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM &&
                   wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
                   wr->opcode != IBV_WR_RDMA_READ) {
            rc = EINVAL;
        }
        struct fv_wr *w = rc ? NULL : queue_tail(&qp->sq);
        if (!rc && !w)
            rc = ENOMEM;
        if (rc) {
            *bad_wr = wr;
            break;
        }
        w->wr_id = wr->wr_id;
        w->due_ns = due;
        w->opcode = wr->opcode;
        w->signaled = !!(wr->send_flags & IBV_SEND_SIGNALED);
        w->with_imm = wr->opcode == IBV_WR_SEND_WITH_IMM || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
        w->imm_data = wr->imm_data;
        w->remote_addr = wr->wr.rdma.remote_addr;
        w->rkey = wr->wr.rdma.rkey;
        w->num_sge = (uint32_t)wr->num_sge;
        memcpy(w->sge, wr->sg_list, sizeof(struct ibv_sge) * w->num_sge);
        qp->sq.count++;
    }
    pthread_mutex_unlock(&fv_lock);
    return rc;
}

static int fv_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    struct fv_qp *qp = (struct fv_qp *)ibqp;
    int rc = 0;
    pthread_mutex_lock(&fv_lock);
    for (; wr; wr = wr->next) {
        if (qp->qp.state == IBV_QPS_RESET || wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_recv_sge)
            rc = EINVAL;
        struct fv_wr *w = rc ? NULL : queue_tail(&qp->rq);
        if (!rc && !w)
            rc = ENOMEM;
        if (rc) {
            *bad_wr = wr;
            break;
        }
        memset(w, 0, sizeof(*w));
        w->wr_id = wr->wr_id;
        w->num_sge = (uint32_t)wr->num_sge;
        memcpy(w->sge, wr->sg_list, sizeof(struct ibv_sge) * w->num_sge);
        qp->rq.count++;
        if (qp->qp.state == IBV_QPS_ERR)
            flush_qp(qp);
    }
    pthread_mutex_unlock(&fv_lock);
    return rc;
}

static int fv_poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc)
{
    struct fv_cq *cq = (struct fv_cq *)ibcq;
    int n = 0;
    pthread_mutex_lock(&fv_lock);
    progress();
    while (n < num_entries && cq->count) {
        wc[n++] = cq->ring[cq->head];
        cq->head = (cq->head + 1) % cq->cap;
        cq->count--;
    }
    pthread_mutex_unlock(&fv_lock);
    return n;
}

/* -- control path: reached through libibverbs' private ops ---------------- */

static int fv_query_device_ex(struct ibv_context *context, const struct ibv_query_device_ex_input *input,
                              struct ibv_device_attr_ex *attr, size_t attr_size)
{
    (void)context;
    (void)input;
    if (attr_size < sizeof(attr->orig_attr))
        return EINVAL;
    struct ibv_device_attr *a = &attr->orig_attr;
    memset(a, 0, sizeof(*a));
    strcpy(a->fw_ver, "44.0-fakeverbs");
    a->node_guid = htobe64(0x0002c90300fa0001ull);
    a->sys_image_guid = a->node_guid;
    a->max_mr_size = 1ull << 40;
    a->page_size_cap = 4096;
    a->max_qp = 1 << 16;
    a->max_qp_wr = FV_MAX_WR;
    a->max_sge = FV_MAX_SGE;
    a->max_cq = 1 << 16;
    a->max_cqe = FV_MAX_WR;
    a->max_mr = 1 << 16;
    a->max_pd = 1 << 16;
    a->max_qp_rd_atom = 16;
    a->max_qp_init_rd_atom = 16;
    a->phys_port_cnt = 1;
    return 0;
}

static int fv_query_port(struct ibv_context *context, uint8_t port, struct ibv_port_attr *attr)
{
    (void)context;
    if (port != 1)
        return EINVAL;
    memset(attr, 0, sizeof(*attr));
    attr->state = IBV_PORT_ACTIVE;
    attr->max_mtu = IBV_MTU_4096;
    attr->active_mtu = IBV_MTU_4096;
    attr->gid_tbl_len = 1;
    attr->max_msg_sz = 1u << 30;
    attr->pkey_tbl_len = 1;
    attr->lid = fv_cfg.lid;
    attr->sm_lid = 1;
    attr->active_width = 2;   /* 4x */
    attr->active_speed = 32;  /* EDR */
    attr->phys_state = 5;     /* LinkUp */
    attr->link_layer = IBV_LINK_LAYER_INFINIBAND;
    return 0;
}

static struct ibv_pd *fv_alloc_pd(struct ibv_context *context)
{
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    if (!pd) {
        errno = ENOMEM;
        return NULL;
    }
    pd->context = context;
    return pd;
}

static int fv_dealloc_pd(struct ibv_pd *pd)
{
    free(pd);
    return 0;
}

static struct ibv_cq *fv_create_cq(struct ibv_context *context, int cqe, struct ibv_comp_channel *channel,
                                   int comp_vector)
{
    (void)channel;
    (void)comp_vector;
    if (cqe < 1 || (uint32_t)cqe > FV_MAX_WR) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_cq *cq = calloc(1, sizeof(*cq));
    uint32_t cap = 16;
    while (cap < (uint32_t)cqe + 1)
        cap <<= 1;
    if (cq)
        cq->ring = calloc(cap, sizeof(*cq->ring));
    if (!cq || !cq->ring) {
        free(cq);
        errno = ENOMEM;
        return NULL;
    }
    cq->cap = cap;
    cq->cq.context = context;
    cq->cq.cqe = (int)cap - 1;
    return &cq->cq;
}

static int fv_destroy_cq(struct ibv_cq *ibcq)
{
    pthread_mutex_lock(&fv_lock);
    for (struct fv_qp *q = fv_qps; q; q = q->next) {
        if (q->qp.send_cq == ibcq || q->qp.recv_cq == ibcq) {
            pthread_mutex_unlock(&fv_lock);
            return EBUSY;
        }
    }
    pthread_mutex_unlock(&fv_lock);
    struct fv_cq *cq = (struct fv_cq *)ibcq;
    free(cq->ring);
    free(cq);
    return 0;
}

static int fv_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    (void)cq;
    (void)solicited_only;
    return 0;
}

static struct ibv_qp *new_qp(struct ibv_context *context, struct ibv_pd *pd, struct ibv_qp_init_attr_ex *attr)
{
    if (attr->qp_type != IBV_QPT_RC) {
        errno = EOPNOTSUPP;  /* the loopback fabric only knows reliable connections */
        return NULL;
    }
    struct ibv_qp_cap *cap = &attr->cap;
    if (!attr->send_cq || !attr->recv_cq || attr->srq || cap->max_send_wr > FV_MAX_WR ||
        cap->max_recv_wr > FV_MAX_WR || cap->max_send_sge > FV_MAX_SGE || cap->max_recv_sge > FV_MAX_SGE) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_qp *qp = calloc(1, sizeof(*qp));
    if (!qp || queue_init(&qp->sq, cap->max_send_wr) || queue_init(&qp->rq, cap->max_recv_wr)) {
        if (qp) {
            free(qp->sq.wr);
            free(qp);
        }
        errno = ENOMEM;
        return NULL;
    }
    qp->cap = *cap;
    qp->sq_sig_all = attr->sq_sig_all;
    qp->qp.context = context;
    qp->qp.qp_context = attr->qp_context;
    qp->qp.pd = pd;
    qp->qp.send_cq = attr->send_cq;
    qp->qp.recv_cq = attr->recv_cq;
    qp->qp.qp_type = attr->qp_type;
    qp->qp.state = IBV_QPS_RESET;
    pthread_mutex_init(&qp->qp.mutex, NULL);
    pthread_cond_init(&qp->qp.cond, NULL);
    pthread_mutex_lock(&fv_lock);
    qp->qp.qp_num = fv_next_qpn++ & 0xffffff;
    qp->qp.handle = qp->qp.qp_num;
    qp->next = fv_qps;
    fv_qps = qp;
    pthread_mutex_unlock(&fv_lock);
    return &qp->qp;
}

static struct ibv_qp *fv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    struct ibv_qp_init_attr_ex ex = {
        .qp_context = attr->qp_context,
        .send_cq = attr->send_cq,
        .recv_cq = attr->recv_cq,
        .srq = attr->srq,
        .cap = attr->cap,
        .qp_type = attr->qp_type,
        .sq_sig_all = attr->sq_sig_all,
        .comp_mask = IBV_QP_INIT_ATTR_PD,
        .pd = pd,
    };
    return new_qp(pd->context, pd, &ex);
}

static struct ibv_qp *fv_create_qp_ex(struct ibv_context *context, struct ibv_qp_init_attr_ex *attr)
{
    if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) {
        errno = EOPNOTSUPP;  /* no XRC, no ibv_wr_* send API */
        return NULL;
    }
    return new_qp(context, attr->pd, attr);
}

static int transition_allowed(enum ibv_qp_state from, enum ibv_qp_state to)
{
    if (to == IBV_QPS_RESET || to == IBV_QPS_ERR)
        return 1;
    switch (from) {
    case IBV_QPS_RESET:
        return to == IBV_QPS_INIT;
    case IBV_QPS_INIT:
        return to == IBV_QPS_INIT || to == IBV_QPS_RTR;
    case IBV_QPS_RTR:
        return to == IBV_QPS_RTS;
    case IBV_QPS_RTS:
        return to == IBV_QPS_RTS;
    default:
        return 0;
    }
}

static int fv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
    struct fv_qp *qp = (struct fv_qp *)ibqp;
    if (!(mask & IBV_QP_STATE))
        return 0;
    enum ibv_qp_state from = (mask & IBV_QP_CUR_STATE) ? attr->cur_qp_state : qp->qp.state;
    enum ibv_qp_state to = attr->qp_state;
    if (!transition_allowed(from, to))
        return EINVAL;
    /* The attributes the kernel insists on for RC (a subset: enough to catch a caller that forgot one). */
    if (to == IBV_QPS_INIT && from == IBV_QPS_RESET && !(mask & IBV_QP_PORT))
        return EINVAL;
    if (to == IBV_QPS_RTR && (mask & (IBV_QP_AV | IBV_QP_DEST_QPN)) != (IBV_QP_AV | IBV_QP_DEST_QPN))
        return EINVAL;
    if (to == IBV_QPS_RTS && !(mask & IBV_QP_SQ_PSN))
        return EINVAL;
    if ((mask & IBV_QP_PORT) && attr->port_num != 1)
        return EINVAL;
    pthread_mutex_lock(&fv_lock);
    if (mask & IBV_QP_DEST_QPN)
        qp->remote_qpn = attr->dest_qp_num;
    if (to == IBV_QPS_RESET) {
        qp->sq.head = qp->sq.count = 0;
        qp->rq.head = qp->rq.count = 0;
    } else if (to == IBV_QPS_ERR) {
        qp->qp.state = IBV_QPS_ERR;
        flush_qp(qp);
    }
    pthread_mutex_unlock(&fv_lock);
    return 0;  /* libibverbs stores attr->qp_state into qp->state */
}

static int fv_destroy_qp(struct ibv_qp *ibqp)
{
    struct fv_qp *qp = (struct fv_qp *)ibqp;
    pthread_mutex_lock(&fv_lock);
    for (struct fv_qp **p = &fv_qps; *p; p = &(*p)->next) {
        if (*p == qp) {
            *p = qp->next;
            break;
        }
    }
    pthread_mutex_unlock(&fv_lock);
    free(qp->sq.wr);
    free(qp->rq.wr);
    free(qp);
    return 0;
}

static struct ibv_mr *fv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access)
{
    if (!addr || !length) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_mr *m = calloc(1, sizeof(*m));
    if (!m) {
        errno = ENOMEM;
        return NULL;
    }
    m->iova = hca_va;
    m->vmr.access = access;
    m->vmr.ibv_mr.context = pd->context;
    m->vmr.ibv_mr.pd = pd;
    m->vmr.ibv_mr.addr = addr;
    m->vmr.ibv_mr.length = length;
    pthread_mutex_lock(&fv_lock);
    m->vmr.ibv_mr.lkey = m->vmr.ibv_mr.rkey = m->vmr.ibv_mr.handle = fv_next_key;
    fv_next_key += 0x100;
    m->next = fv_mrs;
    fv_mrs = m;
    pthread_mutex_unlock(&fv_lock);
    return &m->vmr.ibv_mr;
}

static int fv_dereg_mr(struct verbs_mr *vmr)
{
    struct fv_mr *m = (struct fv_mr *)vmr;
    pthread_mutex_lock(&fv_lock);
    for (struct fv_mr **p = &fv_mrs; *p; p = &(*p)->next) {
        if (*p == m) {
            *p = m->next;
            break;
        }
    }
    pthread_mutex_unlock(&fv_lock);
    free(m);
    return 0;
}

static void fv_free_context(struct ibv_context *ibctx)
{
    struct fv_context *ctx = (struct fv_context *)((char *)ibctx - offsetof(struct fv_context, vctx.context));
    verbs_uninit_context(&ctx->vctx);
    free(ctx);
}

static const struct verbs_context_ops fv_ops = {
    .slot = {
        [VOPS_alloc_pd] = (void *)fv_alloc_pd,
        [VOPS_create_cq] = (void *)fv_create_cq,
        [VOPS_create_qp] = (void *)fv_create_qp,
        [VOPS_create_qp_ex] = (void *)fv_create_qp_ex,
        [VOPS_dealloc_pd] = (void *)fv_dealloc_pd,
        [VOPS_dereg_mr] = (void *)fv_dereg_mr,
        [VOPS_destroy_cq] = (void *)fv_destroy_cq,
        [VOPS_destroy_qp] = (void *)fv_destroy_qp,
        [VOPS_free_context] = (void *)fv_free_context,
        [VOPS_modify_qp] = (void *)fv_modify_qp,
        [VOPS_poll_cq] = (void *)fv_poll_cq,
        [VOPS_post_recv] = (void *)fv_post_recv,
        [VOPS_post_send] = (void *)fv_post_send,
        [VOPS_query_device_ex] = (void *)fv_query_device_ex,
        [VOPS_query_port] = (void *)fv_query_port,
        [VOPS_reg_mr] = (void *)fv_reg_mr,
        [VOPS_req_notify_cq] = (void *)fv_req_notify_cq,
    },
};

/* -- device and registration ---------------------------------------------- */

static struct verbs_context *fv_alloc_context(struct ibv_device *ibdev, int cmd_fd, void *private_data)
{
    (void)private_data;
    struct fv_context *ctx = _verbs_init_and_alloc_context(
        ibdev, cmd_fd, sizeof(*ctx), (struct verbs_context *)offsetof(struct fv_context, vctx), 0);
    if (!ctx)
        return NULL;
    fv_cfg.delay_ns = env_u64("FAKEVERBS_DELAY_NS", 10000);
    fv_cfg.fail_every = env_u64("FAKEVERBS_FAIL_EVERY", 0);
    fv_cfg.fail_status = (int)env_u64("FAKEVERBS_FAIL_STATUS", IBV_WC_RETRY_EXC_ERR);
    fv_cfg.lid = (uint16_t)env_u64("FAKEVERBS_LID", 1);
    /* A blocking descriptor for ibv_get_async_event (no async events ever
     * come); its presence also keeps libibverbs from asking the kernel for one. */
    ctx->vctx.context.async_fd = eventfd(0, EFD_CLOEXEC);
    ctx->vctx.context.num_comp_vectors = 1;
    verbs_set_ops(&ctx->vctx, &fv_ops);
    return &ctx->vctx;
}

static struct verbs_device *fv_alloc_device(struct verbs_sysfs_dev *sysfs_dev)
{
    (void)sysfs_dev;
    return calloc(1, sizeof(struct verbs_device));
}

static void fv_uninit_device(struct verbs_device *dev)
{
    free(dev);
}

static const struct verbs_match_ent fv_match[] = {
    {.u.modalias = "rdma_device:Nfakeverbs*", .kind = VMATCH_MODALIAS},
    {.kind = VMATCH_SENTINEL},
};

static const struct verbs_device_ops fv_device_ops = {
    .name = "fakeverbs",
    .match_min_abi_version = 1,
    .match_max_abi_version = 1,
    .match_table = fv_match,
    .alloc_context = fv_alloc_context,
    .alloc_device = fv_alloc_device,
    .uninit_device = fv_uninit_device,
};

__attribute__((constructor)) static void fv_register(void)
{
    verbs_register_driver_34(&fv_device_ops);
}
