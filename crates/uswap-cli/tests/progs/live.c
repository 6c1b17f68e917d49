/* A program steered from its stdin (tests/live.rs): MiB of memory in one block,
 * filled and checked on command, so a test can read its counters from another
 * process between steps.
 *   fill SEED   fill every 8-byte word with a pattern of SEED, page and word; "filled"
 *   check SEED  check every word; "ok", or "bad N" with the number of wrong words
 *   quit        exit 0
 * "ready" once the block is allocated. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t word(uint64_t seed, uint64_t i) {
    uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull);
    return x ^ (x >> 31);
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 256;
    size_t n = (mib << 20) / 8;
    uint64_t *b = malloc(n * 8);
    if (!b) { perror("malloc"); return 1; }
    setvbuf(stdout, 0, _IOLBF, 0);
    printf("ready\n");
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        uint64_t seed = 0;
        if (sscanf(line, "fill %lu", &seed) == 1) {
            for (size_t i = 0; i < n; i++) b[i] = word(seed, i);
            printf("filled\n");
        } else if (sscanf(line, "check %lu", &seed) == 1) {
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) bad += b[i] != word(seed, i);
            if (bad) printf("bad %zu\n", bad); else printf("ok\n");
        } else if (strncmp(line, "quit", 4) == 0) {
            return 0;
        } else {
            printf("unknown command: %s", line);
        }
    }
    return 0;
}
