/* What a page fault costs this machine, in huge (2 MiB) pages and in small (4 KiB) ones.
 *
 * Maps SIZE MiB three times over (unmapping between rounds) and writes one byte into each
 * page, timing every write: the first round mostly meets memory the machine has not used yet,
 * the later ones memory it has. With `huge`, the mapping is marked MADV_HUGEPAGE, as mimalloc
 * marks its arenas, so each write of the 2 MiB stride faults in a whole huge page.
 *
 *   make -C bench/reference page_faults && bench/reference/page_faults 512 huge
 *   bench/reference/page_faults 512 small
 * (docs/performance.md, "Huge pages"; bench/RESULTS.md, session 15.) */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define HUGE_PAGE (2UL << 20)

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    if (argc != 3 || atol(argv[1]) <= 0 || (strcmp(argv[2], "huge") && strcmp(argv[2], "small"))) {
        fprintf(stderr, "usage: %s SIZE_MIB huge|small\n", argv[0]);
        return 2;
    }
    size_t size = (size_t)atol(argv[1]) << 20;
    int huge = strcmp(argv[2], "huge") == 0;
    size_t stride = huge ? HUGE_PAGE : 4096;
    for (int round = 0; round < 3; round++) {
        char *mapped = mmap(NULL, size + HUGE_PAGE, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mapped == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        char *p = (char *)(((unsigned long)mapped + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
        if (huge && madvise(p, size, MADV_HUGEPAGE) != 0) {
            perror("madvise(MADV_HUGEPAGE)");
            return 1;
        }
        double worst = 0, start = now_us();
        for (size_t off = 0; off < size; off += stride) {
            double t = now_us();
            p[off] = 1;
            double took = now_us() - t;
            if (took > worst)
                worst = took;
        }
        double total = now_us() - start;
        printf("round %d: %.0f us per 2 MiB, the slowest fault %.0f us\n", round,
               total / (size / HUGE_PAGE), worst);
        munmap(mapped, size + HUGE_PAGE);
    }
    return 0;
}
