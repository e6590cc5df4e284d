/* HTTP/2 and gRPC streams counted in the kernel when the ring overflows (included by sockets.c).
 *
 * HTTP/2 cannot be shed per stream the way HTTP/1 requests are (sockets.c http_gate): HPACK's
 * dynamic table needs every header block, in order, so user space must see all of a
 * connection or none of it. So a connection whose preface the kernel saw (a server's first
 * read, a client's first write, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") has its frame headers
 * walked here at every data call (9 bytes each: length, type, flags, stream; the payload
 * skipped, carried across calls and iovecs; a frame header split across calls is put
 * together), and its streams kept in `h2_streams` (start, :status, grpc-status, :method) from
 * the request's HEADERS to the response's END_STREAM or a RST_STREAM. Its records go to the
 * ring as every connection's do (user space parses them, builds spans, counts the streams).
 *
 * When one of its records does not fit the ring (where loss happened before), or the agent is
 * more than the sampling backlog behind (where HTTP/1 requests are shed, before the ring or the
 * agent's queue overflows), the connection switches to H2_COUNTED, for good: none of its calls goes to the ring from then on, and
 * every stream that ends in a call not on the ring (that one, and all later ones) is counted
 * here in `h2_red`, like http_red counts shed HTTP/1 requests: process, end, gRPC or not,
 * method, :status, grpc-status, how it ended, duration bucket. Streams still open when a
 * counted connection closes are counted then (ended by the close, at their mean duration).
 * The switch is announced by a header-only record (EV_SOCK_COUNTED) at the connection's first
 * call where one fits: user space then drops the connection's HPACK state and its streams in
 * flight without counting them (the kernel counts their ends), so every stream is counted
 * once. A counted connection never goes back to records: its HPACK state is gone.
 *
 * What is read of a header block is what HPACK lets the kernel read without the dynamic
 * table, in the block's first H2_PEEK bytes (gathered across iovecs: gRPC's encoder gives a
 * literal's name an iovec of its own), its first H2_REPS representations: :status from the
 * static table (0x88-0x8e) or a literal (plain or Huffman digits), :method GET or POST from
 * the static table, grpc-status from a literal (its name plain or Huffman, its value plain or
 * Huffman digits). A value coded as a reference to the dynamic table (gRPC encoders send a
 * repeated grpc-status so) is unknown, and counted as such. A gRPC call is one whose response
 * had trailers or a grpc-status, or any call of a connection that had one.
 *
 * The work is split in tail-called programs, each verified on its own (the verifier walks every
 * step of a bounded loop, and one program doing all of it would pass its million
 * instructions): sock_capture hands a call that may be HTTP/2 to h2_capture (detection, the
 * record, the switch), which hands its bytes to h2_walk (frame headers; streams begun;
 * header-block starts and stream ends noted in the per-CPU scratch), then h2_blocks (reads the
 * noted blocks) and h2_ends (counts or forgets the noted ends), which goes back to h2_walk while
 * the call has frames left: up to H2_ROUNDS rounds of H2_STEPS steps, H2_BLOCKS blocks and
 * H2_ENDS ends each. What each loop carries from step to step lives in that scratch, not in
 * registers (see h2_forget).
 *
 * What the walk cannot follow turns it off for the connection (H2_OFF, counted in
 * h2_stats): a frame header that is no valid HTTP/2 frame, a call with more frames than the
 * rounds hold, response bytes before the preface that are no SETTINGS frame. The connection
 * then behaves as before: records to the ring, lost when it is full (a counted one stays off
 * the ring, its streams no longer counted: H2_LOST). */

#define H2_PROBE 1    /* internal: response bytes before the preface, walked as SETTINGS until it comes */
#define H2_WALK 2     /* internal: the preface was seen: frames walked, records to the ring */
#define H2_COUNTED 3  /* internal: a record did not fit: nothing to the ring, streams counted here */
#define H2_OFF 4      /* internal: not followed: as before */
#define H2_LOST 5     /* internal: counted, then the walk failed: nothing to the ring, nothing counted */

#define H2_PREFACE_LEN 24
#define H2_NO_FRAME 0xff   /* internal: a dir's type while it skips the preface */
#define H2_STEPS 64        /* internal: walk steps per round (a frame, an iovec begun) */
#define H2_BLOCKS 8        /* internal: header blocks noted per round */
#define H2_ENDS 32         /* internal: stream ends noted per round */
#define H2_ROUNDS 8        /* internal: rounds per call (tail calls: 3 each, of the 33 a program may make) */
#define H2_PEEK 128        /* internal: bytes of a header block read */
#define H2_WIN 512         /* internal: bytes of a chunk read at once (frame headers and block starts come from there) */
#define H2_REPS 6          /* internal: representations read per block */

/* Slots in sock_capture_prog (sockets.c). */
#define H2_PROG_CAPTURE 1
#define H2_PROG_WALK 2
#define H2_PROG_BLOCKS 3
#define H2_PROG_ENDS 4

#define H2F_DATA 0
#define H2F_HEADERS 1
#define H2F_PRIORITY 2
#define H2F_RST 3
#define H2F_SETTINGS 4
#define H2F_PUSH 5
#define H2F_PING 6
#define H2F_GOAWAY 7
#define H2F_WINDOW 8
#define H2F_CONTINUATION 9
#define H2_END_STREAM 0x1
#define H2_END_HEADERS 0x4
#define H2_PADDED 0x8
#define H2_PRIORITY_FLAG 0x20

/* How a counted stream ended (h2_red_key.end). */
#define H2_ENDED 1    /* the response's END_STREAM */
#define H2_RESET 2    /* RST_STREAM, either way */
#define H2_CLOSED 3   /* still open when the connection closed */

/* h2_stats slots (probes.py H2_STATS). */
#define H2S_SWITCHED 0      /* connections switched to counting: a record did not fit the ring */
#define H2S_DESYNC 1        /* walks given up: an invalid frame header */
#define H2S_STEPS 2         /* walks given up: a call with more frames than the rounds hold */
#define H2S_NOT_SETTINGS 3  /* walks not begun: response bytes before the preface were no SETTINGS */
#define H2S_TABLE_FULL 4    /* a stream not tracked: h2_streams full */
#define H2S_UNTRACKED 5     /* a counted end with no stream entry (evicted): not counted */
#define H2S_RED_FULL 6      /* a counted end not counted: h2_red full */
#define H2S_ANNOUNCE_LOST 7 /* a counted connection closed before its announcement fit */
#define H2S_BACKLOG 8       /* connections switched to counting: the agent too far behind */
#define H2S_MAX 9
BPF_PERCPU_ARRAY(h2_stats, u64, H2S_MAX);

