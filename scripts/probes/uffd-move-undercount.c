// Probe: does UFFDIO_MOVE on this kernel under-report the bytes it moved when an
// internal EAGAIN (a page under migration, compaction) precedes a batch? Run by
// scripts/probes/uffd-move-undercount.sh (root: it makes the kernel compact memory).
// Moves 512 pages back and forth N times; on an error it counts the pages that moved
// but were not counted (destination present, source empty) and goes on.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <linux/userfaultfd.h>
struct mv { uint64_t dst, src, len, mode; int64_t move; };
#define UFFDIO_MOVE_ _IOWR(UFFDIO, 0x05, struct mv)
#define N 512
#define PS 4096
static int pm;
static int present(uintptr_t a){ uint64_t e; pread(pm,&e,8,(a/PS)*8); return (e>>63)&1; }
static uint64_t pment(uintptr_t a){ uint64_t e; pread(pm,&e,8,(a/PS)*8); return e; }
int main(int argc,char**argv){
  long iters = argc>1? atol(argv[1]) : 2000;
  int uffd = syscall(SYS_userfaultfd, O_CLOEXEC|O_NONBLOCK);
  struct uffdio_api api = { .api = UFFD_API, .features = 1<<16 };
  if (ioctl(uffd, UFFDIO_API, &api)) { perror("api"); return 1; }
  size_t len = (size_t)N*PS;
  char *a = mmap(0, len*2+ (2<<20), PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
  a = (char*)(((uintptr_t)a + (2<<20)-1) & ~((uintptr_t)(2<<20)-1));
  char *b = a + len;
  madvise(a, len*2, MADV_NOHUGEPAGE);
  struct uffdio_register reg = { .range = { (uintptr_t)a, len*2 }, .mode = UFFDIO_REGISTER_MODE_MISSING };
  if (ioctl(uffd, UFFDIO_REGISTER, &reg)) { perror("reg"); return 1; }
  pm = open("/proc/self/pagemap", O_RDONLY);
  // fill a (MISSING-registered: use UFFDIO_ZEROPAGE? simpler: copy)
  char *tmp = malloc(PS);
  for (int i=0;i<N;i++){ memset(tmp, 0, PS); *(long*)tmp = i; struct uffdio_copy c={ (uintptr_t)a+i*PS,(uintptr_t)tmp,PS,0,0}; if(ioctl(uffd,UFFDIO_COPY,&c)){perror("copy");return 1;} }
  char *src=a,*dst=b; long under=0, eagain_partial=0, errs=0;
  for (long it=0; it<iters; it++){
    size_t done=0;
    while (done<len){
      struct mv m = { (uintptr_t)dst+done, (uintptr_t)src+done, len-done, 1 /*DONTWAKE*/, 0 };
      int r = ioctl(uffd, UFFDIO_MOVE_, &m);
      if (r==0){ done=len; break; }
      int e=errno;
      if (m.move>0) done += m.move;
      if (e==EAGAIN){ eagain_partial++; continue; }
      // error at done: inspect
      errs++;
      size_t k=done; int extra=0;
      while (k<len && present((uintptr_t)dst+k) && !present((uintptr_t)src+k) && (pment((uintptr_t)src+k)>>62)==0){ k+=PS; extra++; }
      fprintf(stderr,"iter %ld: errno %d (%s) at page %zu; %d more pages were moved but not counted\n", it, e, strerror(e), done/PS, extra);
      if (extra==0) return 2;
      under++; done = k;
    }
    // verify content
    for (int i=0;i<N;i++) if (*(long*)(dst+i*PS)!=i){ fprintf(stderr,"content mismatch page %d\n",i); return 3; }
    char*t=src;src=dst;dst=t;
  }
  printf("iterations %ld, errors %ld (under-reported moves %ld), partial EAGAIN %ld\n", iters, errs, under, eagain_partial);
  return 0;
}
