/* Threads that malloc many small blocks (which glibc puts in its per-thread arenas):
 * THREADS threads each allocate MB_PER_THREAD MiB in blocks of 64..4096 bytes, fill
 * them with a pattern, free a third, reallocate some, then check every byte; a block
 * freed by another thread too. Exits 1 on a wrong byte. Usage: arenas [THREADS MB];
 * THREADS 0: the main thread does the work of one. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int threads = 8;
static size_t mb_per_thread = 48;
static uint8_t val(uint64_t t, uint64_t i, uint64_t j) { return (uint8_t)((t * 131 + i * 7 + j) * 0x9E3779B1u >> 24); }
struct blocks { char **p; size_t *n; size_t count; };
static void *work(void *arg) {
    uint64_t t = (uint64_t)(uintptr_t)arg;
    struct blocks *b = malloc(sizeof *b);
    size_t cap = mb_per_thread * (1 << 20) / 64;
    b->p = malloc(cap * sizeof(char *));
    b->n = malloc(cap * sizeof(size_t));
    size_t total = 0, i = 0;
    uint64_t x = t * 2654435761u + 1;
    while (total < mb_per_thread << 20 && i < cap) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t n = 64 + x % 4033;
        char *p = malloc(n);
        if (!p) { printf("malloc failed\n"); exit(1); }
        for (size_t j = 0; j < n; j++) p[j] = val(t, i, j);
        b->p[i] = p; b->n[i] = n; total += n; i++;
    }
    b->count = i;
    /* free every third block, double every sixth (none of those freed) */
    for (size_t k = 0; k < b->count; k += 3) { free(b->p[k]); b->p[k] = NULL; }
    for (size_t k = 1; k < b->count; k += 6) {
        char *q = realloc(b->p[k], b->n[k] * 2);
        if (!q) { printf("realloc failed\n"); exit(1); }
        for (size_t j = b->n[k]; j < b->n[k] * 2; j++) q[j] = val(t, k, j);
        b->p[k] = q; b->n[k] *= 2;
    }
    for (size_t k = 0; k < b->count; k++) {
        if (!b->p[k]) continue;
        for (size_t j = 0; j < b->n[k]; j++)
            if ((uint8_t)b->p[k][j] != val(t, k, j)) { printf("BAD thread %llu block %zu byte %zu\n", (unsigned long long)t, k, j); exit(1); }
    }
    return b;
}
int main(int argc, char **argv) {
    if (argc > 2) { threads = atoi(argv[1]); mb_per_thread = strtoul(argv[2], NULL, 10); }
    if (threads == 0) {
        /* the main thread itself: its small blocks start in glibc's brk heap */
        struct blocks *b = work(0);
        printf("arenas ok main thread %zu blocks\n", b->count);
        return 0;
    }
    pthread_t th[64];
    for (int t = 0; t < threads; t++) pthread_create(&th[t], NULL, work, (void *)(uintptr_t)t);
    size_t blocks = 0;
    for (int t = 0; t < threads; t++) {
        struct blocks *b;
        pthread_join(th[t], (void **)&b);
        /* the main thread checks and frees the other threads' blocks */
        for (size_t k = 0; k < b->count; k++) {
            if (!b->p[k]) continue;
            for (size_t j = 0; j < b->n[k]; j += 97)
                if ((uint8_t)b->p[k][j] != val(t, k, j)) { printf("BAD after join\n"); exit(1); }
            free(b->p[k]); blocks++;
        }
        free(b->p); free(b->n); free(b);
    }
    printf("arenas ok %d threads %zu blocks\n", threads, blocks);
    return 0;
}
