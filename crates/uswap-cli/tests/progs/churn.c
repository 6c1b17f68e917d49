/* Issue 16 item 1: many threads allocating, writing, checking and freeing blocks of
 * 1-48 MiB at once (the pattern that deadlocked the fault thread on its own O_DIRECT
 * write). THREADS threads (argv[1], default 16) x ROUNDS rounds (argv[2], default 12):
 * malloc a block, write every 512th word, check it, free it. Exit 1 on a wrong word. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int rounds = 12;
static int bad;

static void *run(void *arg) {
    uint64_t seed = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < rounds; i++) {
        seed ^= seed << 13; seed ^= seed >> 7; seed ^= seed << 17;
        size_t mib = 1 + seed % 48, words = (mib << 20) / 8;
        uint64_t *p = malloc(mib << 20);
        if (!p) { __atomic_store_n(&bad, 2, __ATOMIC_RELAXED); return 0; }
        for (size_t j = 0; j < words; j += 512) p[j] = seed ^ j;
        for (size_t j = 0; j < words; j += 512)
            if (p[j] != (seed ^ j)) {
                fprintf(stderr, "churn: wrong word %zu of a %zu MiB block\n", j, mib);
                __atomic_store_n(&bad, 1, __ATOMIC_RELAXED);
                break;
            }
        free(p);
    }
    return 0;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 16;
    if (argc > 2) rounds = atoi(argv[2]);
    pthread_t th[256];
    if (threads < 1 || threads > 256) return 2;
    for (long i = 0; i < threads; i++) pthread_create(&th[i], 0, run, (void *)(i + 1));
    for (int i = 0; i < threads; i++) pthread_join(th[i], 0);
    if (bad) { printf("churn: FAILED (%d)\n", bad); return 1; }
    printf("churn ok: %d threads x %d rounds\n", threads, rounds);
    return 0;
}