/* One direction of a walked connection. */
struct h2_dir {
    u32 left;      /* payload bytes of the current frame still to come (0: a frame header is next) */
    u32 stream;    /* the current frame's stream */
    u32 cont;      /* a stream whose header block continues in CONTINUATION frames (0: none) */
    u8  type;      /* the current frame's type (H2_NO_FRAME: the preface) */
    u8  flags;
    u8  have;      /* bytes of a frame header split across chunks, in hdr */
    u8  skip;      /* bytes of the current HEADERS payload to skip before its block (pad length, priority) */
    u8  cont_end;  /* the header block continued ends its stream */
    u8  seen;      /* a frame was seen (each side's first is SETTINGS) */
    u8  pad[2];
    u8  hdr[32];   /* a frame header gathered across chunks (9 bytes; room for masked copies) */
};

struct h2_conn {
    u32 seq;        /* sk_state.seq of the connection it belongs to (an fd's next connection is another) */
    u8  mode;       /* H2_* */
    u8  announced;  /* the switch was announced on the ring */
    u8  grpc;       /* a call on it was gRPC */
    u8  probe_lost; /* H2_PROBE: a record did not fit (the preface then begins it counted) */
    struct h2_dir c2s;
    struct h2_dir s2c;
    u32 open;       /* streams open in h2_streams */
    u32 pad2;
    u64 start_sum;  /* their starts, summed (for the ones a close ends) */
};
BPF_TABLE("lru_hash", u64, struct h2_conn, h2_conns, H2_CONN_ENTRIES);

struct h2_skey {
    u64 conn;    /* fd_key */
    u32 seq;     /* the connection's sk_state.seq */
    u32 stream;
};

struct h2_stream {
    u64 start_ns;  /* server: the request HEADERS' read returned; client: their write began */
    u16 status;    /* :status, 0 unknown */
    u8  code;      /* grpc-status + 1, 0 unknown */
    u8  method;    /* HM_GET, HM_POST, 0 unknown */
    u8  headers;   /* response header blocks seen (a second one is trailers: gRPC) */
    u8  grpc;
    u8  pad[2];
};
BPF_TABLE("lru_hash", struct h2_skey, struct h2_stream, h2_streams, H2_STREAM_ENTRIES);

struct h2_red_key {
    u32 pid;
    u8  role;    /* SK_ROLE_* */
    u8  grpc;    /* 1: a gRPC call */
    u8  method;  /* HM_*, 0 unknown */
    u8  bucket;  /* index into HTTP_BOUNDS_NS (HTTP_BUCKETS: above the last) */
    u16 status;  /* :status, 0 unknown */
    u8  code;    /* grpc-status + 1, 0 unknown */
    u8  end;     /* H2_ENDED, H2_RESET, H2_CLOSED */
};
BPF_HASH(h2_red, struct h2_red_key, struct red_val, 4096);

/* Where a walk is in its call's bytes. */
struct h2_cursor {
    u64 base;   /* the current chunk's next byte */
    u64 clen;   /* its bytes left */
    u64 total;  /* the call's bytes in later chunks (iovecs) */
    u64 vec;    /* the iovecs (0: one buffer) */
    u64 vlen;
    u32 next;   /* the next iovec */
    u32 round;  /* rounds begun */
};

/* The call being walked. */
struct h2_call {
    u64 key;      /* fd_key */
    u64 now;      /* the call's exit (a stream's end) */
    u64 start;    /* a stream begun in it starts here: server now, client the call's entry */
    u32 pid;
    u32 seq;
    u8  role;
    u8  s2c;      /* the call moves response-side bytes */
    u8  counting; /* the call is not on the ring: streams ending in it are counted here */
    u8  pad;
};

/* A header block's first bytes, noted by h2_walk for h2_blocks. */
struct h2_note_block {
    u32 stream;
    u8  len;      /* bytes gathered in b */
    u8  ends;     /* H2_ENDED: the frame ended its stream (read, then counted or forgotten, in h2_blocks) */
    u8  pad[2];
    u8  b[H2_PEEK * 2];  /* room for masked copies */
};

/* A stream end, noted by h2_walk for h2_ends. */
struct h2_note_end {
    u32 stream;
    u32 how;      /* H2_ENDED, H2_RESET */
};

/* The per-CPU scratch of one call's programs (tail calls run on the calling CPU, one after the
 * other, not preempted): what they hand each other, and their loops' state. */
struct h2_scratch {
    u8  func;      /* the call's SF_* (sock_capture cleared it in the thread's sock_args) */
    u8  done;      /* the walk reached the call's end */
    u8  gather;    /* 1 + the block slot the current HEADERS frame's bytes go to (0: none) */
    u8  note;      /* 1 + the block slot of the current frame (0: none) */
    u8  send;      /* h2_capture: the call's record goes to the ring */
    u8  followed;  /* h2_capture: the connection has an h2_conn */
    u8  read_responses;  /* the call's response blocks are read (see h2_capture) */
    u8  shift;     /* an HTTP/2 server's call: the shift its streams are sampled at (SOCKF_H2_DECIDED) */
    u32 xflags;    /* h2_capture: the record's SOCKF_SERVING_SHED */
    u32 pad1;
    struct h2_cursor cur;
    struct h2_call call;
    u32 nblocks, nends;  /* noted this round */
    u32 bp;              /* where a block's next representation begins */
    u32 status_at;       /* its :status value's offset, length << 16, Huffman bit 24, found bit 25 */
    u32 grpc_at;         /* its grpc-status value's, alike */
    u8 pre[H2_PREFACE_LEN];
    struct h2_conn fresh;  /* a new connection's, before it goes in h2_conns */
    struct h2_stream begun;  /* a request's stream, before it goes in h2_streams */
    u64 win_addr;          /* the call's bytes last read, at this user address (win_len 0: none) */
    u32 win_len;
    u32 pad4;
    u8 win[H2_WIN + H2_PEEK];  /* room for masked reads past its end */
    struct h2_note_block blocks[H2_BLOCKS];
    struct h2_note_end ends[H2_ENDS];
};
BPF_PERCPU_ARRAY(h2_scratch, struct h2_scratch, 1);

static __always_inline struct h2_scratch *h2_buffers(void)
{
    u32 zero = 0;
    return h2_scratch.lookup(&zero);
}

/* At the top of each loop step: what the compiler knows of map memory from the step before (a
 * field it wrote, a value a branch implies) is forgotten, so that it is read again, an unknown
 * to the verifier, and the states of every path of the step before meet. */
static __always_inline void h2_forget(void)
{
    asm volatile("" ::: "memory");
}

static __always_inline void h2_stat(u32 slot)
{
    u64 *v = h2_stats.lookup(&slot);
    if (v)
        (*v)++;
}

static __always_inline u8 h2_bucket(u64 ns)
{
    u8 b = HTTP_BUCKETS;
#pragma unroll
    for (int i = HTTP_BUCKETS - 1; i >= 0; i--)
        if (ns <= HTTP_BOUND(i))  /* OTel buckets are (lower, upper] */
            b = i;
    return b;
}

