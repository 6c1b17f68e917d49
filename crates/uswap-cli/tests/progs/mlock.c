#define _GNU_SOURCE
/* Locked memory under uswap (issue 47 item 4): 96 MiB locked, written, read back.
 * Modes:
 *   mlock    malloc 96 MiB, mlock it, write, read back, VmLck printed; then munlock,
 *            fill a new 64 MiB block (room only the unlocked pages can give), write
 *            and read the 96 MiB again (swappable again, still exact)
 *   mlockall malloc 48 MiB, mlockall(MCL_CURRENT|MCL_FUTURE), malloc 48 MiB more
 *            (locked as MCL_FUTURE says), write, read back
 *   refused  malloc 96 MiB, mlock must fail (the caller refused it: RLIMIT_MEMLOCK
 *            without CAP_IPC_LOCK), then the same writes unlocked
 * Prints "ok <mode> mlock=<0|errno name> vmlck_kb=<n>" and exits 0 when every byte
 * read back is the one written. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MIB (1UL << 20)

static unsigned long vmlck_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmLck: %lu", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

static int fill_check(unsigned long *p, size_t n, unsigned long seed) {
    size_t w = n / sizeof *p;
    for (size_t i = 0; i < w; i++)
        p[i] = (i + seed) * 0x9e3779b97f4a7c15UL;
    for (size_t i = 0; i < w; i++)
        if (p[i] != (i + seed) * 0x9e3779b97f4a7c15UL) {
            printf("wrong word %zu\n", i);
            return 1;
        }
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "mlock";
    const char *res = "0";
    unsigned long kb;
    if (!strcmp(mode, "mlockall")) {
        unsigned long *a = malloc(48 * MIB);
        if (!a || fill_check(a, 48 * MIB, 1))
            return 1;
        if (mlockall(MCL_CURRENT | MCL_FUTURE)) {
            printf("mlockall: %s\n", strerror(errno));
            return 1;
        }
        unsigned long *b = malloc(48 * MIB);
        if (!b || fill_check(a, 48 * MIB, 2) || fill_check(b, 48 * MIB, 3))
            return 1;
        kb = vmlck_kb();
        if (fill_check(a, 48 * MIB, 4) || fill_check(b, 48 * MIB, 5))
            return 1;
        if (munlockall())
            return 1;
    } else {
        size_t n = 96 * MIB;
        unsigned long *p = malloc(n);
        if (!p)
            return 1;
        if (mlock(p, n)) {
            res = strerrorname_np(errno);
            if (strcmp(mode, "refused")) {
                printf("mlock: %s\n", strerror(errno));
                return 1;
            }
        } else if (!strcmp(mode, "refused")) {
            printf("mlock was not refused\n");
            return 1;
        }
        if (fill_check(p, n, 1) || fill_check(p, n, 2))
            return 1;
        kb = vmlck_kb();
        if (!strcmp(mode, "mlock")) {
            /* a new block's faults need room: only the unlocked pages can give it */
            unsigned long *q = malloc(64 * MIB);
            if (munlock(p, n) || !q || fill_check(q, 64 * MIB, 6) || fill_check(p, n, 3))
                return 1;
        }
        free(p);
    }
    printf("ok %s mlock=%s vmlck_kb=%lu\n", mode, res, kb);
    return 0;
}
