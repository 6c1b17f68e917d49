/* mmap / munmap / mremap / madvise / mprotect / system calls on uswap memory. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#define MB (1ul << 20)
#define CHECK(c, ...) do { if (!(c)) { printf("FAIL line %d: ", __LINE__); printf(__VA_ARGS__); printf("\n"); exit(1); } } while (0)
static uint64_t pat(uint64_t i, uint64_t s) { return (i + 1) * 0x9E3779B97F4A7C15ull ^ s; }
static void fill(uint64_t *p, size_t from, size_t to, uint64_t s) { for (size_t i = from / 8; i < to / 8; i++) p[i] = pat(i, s); }
static int check(uint64_t *p, size_t from, size_t to, uint64_t s) { for (size_t i = from / 8; i < to / 8; i++) if (p[i] != pat(i, s)) return 0; return 1; }
static int zero(uint64_t *p, size_t from, size_t to) { for (size_t i = from / 8; i < to / 8; i++) if (p[i]) return 0; return 1; }
static sigjmp_buf jb;
static void segv(int sig) { (void)sig; siglongjmp(jb, 1); }
int main(void) {
    /* anonymous private mapping */
    uint64_t *p = mmap(NULL, 64 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "mmap");
    CHECK(zero(p, 0, 64 * MB), "fresh mapping not zero");
    fill(p, 0, 64 * MB, 1);
    CHECK(check(p, 0, 64 * MB, 1), "pattern");
    /* madvise DONTNEED: zeros; neighbours intact */
    CHECK(madvise((char *)p + 8 * MB, 4 * MB, MADV_DONTNEED) == 0, "madvise");
    CHECK(zero(p, 8 * MB, 12 * MB), "DONTNEED range not zero");
    CHECK(check(p, 0, 8 * MB, 1) && check(p, 12 * MB, 64 * MB, 1), "neighbours of DONTNEED");
    CHECK(madvise(p, 64 * MB, MADV_HUGEPAGE) == 0 && madvise(p, 64 * MB, MADV_WILLNEED) == 0, "hints");
    /* munmap tail, head */
    CHECK(munmap((char *)p + 48 * MB, 16 * MB) == 0, "munmap tail");
    CHECK(munmap(p, 8 * MB) == 0, "munmap head");
    CHECK(check(p, 12 * MB, 48 * MB, 1), "middle after munmaps");
    /* mremap grow (may move) and shrink */
    uint64_t *q = mmap(NULL, 8 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(q != MAP_FAILED, "mmap q");
    fill(q, 0, 8 * MB, 2);
    uint64_t *q2 = mremap(q, 8 * MB, 40 * MB, MREMAP_MAYMOVE);
    CHECK(q2 != MAP_FAILED, "mremap grow");
    CHECK(check(q2, 0, 8 * MB, 2), "contents after mremap grow");
    fill(q2, 8 * MB, 40 * MB, 3);
    CHECK(check(q2, 0, 8 * MB, 2) && check(q2, 8 * MB, 40 * MB, 3), "grown part");
    uint64_t *q3 = mremap(q2, 40 * MB, 4 * MB, 0);
    CHECK(q3 == q2, "mremap shrink moved");
    CHECK(check(q3, 0, 4 * MB, 2), "after shrink");
    /* private /dev/zero */
    int fd = open("/dev/zero", O_RDWR);
    CHECK(fd >= 0, "open /dev/zero");
    uint64_t *z = mmap(NULL, 32 * MB, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    CHECK(z != MAP_FAILED, "mmap /dev/zero");
    close(fd);
    CHECK(zero(z, 0, 32 * MB), "/dev/zero not zero");
    fill(z, 0, 32 * MB, 4);
    CHECK(check(z, 0, 32 * MB, 4) && check(p, 12 * MB, 48 * MB, 1), "/dev/zero pattern");
    /* system calls on the memory: write() from it, read() into it */
    int pf[2];
    CHECK(pipe(pf) == 0, "pipe");
    CHECK(write(pf[1], (char *)p + 20 * MB, 4096) == 4096, "write from region");
    CHECK(read(pf[0], (char *)z + 1 * MB, 4096) == 4096, "read into region");
    CHECK(memcmp((char *)p + 20 * MB, (char *)z + 1 * MB, 4096) == 0, "pipe copy");
    fill(z, 1 * MB, 1 * MB + 4096, 4);
    /* mprotect read-only: reads work, a write faults; back to read-write */
    CHECK(mprotect(q3, 4 * MB, PROT_READ) == 0, "mprotect");
    CHECK(check(q3, 0, 4 * MB, 2), "read-only read");
    signal(SIGSEGV, segv);
    volatile int faulted = 0;
    if (sigsetjmp(jb, 1) == 0) { ((volatile uint64_t *)q3)[5] = 1; } else { faulted = 1; }
    signal(SIGSEGV, SIG_DFL);
    CHECK(faulted, "write to read-only memory did not fault");
    CHECK(mprotect(q3, 4 * MB, PROT_READ | PROT_WRITE) == 0, "mprotect back");
    q3[5] = pat(5, 2);
    uint64_t sum = 0;
    for (size_t i = 12 * MB / 8; i < 48 * MB / 8; i++) sum = sum * 31 + p[i];
    for (size_t i = 0; i < 4 * MB / 8; i++) sum = sum * 31 + q3[i];
    for (size_t i = 0; i < 32 * MB / 8; i++) sum = sum * 31 + z[i];
    CHECK(munmap((char *)p + 8 * MB, 40 * MB) == 0 && munmap(q3, 4 * MB) == 0 && munmap(z, 32 * MB) == 0, "munmap rest");
    printf("maps ok %016llx\n", (unsigned long long)sum);
    return 0;
}
