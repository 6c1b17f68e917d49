/* malloc / calloc / realloc / free of large blocks, with a checksum. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define NB 12
#define MB (1ul << 20)
static uint64_t val(size_t j, int i) { return j * 2654435761u + (uint64_t)i; }
int main(void) {
    uint64_t *b[NB];
    size_t sz[NB];
    for (int i = 0; i < NB; i++) {
        sz[i] = 16 * MB;
        b[i] = malloc(sz[i]);
        if (!b[i]) { perror("malloc"); return 3; }
        for (size_t j = 0; j < sz[i] / 8; j++) b[i][j] = val(j, i);
    }
    /* grow some (old contents kept), shrink one */
    for (int i = 0; i < NB; i += 4) {
        size_t n = 24 * MB;
        b[i] = realloc(b[i], n);
        if (!b[i]) { perror("realloc"); return 3; }
        for (size_t j = sz[i] / 8; j < n / 8; j++) b[i][j] = val(j, i);
        sz[i] = n;
    }
    b[1] = realloc(b[1], 8 * MB);
    sz[1] = 8 * MB;
    uint64_t sum = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < NB; i++)
            for (size_t j = 0; j < sz[i] / 8; j++) {
                if (b[i][j] != val(j, i)) { printf("BAD block %d word %zu\n", i, j); return 1; }
                if (pass == 0) sum = sum * 31 + b[i][j];
            }
    unsigned char *c = calloc(4 * MB, 1);
    for (size_t j = 0; j < 4 * MB; j++)
        if (c[j]) { printf("calloc memory not zero\n"); return 1; }
    free(c);
    /* a realloc down below the threshold keeps the first bytes */
    b[2] = realloc(b[2], 4096);
    for (size_t j = 0; j < 4096 / 8; j++)
        if (b[2][j] != val(j, 2)) { printf("BAD after small realloc\n"); return 1; }
    for (int i = 0; i < NB; i++) free(b[i]);
    printf("checksum %016llx\n", (unsigned long long)sum);
    return 0;
}