/* ``n`` streams of key ``k`` (bucket filled here from their mean), lasting ``sum`` ns together. */
static __always_inline void h2_red_add(struct h2_red_key *k, u64 n, u64 sum, u64 min, u64 max)
{
    k->bucket = h2_bucket(n ? sum / n : 0);
    struct red_val *v = h2_red.lookup(k);
    if (!v) {
        struct red_val zero = {.min_ns = min, .max_ns = max};
        if (h2_red.update(k, &zero) != 0) {
            h2_stat(H2S_RED_FULL);
            return;
        }
        v = h2_red.lookup(k);
        if (!v)
            return;
    }
    __sync_fetch_and_add(&v->count, n);
    __sync_fetch_and_add(&v->sum_ns, sum);
    if (min < v->min_ns)
        v->min_ns = min;
    if (max > v->max_ns)
        v->max_ns = max;
}

static __always_inline struct h2_stream *h2_stream_of(struct h2_call *call, u32 stream, struct h2_skey *sk)
{
    sk->conn = call->key;
    sk->seq = call->seq;
    sk->stream = stream;
    return h2_streams.lookup(sk);
}

/* The connection's h2_conn, 0 when none or when it belongs to an earlier connection on the fd
 * number (then forgotten). */
static __always_inline struct h2_conn *h2_lookup(u64 key, u32 seq)
{
    struct h2_conn *c = h2_conns.lookup(&key);
    if (c && c->seq != seq) {
        h2_conns.delete(&key);
        c = 0;
    }
    return c;
}

/* Whether a server stream is kept at probability 2^-shift: a hash of the connection's sequence (its
 * accept's time) and the stream's id, so that user space, knowing both, decides alike
 * (sampling.py h2_keep): murmur3's finalizer. */
static __always_inline int h2_keep(u32 seq, u32 stream, u8 shift)
{
    u32 h = seq ^ (stream * 0x9e3779b1U);
    h ^= h >> 16;
    h *= 0x85ebca6bU;
    h ^= h >> 13;
    h *= 0xc2b2ae35U;
    h ^= h >> 16;
    return !(h & ((1U << (shift & 31)) - 1));
}

/* ---- the threads serving server streams --------------------------------------------------
 *
 * A thread that reads a server stream's request serves it, as http_gate's thread serves an HTTP/1
 * request: its HTTP/1 calls inherit the stream's fate, and its CUDA calls of a shed one are marked
 * (cuda.c EVF_SHED). HTTP/2 multiplexes: a thread may read several streams (in one read, or one
 * after the other) before it answers them. So a shed stream does not shed the thread's calls while
 * the last kept stream it read is still open (kept_key: a kept stream's calls are never lost;
 * a shed one's made meanwhile are kept as the kept one's, which user space's causality says too),
 * and a stream end it writes leaves it serving that kept one, if any, else nothing. */

/* Whether the kept stream the thread points to is still open: its connection the same one, still
 * walked (not closed, given up, nor counted: a counted connection's streams lost their spans), and
 * the stream in h2_streams. Forgotten when not: one check per kept stream, not per read. */
static __always_inline int h2_kept_open(struct sock_args *t)
{
    u64 key = t->kept_key;
    if (!key)
        return 0;
    struct h2_conn *c = h2_conns.lookup(&key);
    struct h2_skey sk = {.conn = key, .seq = t->kept_seq, .stream = t->kept_stream};
    if (c && c->seq == t->kept_seq && c->mode == H2_WALK && h2_streams.lookup(&sk))
        return 1;
    t->kept_key = 0;
    return 0;
}

/* A server stream's request read on this thread, decided (h2_keep; shed when the call is counted:
 * it has no span): the thread serves it. */
static __always_inline void h2_serve(struct h2_call *call, u32 stream, u8 shift)
{
    struct sock_args *t = thread_args(0);
    if (!t)
        return;
    if (!call->counting && h2_keep(call->seq, stream, shift)) {
        t->kept_key = call->key;
        t->kept_seq = call->seq;
        t->kept_stream = stream;
        t->kept_shift = shift;
    } else if (!h2_kept_open(t)) {
        t->serving = REQ_SHED;
        t->serving_shift = shift;
        return;
    }
    t->serving = REQ_KEPT;
    t->serving_shift = t->kept_shift;
}

/* A server stream of connection ``key`` (``seq``) ended on this thread (``stream``; 0: all of them,
 * the connection closed or its walk given up); ``done``: the thread is done with what it served (it
 * wrote the stream's end, or closed). Then it serves the kept stream still open, if any, else nothing
 * (as after an HTTP/1 response); a stream the client reset ends only the thread's kept one. */
static __always_inline void h2_unserve(u64 key, u32 seq, u32 stream, int done)
{
    struct sock_args *t = thread_args(0);
    if (!t)
        return;
    if (t->kept_key == key && t->kept_seq == seq && (!stream || t->kept_stream == stream)) {
        t->kept_key = 0;
        done = 1;
    }
    if (!done)
        return;
    t->serving = t->kept_key ? REQ_KEPT : 0;
    t->serving_shift = t->kept_shift;
}

/* ---- h2_walk: frame headers ---------------------------------------------------------- */

/* A frame header (on the call's direction ``d``). False: not an HTTP/2 frame. */
static __always_inline int h2_frame(struct h2_conn *c, struct h2_scratch *x, struct h2_dir *d, const u8 *h)
{
    struct h2_call *call = &x->call;
    u32 len = ((u32)h[0] << 16) | ((u32)h[1] << 8) | h[2];
    u8 type = h[3], flags = h[4];
    u32 stream = (((u32)h[5] & 0x7f) << 24) | ((u32)h[6] << 16) | ((u32)h[7] << 8) | h[8];
    /* what HTTP/2 requires of each frame type's stream and length (as protocols/http2.py checks) */
    if (type <= H2F_CONTINUATION) {
        int on_stream = type == H2F_DATA || type == H2F_HEADERS || type == H2F_PRIORITY || type == H2F_RST ||
                        type == H2F_PUSH || type == H2F_CONTINUATION;
        if ((on_stream && !stream) || ((type == H2F_SETTINGS || type == H2F_PING || type == H2F_GOAWAY) && stream))
            return 0;
        if ((type == H2F_PRIORITY && len != 5) || (type == H2F_RST && len != 4) || (type == H2F_PING && len != 8) ||
            (type == H2F_WINDOW && len != 4) || (type == H2F_SETTINGS && len % 6))
            return 0;
    }
    if (!d->seen) {
        if (type != H2F_SETTINGS || (flags & 0x1))
            return 0;  /* each side's first frame is SETTINGS (not an ACK): anything else is no HTTP/2 */
        d->seen = 1;
    }
    if (c->mode == H2_PROBE && type != H2F_SETTINGS && type != H2F_WINDOW && type != H2F_PING)
        return 0;
    d->left = len;
    d->type = type;
    d->flags = flags;
    d->stream = stream;
    d->skip = 0;
    x->gather = 0;
    x->note = 0;
    if (type != H2F_HEADERS)
        return 1;
    d->skip = ((flags & H2_PADDED) ? 1 : 0) + ((flags & H2_PRIORITY_FLAG) ? 5 : 0);
    if (!(flags & H2_END_HEADERS)) {
        d->cont = stream;
        d->cont_end = flags & H2_END_STREAM;
    }
    u32 slot = x->nblocks;
    if (call->s2c && !x->read_responses)
        return 1;  /* a response's block, while nothing is near a switch: not read (see h2_capture) */
    if (slot < H2_BLOCKS) {  /* its block's first bytes, noted as they pass (h2_blocks reads them) */
        x->nblocks = slot + 1;
        x->blocks[slot].stream = stream;
        x->blocks[slot].len = 0;
        x->blocks[slot].ends = 0;
        x->gather = slot + 1;
        x->note = slot + 1;
    }
    return 1;
}

