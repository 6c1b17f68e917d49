/* MADV_WIPEONFORK and MADV_DONTFORK on mmap'd memory, then fork: where the advice was
 * accepted, the child must read zeros (WIPEONFORK) or find no mapping (DONTFORK); where
 * it was refused, the program knows and keeps the parent's bytes. Prints one line each. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#define SZ (32ul << 20)
int main(void) {
    unsigned char *w = mmap(0, SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *d = mmap(0, SZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (w == MAP_FAILED || d == MAP_FAILED) { perror("mmap"); return 3; }
    memset(w, 0xab, SZ);
    memset(d, 0xcd, SZ);
    int wrc = madvise(w, SZ, MADV_WIPEONFORK), werr = errno;
    int drc = madvise(d, SZ, MADV_DONTFORK), derr = errno;
    if ((wrc && werr != EINVAL) || (drc && derr != EINVAL)) { perror("madvise"); return 3; }
    fflush(stdout);
    pid_t c = fork();
    if (c < 0) { perror("fork"); return 3; }
    if (c == 0) {
        unsigned char want = wrc == 0 ? 0 : 0xab;
        for (size_t i = 0; i < SZ; i += 4096)
            if (w[i] != want || w[i + 4095] != want) {
                printf("wipeonfork wrong: advice %s, byte %zu is %#x\n", wrc ? "refused" : "taken", i, w[i]);
                fflush(stdout);
                _exit(1);
            }
        unsigned char v;
        int mapped = mincore(d, 4096, &v) == 0;
        if (drc == 0 && mapped) { printf("dontfork wrong: advice taken, still mapped in the child\n"); fflush(stdout); _exit(1); }
        if (drc != 0 && (!mapped || d[0] != 0xcd || d[SZ - 1] != 0xcd)) { printf("dontfork wrong: advice refused, bytes lost\n"); fflush(stdout); _exit(1); }
        _exit(0);
    }
    int st;
    if (waitpid(c, &st, 0) != c) { perror("waitpid"); return 3; }
    if (!WIFEXITED(st) || WEXITSTATUS(st)) { printf("child failed\n"); return 1; }
    for (size_t i = 0; i < SZ; i += 4096)
        if (w[i] != 0xab || d[i] != 0xcd) { printf("parent lost its bytes at %zu\n", i); return 1; }
    printf("fork advice ok\n");
    return 0;
}
