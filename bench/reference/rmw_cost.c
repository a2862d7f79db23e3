/* What an atomic read-modify-write costs beside a plain one, per delivery.
 *
 * A server whose connections may be written from several threads takes, per delivery,
 * atomic read-modify-writes that a single-threaded one does not: a connection's lock taken
 * and released, reference counts up and down, shared counters. This loop visits CONNS
 * connection-sized blocks in a scattered order, as a fan-out does, stores into each (the
 * queue slot), then adds to a counter in it OPS times: by `lock xadd` (what an atomic
 * fetch_add or a mutex compiles to on x86-64) or by a plain load and store. The two modes run
 * back to back; the difference divided by OPS is what the lock prefix costs.
 *
 *   make -C bench/reference rmw_cost && taskset -c 0 bench/reference/rmw_cost 1000 14
 *   taskset -c 0 bench/reference/rmw_cost 100000 14   (the blocks beyond the L2 cache) */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct conn {
    uint64_t count;
    uint64_t slots[7];
} __attribute__((aligned(64)));

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    unsigned conns = argc > 1 ? (unsigned)atoi(argv[1]) : 1000;
    int ops = argc > 2 ? atoi(argv[2]) : 14;
    const unsigned deliveries = 20000000;
    if (conns == 0 || ops < 0) {
        fprintf(stderr, "usage: rmw_cost [CONNS] [OPS]\n");
        return 2;
    }
    struct conn *c = aligned_alloc(64, sizeof(struct conn) * conns);
    if (!c) {
        perror("aligned_alloc");
        return 1;
    }
    for (unsigned i = 0; i < conns; i++) c[i].count = 0;
    double ns[2];
    for (int locked = 0; locked < 2; locked++) {
        double t0 = now_s();
        for (unsigned d = 0; d < deliveries; d++) {
            /* 7919 is prime: every block is visited, in an order the prefetcher cannot follow. */
            struct conn *x = &c[(uint64_t)d * 7919u % conns];
            x->slots[d % 7] = d;
            for (int j = 0; j < ops; j++) {
                if (locked) {
                    __atomic_fetch_add(&x->count, 1, __ATOMIC_SEQ_CST);
                } else {
                    uint64_t v = __atomic_load_n(&x->count, __ATOMIC_RELAXED);
                    __atomic_store_n(&x->count, v + 1, __ATOMIC_RELAXED);
                }
            }
        }
        ns[locked] = (now_s() - t0) / deliveries * 1e9;
    }
    printf("%u blocks, %d adds a delivery: plain %.1f ns, locked %.1f ns a delivery; "
           "%.2f ns more per locked add\n",
           conns, ops, ns[0], ns[1], ops ? (ns[1] - ns[0]) / ops : 0.0);
    free(c);
    return 0;
}
