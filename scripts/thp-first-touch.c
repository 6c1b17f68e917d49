// What first touch of a 2 MiB transparent huge page costs on this machine, the way the
// engine pays it (MADV_POPULATE_WRITE of one THP): memory the host must back again
// (fresh in this process; on a VM with free page reporting, freed memory goes back to
// the host), memory recycled inside the guest (after MADV_DONTNEED), and clearing a
// resident THP (memset). Medians and p90 over N units, in microseconds.
//
//   cc -O2 -o /tmp/thp-first-touch scripts/thp-first-touch.c && /tmp/thp-first-touch 1024
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define UNIT (2UL << 20)

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
static void report(const char *what, double *v, int n) {
  qsort(v, n, sizeof *v, cmp);
  printf("{\"case\": \"%s\", \"units\": %d, \"p50_us\": %.1f, \"p90_us\": %.1f}\n", what, n,
         v[n / 2], v[n * 9 / 10]);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 1024;
  if (n < 1) n = 1024;
  char *raw = mmap(NULL, (n + 1) * UNIT, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) { perror("mmap"); return 1; }
  char *b = (char *)(((uintptr_t)raw + UNIT - 1) & ~(UNIT - 1));
  if (madvise(b, n * UNIT, MADV_HUGEPAGE)) { perror("madvise(MADV_HUGEPAGE)"); return 1; }
  double *v = malloc(n * sizeof *v);
  for (int i = 0; i < n; i++) {
    double t = now_us();
    if (madvise(b + i * UNIT, UNIT, MADV_POPULATE_WRITE)) { perror("MADV_POPULATE_WRITE"); return 1; }
    v[i] = now_us() - t;
  }
  report("populate, fresh to this process", v, n);
  for (int i = 0; i < n; i++) {
    double t = now_us();
    memset(b + i * UNIT, 0, UNIT);
    v[i] = now_us() - t;
  }
  report("memset of a resident THP", v, n);
  for (int i = 0; i < n; i++) madvise(b + i * UNIT, UNIT, MADV_DONTNEED);
  for (int i = 0; i < n; i++) {
    double t = now_us();
    madvise(b + i * UNIT, UNIT, MADV_POPULATE_WRITE);
    v[i] = now_us() - t;
  }
  report("populate, recycled in the guest (after MADV_DONTNEED)", v, n);
  return 0;
}
