/*
 * The speed-of-light reference for herald's fan-out (issue 4, target 10).
 *
 * A minimal single-threaded epoll broadcast loop that speaks just enough of herald's protocol
 * for `herald bench` fan-out scenarios: the WebSocket handshake, masked client text frames,
 * {"op":"sub"} on exact topics (no wildcards, no history, no limits, no recovery), and
 * {"op":"pub"} fanned out as {"op":"msg"} frames with a per-topic sequence number and, when
 * asked, a receive timestamp. Each message frame is encoded once; every connection's output
 * is appended to its buffer and flushed with one write() after the whole epoll round has been
 * read: the batching the issue names as the main lever. Nothing here is meant for production:
 * it is what herald's egress is measured against.
 *
 * Build: make -C bench/reference      Run: bench/reference/epoll_fanout [PORT]  (default 18100)
 * Drive: herald bench SCENARIO --url ws://127.0.0.1:PORT/ws
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "sha1.h"

typedef struct {
    char *data;
    size_t len, cap;
} buf_t;

static void buf_reserve(buf_t *b, size_t extra) {
    if (b->len + extra <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    b->data = realloc(b->data, cap);
    if (!b->data) { perror("realloc"); exit(1); }
    b->cap = cap;
}

static void buf_append(buf_t *b, const void *p, size_t n) {
    buf_reserve(b, n);
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void buf_consume(buf_t *b, size_t n) {
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

typedef struct conn {
    int fd;
    uint32_t gen;   /* tells this connection from an earlier one on the same fd */
    int upgraded;
    int dirty;      /* on the flush list this round */
    int want_write; /* EPOLLOUT registered: the socket was full */
    buf_t in, out;
} conn_t;

typedef struct {
    int fd;
    uint32_t gen;
} sub_t;

typedef struct {
    char *name;
    size_t name_len;
    uint64_t seq;
    sub_t *subs;
    size_t nsubs, cap;
} topic_t;

static conn_t **conns;    /* by fd */
static size_t conns_cap;
static int *dirty;        /* fds to flush at the end of the round */
static size_t ndirty, dirty_cap;
static topic_t *topics;   /* open addressing */
static size_t topics_cap = 1 << 16, ntopics;
static int epfd;
static uint32_t next_gen;

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static topic_t *topic_find(const char *name, size_t n, int create) {
    if (create && ntopics * 2 >= topics_cap) {
        topic_t *old = topics;
        size_t old_cap = topics_cap;
        topics_cap *= 2;
        topics = calloc(topics_cap, sizeof(topic_t));
        for (size_t i = 0; i < old_cap; i++) {
            if (!old[i].name) continue;
            size_t j = fnv1a(old[i].name, old[i].name_len) & (topics_cap - 1);
            while (topics[j].name) j = (j + 1) & (topics_cap - 1);
            topics[j] = old[i];
        }
        free(old);
    }
    size_t i = fnv1a(name, n) & (topics_cap - 1);
    while (topics[i].name) {
        if (topics[i].name_len == n && memcmp(topics[i].name, name, n) == 0) return &topics[i];
        i = (i + 1) & (topics_cap - 1);
    }
    if (!create) return NULL;
    topics[i].name = strndup(name, n);
    topics[i].name_len = n;
    ntopics++;
    return &topics[i];
}

