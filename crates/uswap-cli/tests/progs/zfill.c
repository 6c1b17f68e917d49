/* 128 MiB of compressible pages (word 0 a stamp, the rest small repeating numbers),
 * written, then checked twice; prints a checksum. For uswap run --tier compressed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#define MB (1ul << 20)
#define WORDS (128 * MB / 8)
static uint64_t val(size_t j) {
    return (j % 512 == 0) ? j * 2654435761u : (uint64_t)((j / 512 + j % 512 % 13) & 0xff);
}
int main(void) {
    uint64_t *b = malloc(WORDS * 8);
    if (!b) { perror("malloc"); return 3; }
    for (size_t j = 0; j < WORDS; j++) b[j] = val(j);
    uint64_t sum = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t j = 0; j < WORDS; j++) {
            if (b[j] != val(j)) { printf("BAD word %zu\n", j); return 1; }
            if (pass == 0) sum = sum * 31 + b[j];
        }
    free(b);
    printf("checksum %016llx\n", (unsigned long long)sum);
    return 0;
}