/* A stream end, noted for h2_ends (the walk stops before the notes are full). */
static __always_inline void h2_note_end(struct h2_scratch *x, u32 stream, u32 how)
{
    u32 k = x->nends;
    if (k < H2_ENDS) {
        x->ends[k].stream = stream;
        x->ends[k].how = how;
        x->nends = k + 1;
    }
}

/* The current frame of ``d`` has ended (its last payload byte moved in this call). */
static __always_inline void h2_frame_done(struct h2_scratch *x, struct h2_dir *d)
{
    u8 type = d->type, flags = d->flags;
    x->gather = 0;
    if (type != H2F_HEADERS)
        x->note = 0;
    if (type == H2F_RST) {
        h2_note_end(x, d->stream, H2_RESET);
        return;
    }
    if (!x->call.s2c)
        return;  /* a request's END_STREAM ends only its half */
    if (type == H2F_CONTINUATION) {
        if ((flags & H2_END_HEADERS) && d->cont == d->stream) {
            d->cont = 0;
            if (d->cont_end)
                h2_note_end(x, d->stream, H2_ENDED);
        }
        return;
    }
    if ((flags & H2_END_STREAM) && type == H2F_HEADERS && (flags & H2_END_HEADERS) && x->note) {
        x->blocks[(x->note - 1) & (H2_BLOCKS - 1)].ends = H2_ENDED;  /* ended where its block is read */
        return;
    }
    if ((flags & H2_END_STREAM) && (type == H2F_DATA || (type == H2F_HEADERS && (flags & H2_END_HEADERS))))
        h2_note_end(x, d->stream, H2_ENDED);
}

/* The walk gives up on this connection (counted): as before from now on, but a counted one
 * stays off the ring (user space has dropped it), its streams no longer counted. */
static __always_inline void h2_give_up(struct h2_conn *c, struct h2_call *call, u32 why)
{
    c->mode = c->mode == H2_COUNTED ? H2_LOST : H2_OFF;
    h2_stat(why);
    if (call->role == SK_ROLE_SERVER)
        h2_unserve(call->key, call->seq, 0, 1);  /* its streams are the agent's to draw from now on */
}

/* The offset in x->win of user address ``addr``, with ``need`` bytes after it (at most 32), the
 * window read again from ``addr`` (up to H2_WIN bytes, never past the chunk's ``clen``) when it
 * does not hold them; -1 if it cannot be read. One read serves every small frame of a window,
 * not one read per frame header. */
static __always_inline int h2_window(struct h2_scratch *x, u64 addr, u64 clen, u32 need)
{
    u64 start = x->win_addr, len = x->win_len;
    if (addr >= start && addr + need <= start + len)
        return (addr - start) & (H2_WIN - 1);
    u32 n = clamp_payload(clen, H2_WIN);
    x->win_len = 0;
    if (read_user(x->win, n, (void *)addr) != 0)
        return -1;
    x->win_addr = addr;
    x->win_len = n;
    return 0;
}

/* Frame headers of the call's bytes (x->cur) from where the last call left the direction, for
 * up to H2_STEPS steps, or until the notes are full; then h2_blocks. */
int h2_walk(void *ctx)
{
    struct h2_scratch *x = h2_buffers();
    if (!x)
        return 0;
    struct h2_call *call = &x->call;
    struct h2_conn *c = h2_conns.lookup(&call->key);
    if (!c)
        return 0;
    struct h2_dir *d = call->s2c ? &c->s2c : &c->c2s;
    struct h2_cursor *cur = &x->cur;
    x->nblocks = 0;
    x->nends = 0;
    x->done = 0;
    x->gather = 0;  /* a block the last round was gathering was read as it was */
    int i;
    for (i = 0; i < H2_STEPS; i++) {
        h2_forget();
        if (x->nends >= H2_ENDS || x->nblocks >= H2_BLOCKS)
            break;  /* the notes are full: read, and back here for the rest */
        u64 base = cur->base, clen = cur->clen;
        if (!clen) {
            u64 left = cur->total;
            u32 next = cur->next;
            if (!left || next >= cur->vlen || next >= SOCK_MAX_IOV) {
                x->done = 1;
                break;
            }
            struct otel_iovec iov = {};
            if (read_user(&iov, sizeof(iov), (void *)(cur->vec + next * sizeof(iov))) != 0) {
                h2_give_up(c, call, H2S_DESYNC);
                return 0;
            }
            cur->next = next + 1;
            cur->base = iov.base;
            clen = iov.len < left ? iov.len : left;
            cur->clen = clen;
            cur->total = left - clen;
            x->win_len = 0;
            continue;
        }
        if (!d->left) {
            /* a frame header; one split across chunks is gathered in d->hdr */
            u8 *h = x->pre;
            if (d->have || clen < 9) {
                u32 have = d->have & 15;
                u32 n = 9 - have < clen ? 9 - have : clen;
                if (read_user(&d->hdr[have], n & 15, (void *)base) != 0) {
                    h2_give_up(c, call, H2S_DESYNC);
                    return 0;
                }
                cur->base = base + n;
                cur->clen = clen - n;
                if (have + n < 9) {
                    d->have = have + n;
                    continue;
                }
                h = d->hdr;
                d->have = 0;
            } else {
                int off = h2_window(x, base, clen, 9);
                if (off < 0) {
                    h2_give_up(c, call, H2S_DESYNC);
                    return 0;
                }
                h = &x->win[off & (H2_WIN - 1)];
                cur->base = base + 9;
                cur->clen = clen - 9;
            }
            if (!h2_frame(c, x, d, h)) {
                h2_give_up(c, call, H2S_DESYNC);
                return 0;
            }
            if (!d->left) {
                h2_frame_done(x, d);
                continue;
            }
            base = cur->base;
            clen = cur->clen;
            if (!clen)
                continue;
        }
        /* the current frame's payload, as far as this chunk goes */
        u64 n = d->left < clen ? d->left : clen;
        cur->base = base + n;
        cur->clen = clen - n;
        d->left -= n;
        u32 skip = d->skip < n ? d->skip : n;  /* a pad length, a priority: skipped */
        d->skip -= skip;
        u32 g = x->gather;
        if (g && n > skip) {
            struct h2_note_block *blk = &x->blocks[(g - 1) & (H2_BLOCKS - 1)];
            u32 got = blk->len & (H2_PEEK - 1);
            u32 room = H2_PEEK - 1 - got;  /* at most H2_PEEK - 1 bytes gathered */
            u32 more = n - skip < room ? n - skip : room;
            int off = h2_window(x, base + skip, clen - skip, more);
            if (off >= 0) {
                __builtin_memcpy(&blk->b[got], &x->win[off & (H2_WIN - 1)], H2_PEEK);  /* the first ``more`` count */
                blk->len = got + (more & (H2_PEEK - 1));
            }
            if (more >= room)
                x->gather = 0;
        }
        if (!d->left && d->type != H2_NO_FRAME)
            h2_frame_done(x, d);
    }
    if (x->nblocks)
        sock_capture_prog.call(ctx, H2_PROG_BLOCKS);
    else
        sock_capture_prog.call(ctx, H2_PROG_ENDS);
    return 0;
}

