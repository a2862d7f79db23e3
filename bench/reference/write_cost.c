// What a small loopback write costs the writing core, by send(2) one socket at a time (or
// sendmsg(2), the message as one slice or two, or two slices gathered into one buffer and sent
// by send(2)) or by io_uring, a batch of sends per io_uring_enter(2). At a wide fan-out most
// of a server's core is these writes (the receiver's TCP work is charged to the writer on
// loopback), so which call makes them is a question of the whole server's cost.
//
// N connected TCP pairs on 127.0.0.1 (TCP_NODELAY, as herald sets). A writer thread pinned to
// core 0 writes one SIZE-byte message to every connection per round, RATE writes a second in
// all; a reader thread pinned to core 1 drains them with epoll, as the bench's subscribers do.
// The cost is core 0's busy time (/proc/stat: everything but idle and iowait, so the softirq
// work the writes cause is counted) over the writes made. `spaced` sends as `write` does but
// waits GAP µs (spinning, its time taken off the busy time) after each send, so that the
// reader has drained and sleeps when the next arrives: the difference is what waking the
// reader costs the writer.
//
//   write_cost N RATE SECONDS MODE[,MODE...] [BATCH] [SIZE] [GAP]
//   e.g. write_cost 2000 100000 30 write,uring,uring-fd 32
//        write_cost 1000 20000 20 write,spaced 32 80 30
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int n_conns;
static int *writers, *readers;
static atomic_int done;

static void pin(int core) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) perror("sched_setaffinity");
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

// Core `core`'s busy and total jiffies from /proc/stat.
static void core_ticks(int core, long long *busy, long long *total) {
    FILE *f = fopen("/proc/stat", "r");
    char name[16], want[16];
    snprintf(want, sizeof want, "cpu%d", core);
    long long v[10] = {0};
    *busy = *total = 0;
    while (f && fscanf(f, "%15s %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld%*[^\n]", name,
                       &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]) >= 5) {
        if (strcmp(name, want) == 0) {
            for (int i = 0; i < 8; i++) *total += v[i];
            *busy = *total - v[3] - v[4];
            break;
        }
    }
    if (f) fclose(f);
}

static void *reader(void *arg) {
    (void)arg;
    pin(1);
    int ep = epoll_create1(0);
    for (int i = 0; i < n_conns; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = readers[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, readers[i], &ev);
    }
    static char buf[65536];
    struct epoll_event evs[256];
    while (!atomic_load(&done)) {
        int n = epoll_wait(ep, evs, 256, 100);
        for (int i = 0; i < n; i++) {
            if (read(evs[i].data.fd, buf, sizeof buf) < 0) perror("read");
        }
    }
    return NULL;
}

static void pair(int listener, struct sockaddr_in *addr, int *w, int *r) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)addr, sizeof *addr) != 0) { perror("connect"); exit(1); }
    int s = accept(listener, NULL, NULL);
    if (s < 0) { perror("accept"); exit(1); }
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    *w = s;
    *r = c;
}

enum mode { SEND, SENDMSG, SENDMSG2, GATHER2, SPACED, URING_FIXED, URING_FD, MODES };
static const char *mode_names[MODES] = {"write", "sendmsg", "sendmsg2", "gather2", "spaced", "uring", "uring-fd"};

// Sends `size` bytes of `msg` on `fd` without waiting, the way `mode` (one of the system-call
// modes) says: send(2); sendmsg(2) with the message as one slice or as two halves; or the two
// halves copied into one buffer, then send(2). SIZE is at most 8,192 (checked in main).
static ssize_t send_one(int mode, int fd, const char *msg, int size) {
    const int flags = MSG_DONTWAIT | MSG_NOSIGNAL;
    struct iovec halves[2] = {{(char *)msg, size / 2}, {(char *)msg + size / 2, size - size / 2}};
    struct msghdr m = {.msg_iov = halves, .msg_iovlen = 2};
    char gathered[8192];
    switch (mode) {
    case SENDMSG:
        halves[0].iov_len = size;
        m.msg_iovlen = 1;
        return sendmsg(fd, &m, flags);
    case SENDMSG2:
        return sendmsg(fd, &m, flags);
    case GATHER2:
        memcpy(gathered, halves[0].iov_base, halves[0].iov_len);
        memcpy(gathered + halves[0].iov_len, halves[1].iov_base, halves[1].iov_len);
        return send(fd, gathered, size, flags);
    default: // SEND, SPACED
        return send(fd, msg, size, flags);
    }
}

