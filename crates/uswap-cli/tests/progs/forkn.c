/* forkn MIB N: the parent fills MIB MiB and forks N children at once; each checks the
 * parent's data, writes its own slice, checks again and leaves by _exit (as Redis'
 * BGSAVE child and pre-fork servers do); the parent checks its copy after each fork and
 * after they all end. Prints "forkn ok" when every byte matched everywhere. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static uint64_t pat(uint64_t i, uint64_t s) { return (i + 1) * 0x9E3779B97F4A7C15ull ^ (s << 56); }
static long check(uint64_t *p, size_t from, size_t to, uint64_t s) {
    for (size_t i = from; i < to; i++) if (p[i] != pat(i, s)) return (long)i; return -1; }
static void fill(uint64_t *p, size_t from, size_t to, uint64_t s) { for (size_t i = from; i < to; i++) p[i] = pat(i, s); }
int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 256, n = argc > 2 ? strtoul(argv[2], 0, 10) : 8;
    size_t words = mib << 17, part = words / n;
    uint64_t *p = malloc(words * 8);
    if (!p) { perror("malloc"); return 3; }
    fill(p, 0, words, 1);
    fflush(stdout);
    pid_t kids[64];
    for (size_t k = 0; k < n && k < 64; k++) {
        kids[k] = fork();
        if (kids[k] < 0) { perror("fork"); return 3; }
        if (kids[k] == 0) {
            long bad = check(p, 0, words, 1);
            if (bad >= 0) { printf("child %zu: pre-fork data wrong at word %ld\n", k, bad); fflush(stdout); _exit(1); }
            fill(p, k * part, (k + 1) * part, 10 + k);
            if (check(p, 0, k * part, 1) >= 0 || check(p, k * part, (k + 1) * part, 10 + k) >= 0 ||
                check(p, (k + 1) * part, words, 1) >= 0) { printf("child %zu: re-verify failed\n", k); fflush(stdout); _exit(1); }
            _exit(0);
        }
    }
    long bad = check(p, 0, words, 1);
    if (bad >= 0) { printf("parent: data wrong at word %ld\n", bad); return 1; }
    int failed = 0;
    for (size_t k = 0; k < n && k < 64; k++) {
        int st;
        if (waitpid(kids[k], &st, 0) != kids[k]) { perror("waitpid"); return 3; }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { printf("child %zu failed: status %#x\n", k, st); failed = 1; }
    }
    if (check(p, 0, words, 1) >= 0) { printf("parent: final verify failed\n"); return 1; }
    if (failed) return 1;
    free(p);
    printf("forkn ok\n");
    return 0;
}
