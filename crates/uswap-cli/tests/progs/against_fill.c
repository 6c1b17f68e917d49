/* For `uswap run --against`: malloc argv[1] MiB in 8 MiB blocks, write every word with a
 * pattern, read every word back; exit 1 on a wrong word. Prints the side it runs on
 * (USWAP_AGAINST_SIDE); exits 3 on the side named by AGAINST_FILL_FAIL_SIDE. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define BLOCK (8ul << 20)
static uint64_t val(size_t b, size_t j) { return (b * 0x9E3779B97F4A7C15ull) ^ (j * 2654435761u); }
int main(int argc, char **argv) {
    const char *side = getenv("USWAP_AGAINST_SIDE");
    const char *fail = getenv("AGAINST_FILL_FAIL_SIDE");
    printf("side=%s\n", side ? side : "(none)");
    fflush(stdout);
    if (side && fail && strcmp(side, fail) == 0) {
        fprintf(stderr, "against_fill: failing on purpose on the %s side\n", side);
        return 3;
    }
    size_t n = (argc > 1 ? strtoul(argv[1], 0, 10) : 96) * (1ul << 20) / BLOCK;
    uint64_t **b = calloc(n, sizeof *b);
    if (!b) return 2;
    for (size_t i = 0; i < n; i++) {
        b[i] = malloc(BLOCK);
        if (!b[i]) { perror("malloc"); return 2; }
        for (size_t j = 0; j < BLOCK / 8; j++) b[i][j] = val(i, j);
    }
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < BLOCK / 8; j++) bad += b[i][j] != val(i, j);
    printf("%s: %zu MiB written and read back, %zu wrong words\n", bad ? "BAD" : "ok",
           n * (BLOCK >> 20), bad);
    return bad ? 1 : 0;
}
