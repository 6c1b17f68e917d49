/* uswap: out-of-core memory regions paged by userfaultfd to a swap file.
 *
 * Link with -luswap (libuswap.so or libuswap.a from `cargo build -p uswap-capi`;
 * the static library also needs -lpthread -ldl -lm).
 * Needs userfaultfd: run as root, or `sysctl vm.unprivileged_userfaultfd=1`.
 *
 * Errors: functions returning a pointer return NULL, functions returning int return
 * -1; both set errno:
 *   EPERM   userfaultfd not permitted for this process
 *   ENOSYS  the kernel's userfaultfd lacks a needed feature
 *   EINVAL  bad budget (zero, below the minimum, above RAM), bad size, NULL argument,
 *           a swap place in RAM (tmpfs, ramfs, a RAM disk), a swap size below 2 MiB
 *   ENOENT  no default swap place on a disk ($TMPDIR, /var/tmp, /tmp)
 *   ENOSPC  the swap file cannot back the region
 *   other   the errno of the failing system call (e.g. EACCES for the swap path)
 * and uswap_last_error() returns the message (thread-local, valid until the next
 * failure on the same thread).
 */
#ifndef USWAP_H
#define USWAP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct UswapPool uswap_pool;
typedef struct UswapRegion uswap_region;

/* Counters named like /proc/vmstat (pages are 4 KiB). */
typedef struct uswap_counters {
    uint64_t pswpin;              /* pages read from swap */
    uint64_t pswpout;             /* pages written to swap */
    uint64_t swap_ra;             /* pages read ahead */
    uint64_t swap_ra_hit;         /* faults that found a read-ahead page */
    uint64_t thp_swpout;          /* 2 MiB units written whole */
    uint64_t thp_swpout_fallback; /* 2 MiB units written as 4 KiB slots */
    uint64_t thp_swpin;           /* 2 MiB units read whole */
    uint64_t thp_swpin_fallback;  /* 2 MiB units read in pieces */
    uint64_t majflt;              /* faults that waited for a swap read */
    uint64_t minflt;              /* faults served without I/O */
    uint64_t swapcache_hit;       /* faults served from the swap cache */
    uint64_t wpflt;               /* write-protect faults */
    uint64_t stale_slot_freed;    /* slots freed because their copy went stale */
    uint64_t evicted;             /* pages moved out by reclaim */
    uint64_t io_errors;           /* backend I/O errors */
    uint64_t slots_used;          /* swap slots in use now */
    uint64_t resident_bytes;      /* region memory mapped now */
    uint64_t cached_bytes;        /* swap cache now */
    uint64_t metadata_bytes;      /* engine metadata counted against the budget */
    uint64_t peak_used_bytes;     /* highest resident + cached + metadata */
} uswap_counters;

/* A pool keeping at most `budget` bytes resident. swap_path: a directory, a new file or
 * a block device; NULL: an unlinked temporary file in $TMPDIR. */
uswap_pool *uswap_pool_new(uint64_t budget, const char *swap_path);
/* Release the pool handle (the engine stops once its regions are freed too). */
void uswap_pool_free(uswap_pool *pool);
int uswap_pool_counters(const uswap_pool *pool, uswap_counters *out);
/* Change the budget while the pool runs: growing, it may hold more at once; shrinking,
 * the limit drops now and the engine evicts down to it in the background (a fault
 * meanwhile waits for room; the regions' bytes are kept). From 8 MiB up to the budget
 * the pool started with. 0, or -1 with errno EINVAL (uswap_last_error()). */
int uswap_pool_set_budget(const uswap_pool *pool, uint64_t budget);

/* A zero-filled region of at least `size` bytes (rounded up to 2 MiB), any size
 * (larger than the budget is the point). */
uswap_region *uswap_region_new(uswap_pool *pool, uint64_t size);
void *uswap_region_ptr(const uswap_region *region);
/* Length in bytes; 0 (errno EINVAL) for NULL. */
uint64_t uswap_region_len(const uswap_region *region);
/* Throw away [offset, offset+len) (page aligned): reads as zeros afterwards. */
int uswap_region_discard(const uswap_region *region, uint64_t offset, uint64_t len);
int uswap_region_counters(const uswap_region *region, uswap_counters *out);
/* Unregister, unmap and free; the memory must not be used afterwards. */
void uswap_region_free(uswap_region *region);

/* Parse "256M", "2G", "4k", "1.5g" or plain bytes. */
int uswap_parse_size(const char *s, uint64_t *out);

/* Message of the last failure on this thread ("" if none). */
const char *uswap_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* USWAP_H */