/* ---- stream ends: counted, or forgotten ------------------------------------------------ */

/* Stream ``s`` (``sk``) ended in this call (``how``: H2_ENDED, H2_RESET): counted if the call is not
 * on the ring, forgotten either way. */
static __always_inline void h2_ended(struct h2_conn *c, struct h2_call *call, struct h2_stream *s, struct h2_skey *sk,
                                     u8 how)
{
    u64 start = s->start_ns;
    if (s->grpc)
        c->grpc = 1;
    if (call->counting) {
        u64 ns = call->now > start ? call->now - start : 0;
        struct h2_red_key k = {.pid = call->pid, .role = call->role, .grpc = s->grpc | c->grpc,
                               .method = s->method, .status = s->status, .code = s->code, .end = how};
        h2_red_add(&k, 1, ns, ns, ns);
    }
    h2_streams.delete(sk);
    if (c->open)
        c->open--;
    c->start_sum -= start;
    if (call->role == SK_ROLE_SERVER)
        h2_unserve(call->key, call->seq, sk->stream, call->s2c);  /* its end written: done with it */
}

/* A stream ended in this call, by its id. */
static __always_inline void h2_end(struct h2_conn *c, struct h2_call *call, u32 stream, u8 how)
{
    struct h2_skey sk = {};
    struct h2_stream *s = h2_stream_of(call, stream, &sk);
    if (!s) {
        if (call->counting)
            h2_stat(H2S_UNTRACKED);  /* evicted (or a pushed stream, or one already ended: not counted either way) */
        return;
    }
    h2_ended(c, call, s, &sk, how);
}

/* ---- h2_blocks: what HPACK says without its dynamic table ----------------------------- */

/* An HPACK integer with a ``mask`` prefix at b[*p] (its first byte), of at most 3 bytes; *p past
 * it. 0xffffffff when longer (not read further). */
static __always_inline u32 hp_int(const u8 *b, u32 *p, u8 mask)
{
    u32 v = b[*p & (H2_PEEK - 1)] & mask;
    *p += 1;
    if (v < mask)
        return v;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        u8 x = b[*p & (H2_PEEK - 1)];
        *p += 1;
        v += (u32)(x & 0x7f) << (7 * i);
        if (!(x & 0x80))
            return v;
    }
    return 0xffffffff;
}

/* Decimal digits of an HPACK string value at b[p], ``len`` bytes, plain or Huffman; -1 if it is
 * not 1 to 3 digits. */
static __always_inline int hp_digits(const u8 *b, u32 p, u32 len, int huffman)
{
    if (len < 1 || len > 3)
        return -1;
    u8 x0 = b[p & (H2_PEEK - 1)], x1 = b[(p + 1) & (H2_PEEK - 1)], x2 = b[(p + 2) & (H2_PEEK - 1)];
    if (!huffman) {
        if (!digit(x0) || (len > 1 && !digit(x1)) || (len > 2 && !digit(x2)))
            return -1;
        int v = x0 - '0';
        if (len > 1)
            v = v * 10 + (x1 - '0');
        if (len > 2)
            v = v * 10 + (x2 - '0');
        return v;
    }
    /* Huffman: '0'-'2' are 00000-00010, '3'-'9' 011001-011111; the rest of the last byte is
     * EOS padding (ones) */
    u32 bits = ((u32)x0 << 16) | (len > 1 ? (u32)x1 << 8 : 0) | (len > 2 ? x2 : 0);
    u32 nbits = len * 8;
    u32 used = 0;
    int v = 0, n = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (nbits - used < 5)
            break;
        u32 five = (bits >> (19 - used)) & 0x1f;
        if (five <= 2) {
            v = v * 10 + five;
            used += 5;
            n++;
            continue;
        }
        if (nbits - used < 6)
            break;
        u32 six = (bits >> (18 - used)) & 0x3f;
        if (six < 0x19 || six > 0x1f)
            break;
        v = v * 10 + (six - 0x19 + 3);
        used += 6;
        n++;
    }
    u32 rest = nbits - used;
    if (!n || rest >= 8 || ((bits >> (24 - nbits)) & ((1U << rest) - 1)) != (1U << rest) - 1)
        return -1;
    return v;
}

/* Byte ``i`` of a string at b[p] (b: a block's gathered bytes). */
#define H2_AT(i) b[(p + (i)) & (H2_PEEK - 1)]

/* Names a literal's name string may be (hp_name). */
#define HP_GRPC_STATUS 1
#define HP_CONTENT_TYPE 2

/* Which of the names read here the string at b[p], ``len`` bytes, is (plain or Huffman); 0: another. */
static __always_inline int hp_name(const u8 *b, u32 p, u32 len, int huffman)
{
    if (!huffman && len == 11 && H2_AT(0) == 'g' && H2_AT(1) == 'r' && H2_AT(2) == 'p' && H2_AT(3) == 'c' &&
        H2_AT(4) == '-' && H2_AT(5) == 's' && H2_AT(6) == 't' && H2_AT(7) == 'a' && H2_AT(8) == 't' &&
        H2_AT(9) == 'u' && H2_AT(10) == 's')
        return HP_GRPC_STATUS;
    if (huffman && len == 8 && H2_AT(0) == 0x9a && H2_AT(1) == 0xca && H2_AT(2) == 0xc8 && H2_AT(3) == 0xb2 &&
        H2_AT(4) == 0x12 && H2_AT(5) == 0x34 && H2_AT(6) == 0xda && H2_AT(7) == 0x8f)
        return HP_GRPC_STATUS;
    if (!huffman && len == 12 && H2_AT(0) == 'c' && H2_AT(1) == 'o' && H2_AT(2) == 'n' && H2_AT(3) == 't' &&
        H2_AT(4) == 'e' && H2_AT(5) == 'n' && H2_AT(6) == 't' && H2_AT(7) == '-' && H2_AT(8) == 't' &&
        H2_AT(9) == 'y' && H2_AT(10) == 'p' && H2_AT(11) == 'e')
        return HP_CONTENT_TYPE;
    if (huffman && len == 9 && H2_AT(0) == 0x21 && H2_AT(1) == 0xea && H2_AT(2) == 0x49 && H2_AT(3) == 0x6a &&
        H2_AT(4) == 0x4a && H2_AT(5) == 0xc9 && H2_AT(6) == 0xf5 && H2_AT(7) == 0x59 && H2_AT(8) == 0x7f)
        return HP_CONTENT_TYPE;
    return 0;
}

/* Whether the value at b[p], ``len`` bytes, begins with application/grpc (plain, or its 11-byte
 * Huffman code: 88 bits, so a prefix of any longer value's). */