// Adds core 0's ticks since the last call (*b0, *t0) to `mode` (none while warming up: -1).
static void settle(int mode, long long *busy, long long *total, long long *b0, long long *t0) {
    long long b, t;
    core_ticks(0, &b, &t);
    if (mode >= 0) {
        busy[mode] += b - *b0;
        total[mode] += t - *t0;
    }
    *b0 = b, *t0 = t;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s N RATE SECONDS MODE[,MODE...] [BATCH] [SIZE] [GAP]\n"
                        "  MODE: write (send(2) a socket at a time), sendmsg (the same by sendmsg(2), the\n"
                        "  message as one slice), sendmsg2 (by sendmsg(2) as two slices), gather2 (the two\n"
                        "  slices copied into one buffer, then send(2)), spaced (send(2), GAP us apart: the\n"
                        "  reader sleeps between them), uring (io_uring sends, registered files), uring-fd\n"
                        "  (io_uring sends on the plain descriptors); several modes take turns a second\n"
                        "  each, so a drifting host weighs on all alike\n", argv[0]);
        return 2;
    }
    n_conns = atoi(argv[1]);
    double rate = atof(argv[2]), seconds = atof(argv[3]);
    int modes[MODES], n_modes = 0;
    for (char *m = strtok(argv[4], ","); m && n_modes < MODES; m = strtok(NULL, ",")) {
        int found = -1;
        for (int i = 0; i < MODES; i++) if (strcmp(m, mode_names[i]) == 0) found = i;
        if (found < 0) { fprintf(stderr, "unknown mode %s\n", m); return 2; }
        modes[n_modes++] = found;
    }
    int batch = argc > 5 ? atoi(argv[5]) : 32;
    int size = argc > 6 ? atoi(argv[6]) : 96;
    double gap_s = (argc > 7 ? atof(argv[7]) : 30) / 1e6;
    if (n_conns < 1 || rate <= 0 || seconds < 1 || n_modes == 0 || batch < 1 || batch > 4096 || size < 1 ||
        size > 8192 || gap_s < 0) {
        fprintf(stderr, "N, RATE, SIZE (at most 8192) and BATCH (at most 4096) must be positive, SECONDS at least 1, "
                        "GAP not negative, and MODE one of write, sendmsg, sendmsg2, gather2, spaced, uring, uring-fd\n");
        return 2;
    }
    writers = calloc(n_conns, sizeof *writers);
    readers = calloc(n_conns, sizeof *readers);

    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    bind(l, (struct sockaddr *)&addr, sizeof addr);
    listen(l, 4096);
    getsockname(l, (struct sockaddr *)&addr, &len);
    for (int i = 0; i < n_conns; i++) pair(l, &addr, &writers[i], &readers[i]);

    pthread_t rt;
    pthread_create(&rt, NULL, reader, NULL);
    pin(0);

    struct io_uring ring;
    if (io_uring_queue_init(batch * 2, &ring, 0) != 0) { perror("io_uring"); return 1; }
    if (io_uring_register_files(&ring, writers, n_conns) != 0) { perror("register"); return 1; }
    char *msg = malloc(size);
    memset(msg, 'x', size);

    // One second of warm-up, then a second of each mode in turn.
    double round_s = n_conns / rate, start = now_s(), end = start + 1.0 + seconds;
    long long busy[MODES] = {0}, total[MODES] = {0}, b0 = 0, t0 = 0;
    double spun[MODES] = {0}; // seconds `spaced` spent waiting, taken off its busy time
    long writes[MODES] = {0}, short_writes = 0;
    int slot = -1; // -1: warming up, in the first mode
#define MEASURED(slot) ((slot) < 0 ? -1 : modes[(slot) % n_modes])
    for (double next = start; now_s() < end; next += round_s) {
        int now_slot = (int)(now_s() - start) - 1;
        if (now_slot != slot) {
            settle(MEASURED(slot), busy, total, &b0, &t0);
            slot = now_slot;
        }
        int mode = slot < 0 ? modes[0] : MEASURED(slot);
        for (int i = 0; i < n_conns; i += batch) {
            int k = i + batch > n_conns ? n_conns - i : batch;
            if (mode == SEND || mode == SENDMSG || mode == SENDMSG2 || mode == GATHER2 || mode == SPACED) {
                for (int j = i; j < i + k; j++) {
                    short_writes += send_one(mode, writers[j], msg, size) != size;
                    if (mode == SPACED) {
                        double from = now_s(), until = from + gap_s, at;
                        while ((at = now_s()) < until) {}
                        if (slot >= 0) spun[mode] += at - from;
                    }
                }
            } else {
                for (int j = i; j < i + k; j++) {
                    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
                    int fixed = mode == URING_FIXED;
                    io_uring_prep_send(sqe, fixed ? j : writers[j], msg, size, MSG_DONTWAIT | MSG_NOSIGNAL);
                    if (fixed) sqe->flags |= IOSQE_FIXED_FILE;
                }
                io_uring_submit_and_wait(&ring, k);
                struct io_uring_cqe *cqe;
                unsigned head, seen = 0;
                io_uring_for_each_cqe(&ring, head, cqe) {
                    short_writes += cqe->res != size;
                    seen++;
                }
                io_uring_cq_advance(&ring, seen);
            }
            if (slot >= 0) writes[mode] += k;
        }
        double wait = next + round_s - now_s();
        if (wait > 0) {
            struct timespec t = {(time_t)wait, (long)((wait - (time_t)wait) * 1e9)};
            nanosleep(&t, NULL);
        }
    }
    settle(MEASURED(slot), busy, total, &b0, &t0); // the last slot too
    atomic_store(&done, 1);
    pthread_join(rt, NULL);
    printf("%d conns, %.0f writes/s, %d bytes, batches of %d, %ld short:", n_conns, rate, size, batch, short_writes);
    for (int i = 0; i < n_modes; i++) {
        int m = modes[i];
        double busy_s = busy[m] / (double)sysconf(_SC_CLK_TCK) - spun[m];
        printf("  %s %.2f us a write (core 0 %.0f%% busy)", mode_names[m], writes[m] ? 1e6 * busy_s / writes[m] : 0,
               total[m] ? 100.0 * busy[m] / total[m] : 0);
    }
    printf("\n");
    return 0;
}