static uint64_t now_us(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

static void mark_dirty(conn_t *c) {
    if (c->dirty) return;
    c->dirty = 1;
    if (ndirty == dirty_cap) {
        dirty_cap = dirty_cap ? dirty_cap * 2 : 1024;
        dirty = realloc(dirty, dirty_cap * sizeof(int));
    }
    dirty[ndirty++] = c->fd;
}

/* Appends an unmasked server frame header for a payload of n bytes. */
static size_t frame_header(unsigned char *h, int opcode, size_t n) {
    h[0] = 0x80 | opcode;
    if (n < 126) { h[1] = n; return 2; }
    if (n <= 0xFFFF) { h[1] = 126; h[2] = n >> 8; h[3] = n; return 4; }
    h[1] = 127;
    for (int i = 0; i < 8; i++) h[2 + i] = (uint64_t)n >> (56 - 8 * i);
    return 10;
}

static void send_frame(conn_t *c, int opcode, const char *p, size_t n) {
    unsigned char h[10];
    buf_append(&c->out, h, frame_header(h, opcode, n));
    buf_append(&c->out, p, n);
    mark_dirty(c);
}

static void close_conn(conn_t *c) {
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    conns[c->fd] = NULL;
    /* Its subscriptions are dropped lazily at publish (the generation no longer matches);
     * its entry on the dirty list is skipped at flush (no connection, or a newer one). */
    free(c->in.data);
    free(c->out.data);
    free(c);
}

/* The raw bytes of a JSON string field (no unescaping: the bench sends none). */
static int json_str(const char *s, size_t n, const char *key, const char **v, size_t *vn) {
    const char *k = memmem(s, n, key, strlen(key));
    if (!k) return 0;
    const char *start = k + strlen(key);
    const char *end = start;
    while (end < s + n && *end != '"') end += (*end == '\\') ? 2 : 1;
    if (end >= s + n) return 0;
    *v = start;
    *vn = end - start;
    return 1;
}

static void on_text(conn_t *c, const char *s, size_t n) {
    const char *op, *topic, *data;
    size_t opn, tn, dn;
    if (!json_str(s, n, "\"op\":\"", &op, &opn) || !json_str(s, n, "\"topic\":\"", &topic, &tn)) return;
    if (opn == 3 && memcmp(op, "sub", 3) == 0) {
        topic_t *t = topic_find(topic, tn, 1);
        if (t->nsubs == t->cap) {
            t->cap = t->cap ? t->cap * 2 : 8;
            t->subs = realloc(t->subs, t->cap * sizeof(sub_t));
        }
        t->subs[t->nsubs++] = (sub_t){c->fd, c->gen};
        char reply[600];
        int rn = snprintf(reply, sizeof reply,
                          "{\"op\":\"subscribed\",\"topic\":\"%.*s\",\"recovered\":true,\"replayed\":0}",
                          (int)tn, topic);
        send_frame(c, 1, reply, rn);
    } else if (opn == 3 && memcmp(op, "pub", 3) == 0) {
        if (!json_str(s, n, "\"data\":\"", &data, &dn)) return;
        int stamp = memmem(s, n, "\"stamp\":true", 12) != NULL;
        topic_t *t = topic_find(topic, tn, 1);
        t->seq++;
        /* Encode once: header + JSON, then copy into each subscriber's buffer. */
        size_t cap = dn + tn + 128;
        char *msg = malloc(cap + 10);
        char *body = msg + 10;
        int bn = stamp ? snprintf(body, cap, "{\"op\":\"msg\",\"topic\":\"%.*s\",\"seq\":%llu,\"epoch\":\"ref\",\"data\":\"%.*s\",\"ts\":%llu}",
                                  (int)tn, topic, (unsigned long long)t->seq, (int)dn, data, (unsigned long long)now_us())
                       : snprintf(body, cap, "{\"op\":\"msg\",\"topic\":\"%.*s\",\"seq\":%llu,\"epoch\":\"ref\",\"data\":\"%.*s\"}",
                                  (int)tn, topic, (unsigned long long)t->seq, (int)dn, data);
        unsigned char h[10];
        size_t hn = frame_header(h, 1, bn);
        char *frame = body - hn;
        memcpy(frame, h, hn);
        size_t live = 0;
        for (size_t i = 0; i < t->nsubs; i++) {
            sub_t sub = t->subs[i];
            conn_t *sc = conns[sub.fd];
            if (!sc || sc->gen != sub.gen) continue; /* closed: forget it */
            t->subs[live++] = sub;
            buf_append(&sc->out, frame, hn + bn);
            mark_dirty(sc);
        }
        t->nsubs = live;
        free(msg);
        /* A publish with an id is acknowledged (herald pub waits for it). */
        const char *id = memmem(s, n, "\"id\":", 5);
        if (id) {
            id += 5;
            size_t idn = 0;
            while (id + idn < s + n && id[idn] != ',' && id[idn] != '}') idn++;
            char ack[700];
            int an = snprintf(ack, sizeof ack, "{\"op\":\"ack\",\"id\":%.*s,\"topic\":\"%.*s\",\"seq\":%llu}",
                              (int)idn, id, (int)tn, topic, (unsigned long long)t->seq);
            send_frame(c, 1, ack, an);
        }
    }
}

static int on_handshake(conn_t *c) {
    char *end = memmem(c->in.data, c->in.len, "\r\n\r\n", 4);
    if (!end) return c->in.len > 8192 ? -1 : 0;
    const char *key;
    size_t kn;
    char *k = memmem(c->in.data, end - c->in.data, "Sec-WebSocket-Key:", 18);
    if (!k) k = memmem(c->in.data, end - c->in.data, "sec-websocket-key:", 18);
    if (!k) return -1;
    key = k + 18;
    while (*key == ' ') key++;
    const char *ke = memchr(key, '\r', end + 2 - key);
    kn = ke - key;
    char accept[29];
    websocket_accept(key, kn, accept);
    char resp[256];
    int n = snprintf(resp, sizeof resp,
                     "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Accept: %s\r\n\r\n", accept);
    buf_append(&c->out, resp, n);
    mark_dirty(c);
    c->upgraded = 1;
    buf_consume(&c->in, end + 4 - c->in.data);
    return 1;
}

/* Parses every complete client frame in the input buffer. -1: close the connection. */
static int on_frames(conn_t *c) {
    size_t off = 0;
    unsigned char *b = (unsigned char *)c->in.data;
    while (c->in.len - off >= 2) {
        unsigned char *f = b + off;
        size_t avail = c->in.len - off;
        int opcode = f[0] & 0x0F;
        if (!(f[1] & 0x80)) return -1; /* clients must mask */
        size_t len = f[1] & 0x7F, hn = 2;
        if (len == 126) { if (avail < 4) break; len = (f[2] << 8) | f[3]; hn = 4; }
        else if (len == 127) {
            if (avail < 10) break;
            len = 0;
            for (int i = 0; i < 8; i++) len = (len << 8) | f[2 + i];
            hn = 10;
        }
        if (avail < hn + 4 + len) break;
        unsigned char *mask = f + hn, *p = f + hn + 4;
        for (size_t i = 0; i < len; i++) p[i] ^= mask[i & 3];
        if (opcode == 8) return -1;
        if (opcode == 9) send_frame(c, 10, (char *)p, len);
        if (opcode == 1) on_text(c, (char *)p, len);
        off += hn + 4 + len;
    }
    buf_consume(&c->in, off);
    return 0;
}

static void on_readable(conn_t *c) {
    for (;;) {
        buf_reserve(&c->in, 65536);
        ssize_t n = read(c->fd, c->in.data + c->in.len, c->in.cap - c->in.len);
        if (n > 0) { c->in.len += n; continue; }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) { close_conn(c); return; }
        if (errno == EAGAIN) break;
    }
    if (!c->upgraded) {
        int r = on_handshake(c);
        if (r < 0) { close_conn(c); return; }
        if (r == 0) return;
    }
    if (on_frames(c) < 0) close_conn(c);
}