static __always_inline int hp_grpc_type(const u8 *b, u32 p, u32 len, int huffman)
{
    if (!huffman)
        return len >= 16 && H2_AT(0) == 'a' && H2_AT(1) == 'p' && H2_AT(2) == 'p' && H2_AT(3) == 'l' &&
               H2_AT(4) == 'i' && H2_AT(5) == 'c' && H2_AT(6) == 'a' && H2_AT(7) == 't' && H2_AT(8) == 'i' &&
               H2_AT(9) == 'o' && H2_AT(10) == 'n' && H2_AT(11) == '/' && H2_AT(12) == 'g' && H2_AT(13) == 'r' &&
               H2_AT(14) == 'p' && H2_AT(15) == 'c';
    return len >= 11 && H2_AT(0) == 0x1d && H2_AT(1) == 0x75 && H2_AT(2) == 0xd0 && H2_AT(3) == 0x62 &&
           H2_AT(4) == 0x0d && H2_AT(5) == 0x26 && H2_AT(6) == 0x3d && H2_AT(7) == 0x4c && H2_AT(8) == 0x4d &&
           H2_AT(9) == 0x65 && H2_AT(10) == 0x64;
}

/* One representation of block ``b`` (``m`` bytes gathered) at x->bp, read into stream ``s``;
 * x->bp past it. False: nothing more can be read of the block. */
static __always_inline int h2_rep(struct h2_scratch *x, const u8 *b, u32 m, struct h2_stream *s, int s2c)
{
    u32 p = x->bp;
    if (p >= m)
        return 0;
    u8 c = b[p & (H2_PEEK - 1)];
    if (c & 0x80) {
        u32 idx = hp_int(b, &p, 0x7f);
        x->bp = p;
        if (p > m)
            return 0;
        if (s2c && idx >= 8 && idx <= 14 && !s->status)  /* the static table's :status */
            s->status = idx == 8 ? 200 : idx == 9 ? 204 : idx == 10 ? 206 : idx == 11 ? 304 : idx == 12 ? 400
                      : idx == 13 ? 404 : 500;
        else if (!s2c && (idx == 2 || idx == 3))  /* :method GET, POST */
            s->method = idx == 2 ? HM_GET : HM_POST;
        return 1;
    }
    if ((c & 0xe0) == 0x20) {  /* a dynamic table size update */
        hp_int(b, &p, 0x1f);
        x->bp = p;
        return p <= m;
    }
    u32 name = hp_int(b, &p, (c & 0x40) ? 0x3f : 0x0f);
    if (p >= m)
        return 0;
    int which = name == 31 ? HP_CONTENT_TYPE : 0;  /* the static table's content-type */
    if (name == 0) {
        u8 h = b[p & (H2_PEEK - 1)] & 0x80;
        u32 len = hp_int(b, &p, 0x7f);
        if (len > H2_PEEK || p + len >= m)
            return 0;
        which = hp_name(b, p, len, h);
        p += len;
    }
    u8 h = b[p & (H2_PEEK - 1)] & 0x80;
    u32 len = hp_int(b, &p, 0x7f);
    if (len > H2_PEEK || p + len > m)
        return 0;
    x->bp = p + len;
    /* a value's digits are read once the loop is over (h2_values): here only where they are */
    if (s2c && name == 8 && !s->status)
        x->status_at = (p & 0xffff) | (len << 16) | (h ? 1U << 24 : 0) | (1U << 25);
    else if (s2c && which == HP_GRPC_STATUS)
        x->grpc_at = (p & 0xffff) | (len << 16) | (h ? 1U << 24 : 0) | (1U << 25);
    else if (which == HP_CONTENT_TYPE && hp_grpc_type(b, p, len, h))
        s->grpc = 1;
    return 1;
}

/* The digits of the :status and grpc-status values h2_rep found in block ``b``, into ``s``. */
static __always_inline void h2_values(struct h2_scratch *x, const u8 *b, struct h2_stream *s)
{
    u32 at = x->status_at;
    if (at & (1U << 25)) {
        int v = hp_digits(b, at & 0xffff, (at >> 16) & 0xff, at & (1U << 24));
        if (v >= 100 && v <= 999)
            s->status = v;
    }
    h2_forget();
    at = x->grpc_at;
    if (at & (1U << 25)) {
        int v = hp_digits(b, at & 0xffff, (at >> 16) & 0xff, at & (1U << 24));
        s->grpc = 1;
        if (v >= 0 && v <= 16)
            s->code = v + 1;
    }
}

/* The header blocks h2_walk noted this round: :status, grpc-status, :method into their streams;
 * then h2_ends. */
int h2_blocks(void *ctx)
{
    struct h2_scratch *x = h2_buffers();
    if (!x)
        return 0;
    struct h2_call *call = &x->call;
    struct h2_conn *c = h2_conns.lookup(&call->key);
    if (!c)
        return 0;
    int s2c = call->s2c;
    for (u32 k = 0; k < H2_BLOCKS; k++) {
        h2_forget();
        if (k >= x->nblocks)
            break;
        struct h2_note_block *blk = &x->blocks[k & (H2_BLOCKS - 1)];
        u32 m = blk->len & (H2_PEEK - 1);
        struct h2_skey sk = {.conn = call->key, .seq = call->seq, .stream = blk->stream};
        /* a request's block: its stream begins (with its :method), unless it is a client's
         * trailers; a response's: its stream is looked up */
        struct h2_stream *s = &x->begun;
        if (s2c) {
            s = h2_streams.lookup(&sk);
            if (!s) {
                if (blk->ends && call->counting)
                    h2_stat(H2S_UNTRACKED);
                continue;
            }
            if (s->headers)
                s->grpc = 1;  /* a second response block: trailers */
            s->headers++;
        } else {
            __builtin_memset(s, 0, sizeof(*s));
            s->start_ns = call->start;
        }
        x->bp = 0;
        x->status_at = 0;
        x->grpc_at = 0;
        for (int r = 0; r < H2_REPS; r++) {
            h2_forget();
            if (!h2_rep(x, blk->b, m, s, s2c))
                break;
        }
        h2_forget();
        h2_values(x, blk->b, s);
        if (s2c) {
            if (blk->ends)
                h2_ended(c, call, s, &sk, H2_ENDED);
            continue;
        }
        s = &x->begun;
        if (s->grpc)
            c->grpc = 1;  /* content-type application/grpc: every call of the connection is gRPC */
        int err = h2_streams.insert(&sk, s);
        if (!err) {
            c->open++;
            c->start_sum += call->start;
        } else if (err != -17 /* EEXIST: trailers */) {
            h2_stat(H2S_TABLE_FULL);
        }
        if (err != -17 && call->role == SK_ROLE_SERVER)
            h2_serve(call, blk->stream, x->shift);  /* a request read: its thread serves it */
    }
    sock_capture_prog.call(ctx, H2_PROG_ENDS);
    return 0;
}

