/* A 256 MiB region under a 64 MiB budget: fill it, checksum it twice, again under a
 * quarter of the budget (set while it runs), print counters.
 *
 *   cargo build --release -p uswap-capi
 *   cc -O2 -I crates/uswap-capi/include crates/uswap-capi/examples/fill.c \
 *      -L target/release -luswap -Wl,-rpath,$PWD/target/release -o fill
 *   ./fill [SIZE [BUDGET]]
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uswap.h"

static uint64_t word(uint64_t i) { return i * 0x9E3779B97F4A7C15ull ^ (i >> 7); }

static uint64_t checksum(const uint64_t *p, uint64_t n) {
    uint64_t s = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (p[i] != word(i)) {
            fprintf(stderr, "fill: mismatch at word %" PRIu64 "\n", i);
            exit(1);
        }
        s = s * 31 + p[i];
    }
    return s;
}

int main(int argc, char **argv) {
    uint64_t size = 256ull << 20, budget = 64ull << 20;
    if ((argc > 1 && uswap_parse_size(argv[1], &size) != 0) ||
        (argc > 2 && uswap_parse_size(argv[2], &budget) != 0)) {
        fprintf(stderr, "fill: %s\n", uswap_last_error());
        return 2;
    }
    uswap_pool *pool = uswap_pool_new(budget, NULL);
    if (!pool) {
        fprintf(stderr, "fill: uswap_pool_new: %s (errno %d: %s)\n", uswap_last_error(), errno,
                strerror(errno));
        return 1;
    }
    uswap_region *r = uswap_region_new(pool, size);
    if (!r) {
        fprintf(stderr, "fill: uswap_region_new: %s (errno %d)\n", uswap_last_error(), errno);
        return 1;
    }
    uint64_t *p = uswap_region_ptr(r), n = uswap_region_len(r) / 8;
    for (uint64_t i = 0; i < n; i++) p[i] = word(i);
    uint64_t a = checksum(p, n), b = checksum(p, n);
    uswap_counters c;
    uswap_pool_counters(pool, &c);
    printf("checksum %016" PRIx64 " %016" PRIx64 "\n", a, b);
    printf("pswpin %" PRIu64 " pswpout %" PRIu64 " majflt %" PRIu64 " peak_used_bytes %" PRIu64
           "\n",
           c.pswpin, c.pswpout, c.majflt, c.peak_used_bytes);
    /* A quarter of the budget while it runs: evicted down to it, the bytes the same. */
    if (uswap_pool_set_budget(pool, budget / 4) != 0) {
        fprintf(stderr, "fill: uswap_pool_set_budget: %s\n", uswap_last_error());
        return 1;
    }
    uint64_t d = checksum(p, n);
    uswap_pool_counters(pool, &c);
    uint64_t held = c.resident_bytes + c.cached_bytes + c.metadata_bytes;
    printf("quarter budget: checksum %016" PRIx64 " held %" PRIu64 "\n", d, held);
    /* Back to the start's; past it: EINVAL. */
    if (uswap_pool_set_budget(pool, budget) != 0) {
        fprintf(stderr, "fill: uswap_pool_set_budget back: %s\n", uswap_last_error());
        return 1;
    }
    if (uswap_pool_set_budget(pool, 2 * budget) != -1 || errno != EINVAL) {
        fprintf(stderr, "fill: a budget past the start's was not refused with EINVAL\n");
        return 1;
    }
    printf("double budget: %s\n", uswap_last_error());
    uswap_region_free(r);
    uswap_pool_free(pool);
    /* A bad budget: EINVAL. */
    if (uswap_pool_new(0, NULL) != NULL || errno != EINVAL) {
        fprintf(stderr, "fill: a zero budget was not refused with EINVAL\n");
        return 1;
    }
    printf("zero budget: %s\n", uswap_last_error());
    return a == b && d == a && held <= budget / 4 ? 0 : 1;
}