/* One write per connection per round; what the socket can't take waits for EPOLLOUT. */
static void flush(conn_t *c) {
    while (c->out.len) {
        ssize_t n = write(c->fd, c->out.data, c->out.len);
        if (n > 0) { buf_consume(&c->out, n); continue; }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) break;
        close_conn(c);
        return;
    }
    int want = c->out.len > 0;
    if (want != c->want_write) {
        struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.fd = c->fd};
        epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
        c->want_write = want;
    }
}

int main(int argc, char **argv) {
    int port = argc > 1 ? atoi(argv[1]) : 18100;
    signal(SIGPIPE, SIG_IGN);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) || listen(lfd, 4096)) {
        perror("bind/listen");
        return 1;
    }
    conns_cap = 1 << 20;
    conns = calloc(conns_cap, sizeof(conn_t *));
    topics = calloc(topics_cap, sizeof(topic_t));
    epfd = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &ev);
    fprintf(stderr, "epoll_fanout listening on 127.0.0.1:%d\n", port);
    struct epoll_event events[1024];
    for (;;) {
        int n = epoll_wait(epfd, events, 1024, -1);
        if (n < 0 && errno == EINTR) continue;
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == lfd) {
                int cfd;
                while ((cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if ((size_t)cfd >= conns_cap) { close(cfd); continue; }
                    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conn_t *c = calloc(1, sizeof(conn_t));
                    c->fd = cfd;
                    c->gen = ++next_gen;
                    conns[cfd] = c;
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = cfd};
                    epoll_ctl(epfd, EPOLL_CTL_ADD, cfd, &cev);
                }
                continue;
            }
            conn_t *c = conns[fd];
            if (!c) continue;
            if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(c);
            else if (events[i].events & EPOLLOUT) mark_dirty(c);
        }
        /* The round's input is all read: now one write per connection that has output. */
        for (size_t i = 0; i < ndirty; i++) {
            conn_t *c = conns[dirty[i]];
            if (!c) continue;
            c->dirty = 0;
            flush(c);
        }
        ndirty = 0;
    }
}