/* The stream ends h2_walk noted this round; back to h2_walk while the call has frames left. */
int h2_ends(void *ctx)
{
    struct h2_scratch *x = h2_buffers();
    if (!x)
        return 0;
    struct h2_conn *c = h2_conns.lookup(&x->call.key);
    if (!c)
        return 0;
    for (u32 k = 0; k < H2_ENDS; k++) {
        h2_forget();
        if (k >= x->nends)
            break;
        h2_end(c, &x->call, x->ends[k & (H2_ENDS - 1)].stream, x->ends[k & (H2_ENDS - 1)].how);
    }
    if (x->done || c->mode == H2_OFF || c->mode == H2_LOST)
        return 0;
    x->cur.round++;
    if (x->cur.round >= H2_ROUNDS) {
        h2_give_up(c, &x->call, H2S_STEPS);
        return 0;
    }
    sock_capture_prog.call(ctx, H2_PROG_WALK);
    return 0;
}

/* ---- h2_capture: the call ------------------------------------------------------------- */

/* The switch's announcement: a header-only record, when it fits. */
static __always_inline void h2_announce(struct h2_conn *c, u64 id, s32 fd, u8 func)
{
    if (c->announced)
        return;
    struct sock_rec *r = sockdata.ringbuf_reserve(SOCK_HEADER_BYTES);
    if (!r)
        return;  /* not counted as lost: the next call tries again */
    fill_header(r, id, bpf_ktime_get_ns(), fd, 0, EV_SOCK_COUNTED, func);
    sockdata.ringbuf_submit(r, sock_wake(SOCK_HEADER_BYTES));
    c->announced = 1;
}

/* For sock_capture: a call of a connection that may be HTTP/2 (http_gate said GATE_OTHER) goes to
 * h2_capture, which sends its record itself (or not: a counted connection's). Back here only if
 * that tail call failed. */
static __always_inline void h2_handoff(void *ctx, u8 func)
{
    struct h2_scratch *x = h2_buffers();
    if (!x)
        return;
    x->func = func;  /* the thread's sock_args has the rest (sock_capture cleared its func) */
    sock_capture_prog.call(ctx, H2_PROG_CAPTURE);
}

/* The preface (request side) or a SETTINGS frame (response side, first) in a connection's first
 * bytes: its h2_conn, created; 0 when it is no HTTP/2 the kernel follows (then said in st). */
static __always_inline struct h2_conn *h2_begin_conn(struct h2_scratch *x, struct sock_args *a, struct sk_state *st,
                                                     struct h2_conn *c, u64 key, int s2c)
{
    u8 *h = x->pre;
    __builtin_memset(h, 0, H2_PREFACE_LEN);
    u64 n = head_bytes(a, a->ret, h, H2_PREFACE_LEN);
    if (!s2c) {
        /* the request side's first bytes: the preface begins the walk, anything else ends it
         * ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" as three little-endian words) */
        u64 w0 = 0, w1 = 0, w2 = 0;
        __builtin_memcpy(&w0, h, 8);
        __builtin_memcpy(&w1, h + 8, 8);
        __builtin_memcpy(&w2, h + 16, 8);
        if (n != H2_PREFACE_LEN || w0 != 0x5448202a20495250ULL || w1 != 0x0a0d302e322f5054ULL ||
            w2 != 0x0a0d0a0d4d530a0dULL || (c && c->mode == H2_OFF)) {
            if (c)
                h2_conns.delete(&key);
            st->h2 = SK_H2_NO;
            return 0;
        }
        if (!c) {
            struct h2_conn *fresh = &x->fresh;
            __builtin_memset(fresh, 0, sizeof(*fresh));
            fresh->seq = st->seq;
            h2_conns.update(&key, fresh);
            c = h2_conns.lookup(&key);
            if (!c) {
                st->h2 = SK_H2_NO;
                return 0;
            }
        }
        c->mode = H2_WALK;
        if (c->probe_lost || st->h2 == SK_H2_UNSEEN) {
            /* user space lost the server's first bytes, or the connection's start: counted from here */
            c->mode = H2_COUNTED;
            h2_stat(H2S_SWITCHED);
        }
        c->c2s.left = H2_PREFACE_LEN;
        c->c2s.type = H2_NO_FRAME;
        st->h2 = SK_H2_YES;
        return c;
    }
    /* response-side bytes first: a server's SETTINGS written before it read the preface */
    if (c)
        return c->mode == H2_OFF ? 0 : c;
    struct h2_conn *fresh = &x->fresh;
    __builtin_memset(fresh, 0, sizeof(*fresh));
    fresh->seq = st->seq;
    fresh->mode = H2_PROBE;
    if (n < 9 || h[3] != H2F_SETTINGS || h[5] || h[6] || h[7] || h[8]) {
        fresh->mode = H2_OFF;
        h2_stat(H2S_NOT_SETTINGS);
    }
    h2_conns.update(&key, fresh);
    return fresh->mode == H2_OFF ? 0 : h2_conns.lookup(&key);
}

/* A socket older than the agent (its accept or connect not seen: no role) whose first bytes are
 * HTTP/2's: the preface is the client's, a SETTINGS frame before it the server's. Its role, set;
 * false (and not HTTP/2 for good) for any other bytes. */
static __always_inline int h2_role(struct h2_scratch *x, struct sock_args *a, struct sk_state *st, int ingress)
{
    u8 *h = x->pre;
    __builtin_memset(h, 0, H2_PREFACE_LEN);
    u64 n = a->ret > 0 ? head_bytes(a, a->ret, h, H2_PREFACE_LEN) : 0;
    u64 w0 = 0, w1 = 0, w2 = 0;
    __builtin_memcpy(&w0, h, 8);
    __builtin_memcpy(&w1, h + 8, 8);
    __builtin_memcpy(&w2, h + 16, 8);
    if (n == H2_PREFACE_LEN && w0 == 0x5448202a20495250ULL && w1 == 0x0a0d302e322f5054ULL &&
        w2 == 0x0a0d0a0d4d530a0dULL) {
        st->role = ingress ? SK_ROLE_SERVER : SK_ROLE_CLIENT;
        return 1;
    }
    if (n >= 9 && h[3] == H2F_SETTINGS && !h[4] && !h[5] && !h[6] && !h[7] && !h[8]) {
        st->role = ingress ? SK_ROLE_CLIENT : SK_ROLE_SERVER;
        return 1;
    }
    st->h2 = SK_H2_NO;
    return 0;
}

/* A call of a connection that may be HTTP/2, handed over by sock_capture (h2_handoff): the
 * preface, in the request side's first bytes, begins the walk; the record goes to the ring
 * unless the connection is counted; one that does not fit switches it to counting; then
 * h2_walk. Written in three phases that share nothing but the scratch (x->call, x->send): the
 * verifier then meets one state at the record's sending, whatever the first phase found. */
