/* Four threads, each with its own 32 MiB block: pattern, verify, twice. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#define SZ (32ul<<20)
static int bad[4];
static void *run(void *a){ long t=(long)a; uint64_t *p=malloc(SZ); if(!p){bad[t]=2;return 0;}
  for(int pass=0;pass<2;pass++){ for(size_t j=0;j<SZ/8;j++) p[j]=j*7919+t*1000003+pass;
    for(size_t j=0;j<SZ/8;j++) if(p[j]!=j*7919+t*1000003+pass){bad[t]=1;break;} }
  free(p); return 0; }
int main(void){ pthread_t th[4]; for(long i=0;i<4;i++) pthread_create(&th[i],0,run,(void*)i);
  for(int i=0;i<4;i++) pthread_join(th[i],0);
  for(int i=0;i<4;i++) if(bad[i]){printf("thread %d failed %d\n",i,bad[i]);return 1;}
  printf("threads ok\n"); return 0; }
