/* Large blocks from whatever allocator owns malloc (glibc, or jemalloc, tcmalloc,
 * mimalloc linked or preloaded): 24 blocks of 1-9 MiB, 120 MiB in all, each written
 * with a pattern of its own, grown with realloc, read back exactly, freed; aligned
 * blocks and malloc_usable_size too, and the allocator's own API where linked with it
 * (-DJEMALLOC: mallocx/sdallocx; -DTCMALLOC: tc_malloc/tc_free; -DMIMALLOC:
 * mi_malloc/mi_free). Prints "bigalloc ok" or exits 1 saying what differed. */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef JEMALLOC
#include <jemalloc/jemalloc.h>
#endif
#ifdef TCMALLOC
#include <gperftools/tcmalloc.h>
#endif
#ifdef MIMALLOC
#include <mimalloc.h>
#endif

#define N 24
static uint64_t word(int b, size_t i) { return ((uint64_t)b << 40) ^ (i * 0x9e3779b97f4a7c15ull); }
static void fill(uint64_t *p, size_t words, int b) {
    for (size_t i = 0; i < words; i++) p[i] = word(b, i);
}
static void check(const uint64_t *p, size_t words, int b, const char *what) {
    for (size_t i = 0; i < words; i++)
        if (p[i] != word(b, i)) {
            printf("%s %d: word %zu differs\n", what, b, i);
            exit(1);
        }
}

int main(void) {
    uint64_t *blk[N];
    size_t len[N];
    for (int b = 0; b < N; b++) {
        len[b] = ((size_t)(b % 9) + 1) << 20;
        blk[b] = malloc(len[b]);
        if (!blk[b] || malloc_usable_size(blk[b]) < len[b]) {
            printf("malloc %d failed\n", b);
            return 1;
        }
        fill(blk[b], len[b] / 8, b);
    }
    for (int b = 0; b < N; b++) check(blk[b], len[b] / 8, b, "block");
    /* Grow every other block: the old bytes move with it. */
    for (int b = 0; b < N; b += 2) {
        uint64_t *n = realloc(blk[b], len[b] + (3 << 20));
        if (!n) { printf("realloc %d failed\n", b); return 1; }
        check(n, len[b] / 8, b, "realloc");
        blk[b] = n;
    }
    for (int b = 0; b < N; b++) free(blk[b]);
    void *a = NULL;
    if (posix_memalign(&a, 1 << 16, 4 << 20) || ((uintptr_t)a & 0xffff)) { printf("posix_memalign\n"); return 1; }
    fill(a, (4 << 20) / 8, 99); check(a, (4 << 20) / 8, 99, "aligned"); free(a);
    void *m = memalign(4096, 3 << 20), *v = valloc(2 << 20), *c = calloc(1 << 10, 2 << 10);
    if (!m || !v || !c || ((uintptr_t)m & 4095) || ((uintptr_t)v & 4095)) { printf("memalign/valloc\n"); return 1; }
    for (size_t i = 0; i < (2 << 20); i++) if (((char *)c)[i]) { printf("calloc not zero\n"); return 1; }
    free(m); free(v); free(c);
    /* Many small blocks too, freed in another order. */
    char **s = malloc(100000 * sizeof *s);
    for (int i = 0; i < 100000; i++) { s[i] = malloc(16 + i % 200); memset(s[i], i & 0xff, 16); }
    for (int i = 99999; i >= 0; i -= 2) free(s[i]);
    for (int i = 0; i < 100000; i += 2) { if (s[i][15] != (char)(i & 0xff)) { printf("small %d\n", i); return 1; } free(s[i]); }
    free(s);
#if defined(JEMALLOC) || defined(TCMALLOC) || defined(MIMALLOC)
    size_t big = 16 << 20;
#if defined(JEMALLOC)
    uint64_t *x = mallocx(big, MALLOCX_ALIGN(1 << 21));
#elif defined(TCMALLOC)
    uint64_t *x = tc_malloc(big);
#else
    uint64_t *x = mi_malloc(big);
#endif
    if (!x) { printf("own API alloc failed\n"); return 1; }
    fill(x, big / 8, 7); check(x, big / 8, 7, "own API");
    /* Its block through the standard entry points, and back. */
    if (malloc_usable_size(x) < big) { printf("usable size of own block\n"); return 1; }
#if defined(JEMALLOC)
    sdallocx(x, big, MALLOCX_ALIGN(1 << 21));
#elif defined(TCMALLOC)
    tc_free(x);
#else
    mi_free(x);
#endif
    void *y = malloc(5 << 20);
#if defined(JEMALLOC)
    dallocx(y, 0);
#elif defined(TCMALLOC)
    tc_free(y);
#else
    mi_free(y);
#endif
#endif
    printf("bigalloc ok\n");
    return 0;
}