int h2_capture(void *ctx)
{
    struct h2_scratch *x = h2_buffers();
    struct sock_args *a = thread_args(0);
    if (!x || !a)
        return 0;
    u8 func = x->func;
    a->func = func;
    s32 ret = a->ret;
    u64 id = bpf_get_current_pid_tgid();
    struct h2_call *call = &x->call;
    call->key = fd_key(id >> 32, a->fd);
    call->pid = id >> 32;
    {
        /* 1: which connection, and whether the record goes to the ring */
        struct sk_state *st = sock_state.lookup(&call->key);
        if (!st) {
            a->func = 0;
            return 0;
        }
        int ingress = func == SF_READ || func == SF_READV || func == SF_RECVFROM || func == SF_RECVMSG;
        int s2c = 0;
        struct h2_conn *c = 0;
        if (st->role || h2_role(x, a, st, ingress)) {  /* no role: not HTTP/2 unless its first bytes say */
            s2c = (st->role == SK_ROLE_SERVER) != ingress;
            c = h2_lookup(call->key, st->seq);
            if ((st->h2 == SK_H2_UNKNOWN || st->h2 == SK_H2_UNSEEN) && ret > 0 && (!s2c || st->req == REQ_NONE))
                c = h2_begin_conn(x, a, st, c, call->key, s2c);
        }
        call->seq = st->seq;
        call->role = st->role;
        call->s2c = s2c;
        if (c && c->mode == H2_WALK) {
            /* the agent more than the backlog behind (the ring and its processing queue, as
             * http_gate sheds HTTP/1 requests for): counted from this call on, before records are
             * lost in the ring or dropped after it */
            u64 limit = sampling(SAMPLING_BACKLOG);
            if (sock_backlog() > (limit ? limit : SOCK_BACKLOG_BYTES)) {
                c->mode = H2_COUNTED;
                h2_stat(H2S_BACKLOG);
            }
        }
        x->send = !c || (c->mode != H2_COUNTED && c->mode != H2_LOST);
        x->followed = c != 0;
        /* a client's record, written while its thread serves a shed HTTP/1 request, says so; a
         * walked server's says at which shift its streams are sampled (h2_keep) */
        x->xflags = st->role == SK_ROLE_CLIENT && a->serving == REQ_SHED ? SOCKF_SERVING_SHED : 0;
        u64 sh = sampling(SAMPLING_SHIFT);
        if (sh < SAMPLING_MIN_SHIFT)
            sh = SAMPLING_MIN_SHIFT;  /* the configured probability, before user space says */
        if (sh > 20)
            sh = 20;
        x->shift = sh;
        if (c && c->mode == H2_WALK && st->role == SK_ROLE_SERVER)
            x->xflags |= SOCKF_H2_DECIDED | ((u32)sh << SOCKF_SHIFT_BIT);
    }
    h2_forget();
    /* 2: the record, as sock_capture sends it */
    int err = 1;
    if (x->send) {
        u64 xflags = x->xflags;
        if (xflags & SOCKF_H2_DECIDED)
            xflags |= (u64)call->seq << 32;  /* the connection's, for user space's h2_keep */
        if (func == SF_READ || func == SF_WRITE || func == SF_SENDTO || func == SF_RECVFROM) {
            err = emit_buffer(id, a, ret, xflags);
        } else if (func == SF_READV || func == SF_WRITEV) {
            err = emit_vector(id, a, ret, a->buf, a->vlen, xflags);
        } else {
            u64 hdr[2] = {};
            if (ret > 0)
                read_user(hdr, sizeof(hdr), (void *)(a->buf + 16));
            err = emit_vector(id, a, ret, hdr[0], hdr[1], xflags);
        }
    }
    a->func = 0;
    h2_forget();
    /* 3: the switch, the announcement, the walk */
    if (!x->followed)
        return 0;
    struct h2_conn *c = h2_lookup(call->key, call->seq);
    if (!c)
        return 0;
    if (err) {
        if (c->mode == H2_WALK) {
            c->mode = H2_COUNTED;
            h2_stat(H2S_SWITCHED);
        } else if (c->mode == H2_PROBE) {
            c->probe_lost = 1;  /* counted from the preface on, if it comes */
        }
    }
    if (c->mode == H2_COUNTED || c->mode == H2_LOST)
        h2_announce(c, id, a->fd, func);
    if (c->mode == H2_OFF || c->mode == H2_LOST || ret <= 0)
        return 0;
    u64 now = bpf_ktime_get_ns();
    call->now = now;
    call->start = call->role == SK_ROLE_SERVER ? now : a->ts;
    call->counting = err != 0;
    /* Response blocks (:status, grpc-status, trailers) matter only for streams the kernel counts:
     * read in a counted call, and while the ring is more than a quarter full (a switch may come,
     * and a stream in flight then is counted with what was read of it); otherwise they cost two
     * lookups and a read per stream for nothing. A stream in flight at a switch whose response
     * began before that is counted with its :status unknown. */
    x->read_responses = call->counting || sock_backlog() > SOCK_RING_PAGES * 4096ULL / 4;
    struct h2_cursor *cur = &x->cur;
    cur->base = a->buf;
    cur->clen = ret;
    cur->total = 0;
    cur->vec = 0;
    cur->vlen = 0;
    cur->next = 0;
    cur->round = 0;
    x->win_len = 0;
    if (func == SF_READV || func == SF_WRITEV || func == SF_SENDMSG || func == SF_RECVMSG) {
        u64 vec = a->buf, vlen = a->vlen;
        if (func == SF_SENDMSG || func == SF_RECVMSG) {
            u64 hdr[2] = {};
            if (read_user(hdr, sizeof(hdr), (void *)(a->buf + 16)) != 0)
                return 0;
            vec = hdr[0];
            vlen = hdr[1];
        }
        cur->clen = 0;
        cur->total = ret;
        cur->vec = vec;
        cur->vlen = vlen;
    }
    sock_capture_prog.call(ctx, H2_PROG_WALK);
    return 0;
}

/* close() of a followed connection: a counted one's open streams are counted as ended by it
 * (at their mean duration: the kernel cannot walk them one by one); the announcement goes
 * first, if it has not yet. False: the close record must not go to the ring (user space would
 * end, and count, the streams the kernel counts). */
static __always_inline int h2_close(u32 tgid, u64 key, struct sk_state *st, u64 id, s32 fd)
{
    struct h2_conn *c = h2_conns.lookup(&key);
    if (!c)
        return 1;
    int emit = 1;
    if (c->seq == st->seq && (c->mode == H2_COUNTED || c->mode == H2_LOST)) {
        h2_announce(c, id, fd, SF_CLOSE);
        if (!c->announced) {
            h2_stat(H2S_ANNOUNCE_LOST);
            emit = 0;
        }
        if (c->open && c->mode == H2_COUNTED) {
            u64 now = bpf_ktime_get_ns();
            u64 sum = (u64)c->open * now - c->start_sum;
            u64 mean = sum / c->open;
            struct h2_red_key k = {.pid = tgid, .role = st->role, .grpc = c->grpc, .end = H2_CLOSED};
            h2_red_add(&k, c->open, sum, mean, mean);
        }
    }
    if (st->role == SK_ROLE_SERVER)
        h2_unserve(key, st->seq, 0, 1);  /* a stream closed without its response ends here */
    h2_conns.delete(&key);
    return emit;
}
