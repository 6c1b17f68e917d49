/* Parent fills 192 MiB, forks; both verify the pre-fork data, write their own half, re-verify. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#define SZ (192ul << 20)
static uint64_t pat(uint64_t i, uint64_t s) { return (i + 1) * 0x9E3779B97F4A7C15ull ^ (s << 56); }
static long check(uint64_t *p, size_t from, size_t to, uint64_t s) {
    for (size_t i = from / 8; i < to / 8; i++) if (p[i] != pat(i, s)) return (long)i; return -1; }
static void fill(uint64_t *p, size_t from, size_t to, uint64_t s) { for (size_t i = from / 8; i < to / 8; i++) p[i] = pat(i, s); }
static uint64_t hwm(void) { FILE *f = fopen("/proc/self/status", "r"); char l[256]; uint64_t v = 0;
    while (fgets(l, sizeof l, f)) if (!strncmp(l, "VmHWM:", 6)) v = strtoull(l + 6, 0, 10); fclose(f); return v * 1024; }
int main(void) {
    uint64_t *p = malloc(SZ);
    if (!p) { perror("malloc"); return 3; }
    fill(p, 0, SZ, 1);
    fflush(stdout);
    pid_t c = fork();
    if (c < 0) { perror("fork"); return 3; }
    if (c == 0) {
        long bad = check(p, 0, SZ, 1);
        if (bad >= 0) { printf("child: pre-fork data wrong at word %ld (%#llx)\n", bad, (unsigned long long)p[bad]); _exit(1); }
        fill(p, 0, SZ / 2, 2);
        if (check(p, 0, SZ / 2, 2) >= 0 || check(p, SZ / 2, SZ, 1) >= 0) { printf("child: re-verify failed\n"); _exit(1); }
        printf("child ok hwm %llu\n", (unsigned long long)hwm());
        fflush(stdout);
        _exit(0);
    }
    long bad = check(p, 0, SZ, 1);
    if (bad >= 0) { printf("parent: pre-fork data wrong at word %ld\n", bad); return 1; }
    fill(p, SZ / 2, SZ, 3);
    if (check(p, 0, SZ / 2, 1) >= 0 || check(p, SZ / 2, SZ, 3) >= 0) { printf("parent: re-verify failed\n"); return 1; }
    int st;
    if (waitpid(c, &st, 0) != c) { perror("waitpid"); return 3; }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { printf("child failed: status %#x\n", st); return 1; }
    /* after the child is gone, the parent's data is still its own */
    if (check(p, 0, SZ / 2, 1) >= 0 || check(p, SZ / 2, SZ, 3) >= 0) { printf("parent: final verify failed\n"); return 1; }
    free(p);
    printf("fork ok hwm %llu\n", (unsigned long long)hwm());
    return 0;
}
