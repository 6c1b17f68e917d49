/* Randomized, model-checked stress of uswap memory through the calls a program makes
 * (run under `uswap run`): mmap, writes and reads, munmap of parts (head, tail, middle)
 * and of whole mappings, mremap grow (moving) and shrink, madvise(MADV_DONTNEED) of
 * ranges (sometimes written again at once), sequential reads through units, and fork
 * every 2 s at most (the child checks its copy and writes its own; the parent's copy
 * must stay its own). Every page's contents derive from (mapping, page, generation),
 * generation 0 being zeros, so each check is exact.
 *
 * usage: stress SECONDS SEED   (prints "stress ok ..." and exits 0, or reports the first
 * mismatch with the seed and the page's last operation and exits 1) */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096ul
#define WPP (PAGE / 8)
#define MAXMAP 8
#define MIB (1ul << 20)
#define MAXTOTAL (64 * MIB)

static uint64_t mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rng_state;
static uint64_t rnd(void) { return mix(rng_state += 0x9E3779B97F4A7C15ull); }
static size_t below(size_t n) { return n ? rnd() % n : 0; }

/* A mapping and its model. gen[p] == DEAD: the page was unmapped (never touched). */
#define DEAD UINT64_MAX
struct map {
    int live;
    uint64_t id;
    uint64_t *base;
    size_t pages;
    uint64_t *gen;
    char *last_op;      /* last operation on each page, for a report */
    uint64_t *last_seq; /* when */
    int holes;          /* some pages unmapped: no mremap on it */
};
static struct map maps[MAXMAP];
static uint64_t next_id = 1, next_gen = 1, seq, seed, forks;
static size_t total;
static int in_child;

static uint64_t word(uint64_t id, size_t page, uint64_t gen, size_t w) {
    return gen ? mix(mix(id * 0x9E3779B97F4A7C15ull ^ (uint64_t)page << 24 ^ gen) ^ w) : 0;
}

static void note(struct map *m, size_t p, char op) {
    m->last_op[p] = op;
    m->last_seq[p] = seq;
}

static void write_page(struct map *m, size_t p, uint64_t gen) {
    uint64_t *w = m->base + p * WPP;
    size_t from = below(4) == 0 ? below(WPP) : 0; /* first touch not always at word 0 */
    for (size_t k = 0; k < WPP; k++) {
        size_t i = (from + k) % WPP;
        w[i] = word(m->id, p, gen, i);
    }
    m->gen[p] = gen;
    note(m, p, 'w');
}

static void check_page(struct map *m, size_t p, const char *what) {
    if (m->gen[p] == DEAD) return;
    uint64_t *w = m->base + p * WPP;
    for (size_t i = 0; i < WPP; i++) {
        uint64_t want = word(m->id, p, m->gen[p], i);
        if (w[i] != want) {
            printf("%sMISMATCH (%s) seed %llu op %llu: mapping %llu (%zu pages at %p) page %zu "
                   "word %zu: found %#llx, want %#llx (generation %llu); the page's last "
                   "operation: '%c' at op %llu%s\n",
                   in_child ? "child: " : "", what, (unsigned long long)seed,
                   (unsigned long long)seq, (unsigned long long)m->id, m->pages, (void *)m->base,
                   p, i, (unsigned long long)w[i], (unsigned long long)want,
                   (unsigned long long)m->gen[p], m->last_op[p],
                   (unsigned long long)m->last_seq[p], w[i] == 0 ? " (zero: lost)" : "");
            fflush(stdout);
            _exit(1);
        }
    }
}

static void *xcalloc(size_t n, size_t s) {
    void *p = calloc(n, s);
    if (!p) { perror("calloc"); exit(3); }
    return p;
}

static void new_map(struct map *m) {
    size_t mib = 2 + below(31);
    if (total + mib * MIB > MAXTOTAL) return;
    void *p = mmap(NULL, mib * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(3); }
    m->live = 1;
    m->id = next_id++;
    m->base = p;
    m->pages = mib * MIB / PAGE;
    m->gen = xcalloc(m->pages, 8);
    m->last_op = xcalloc(m->pages, 1);
    m->last_seq = xcalloc(m->pages, 8);
    m->holes = 0;
    total += mib * MIB;
    for (size_t i = 0; i < m->pages; i++) m->last_op[i] = 'm';
}

static void free_model(struct map *m) {
    free(m->gen);
    free(m->last_op);
    free(m->last_seq);
    total -= m->pages * PAGE;
    m->live = 0;
}

static void drop_map(struct map *m) {
    for (size_t i = 0; i < 4; i++) { size_t p = below(m->pages); check_page(m, p, "before munmap"); }
    if (munmap(m->base, m->pages * PAGE)) { perror("munmap"); exit(3); }
    free_model(m);
}

/* A run of pages: one mostly, sometimes up to 64, sometimes a 2 MiB unit. */
static void run(struct map *m, size_t *a, size_t *n) {
    size_t r = below(16);
    *n = r < 10 ? 1 : r < 15 ? 1 + below(64) : 512;
    if (*n > m->pages) *n = m->pages;
    *a = *n == 512 ? below(m->pages / 512) * 512 : below(m->pages - *n + 1);
}

static void fork_and_check(void) {
    fflush(stdout);
    pid_t c = fork();
    if (c < 0) { perror("fork"); exit(3); }
    if (c == 0) {
        in_child = 1;
        alarm(60); /* a hang in the child fails the run */
        for (int k = 0; k < MAXMAP; k++) {
            struct map *m = &maps[k];
            if (!m->live) continue;
            for (int j = 0; j < 64; j++) check_page(m, below(m->pages), "child: pre-fork data");
            for (int j = 0; j < 32; j++) {
                size_t p = below(m->pages);
                if (m->gen[p] == DEAD) continue;
                write_page(m, p, (1ull << 62) | next_gen++);
                check_page(m, p, "child: its own write");
            }
        }
        _exit(0);
    }
    forks++;
    /* The parent goes on meanwhile; its checks see the child's writes if they leak. */
    for (int j = 0; j < 200; j++) {
        struct map *m = &maps[below(MAXMAP)];
        if (m->live) check_page(m, below(m->pages), "parent after fork");
    }
    int st;
    if (waitpid(c, &st, 0) != c) { perror("waitpid"); exit(3); }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        printf("child failed: status %#x (seed %llu op %llu)\n", st, (unsigned long long)seed,
               (unsigned long long)seq);
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: stress SECONDS SEED\n"); return 2; }
    double secs = atof(argv[1]);
    seed = strtoull(argv[2], 0, 10);
    rng_state = seed;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t counts[10] = {0};
    double last_fork = 0;
    for (int k = 0; k < 3; k++) new_map(&maps[k]);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        double now = (t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9;
        if (now > secs) break;
        seq++;
        struct map *m = &maps[below(MAXMAP)];
        if (!m->live) { new_map(m); continue; }
        size_t a, n, r = below(100);
        if (r < 30) { /* write */
            run(m, &a, &n);
            for (size_t p = a; p < a + n; p++) if (m->gen[p] != DEAD) write_page(m, p, next_gen++);
            counts[0]++;
        } else if (r < 60) { /* read */
            run(m, &a, &n);
            for (size_t p = a; p < a + n; p++) check_page(m, p, "read");
            counts[1]++;
        } else if (r < 70) { /* madvise(MADV_DONTNEED): zeros; sometimes written again at once */
            run(m, &a, &n);
            int hole = 0; /* the kernel refuses ranges with unmapped pages (ENOMEM) */
            for (size_t p = a; p < a + n; p++) hole |= m->gen[p] == DEAD;
            if (hole) continue;
            if (madvise(m->base + a * WPP, n * PAGE, MADV_DONTNEED)) { perror("madvise"); exit(3); }
            int again = below(2);
            for (size_t p = a; p < a + n; p++) {
                if (m->gen[p] == DEAD) continue;
                m->gen[p] = 0;
                note(m, p, 'd');
                if (again) write_page(m, p, next_gen++);
                else check_page(m, p, "after MADV_DONTNEED");
            }
            counts[2]++;
        } else if (r < 76) { /* munmap of a part: head, tail or middle */
            if (m->pages < 4) continue;
            n = 1 + below(m->pages / 4);
            size_t where = below(3);
            a = where == 0 ? 0 : where == 1 ? m->pages - n : below(m->pages - n);
            /* Only pages still ours: an unmapped range may be another mapping's now. */
            int gone = 0;
            for (size_t p = a; p < a + n; p++) gone |= m->gen[p] == DEAD;
            if (gone) continue;
            if (munmap(m->base + a * WPP, n * PAGE)) { perror("munmap part"); exit(3); }
            for (size_t p = a; p < a + n; p++) { m->gen[p] = DEAD; note(m, p, 'u'); }
            m->holes = 1;
            counts[3]++;
        } else if (r < 80) { /* munmap of the whole mapping (in pieces if it has holes) */
            if (m->holes) {
                /* Unmap what is left, page run by page run. */
                for (size_t p = 0; p < m->pages;) {
                    if (m->gen[p] == DEAD) { p++; continue; }
                    size_t q = p;
                    while (q < m->pages && m->gen[q] != DEAD) { check_page(m, q, "before munmap"); q++; }
                    if (munmap(m->base + p * WPP, (q - p) * PAGE)) { perror("munmap rest"); exit(3); }
                    p = q;
                }
                free_model(m);
            } else {
                drop_map(m);
            }
            counts[4]++;
        } else if (r < 86) { /* mremap grow (may move) */
            if (m->holes) continue;
            size_t grow = (1 + below(8)) * MIB / PAGE;
            if (total + grow * PAGE > MAXTOTAL) continue;
            size_t np = m->pages + grow;
            void *p = mremap(m->base, m->pages * PAGE, np * PAGE, MREMAP_MAYMOVE);
            if (p == MAP_FAILED) { perror("mremap grow"); exit(3); }
            m->base = p;
            m->gen = realloc(m->gen, np * 8);
            m->last_op = realloc(m->last_op, np);
            m->last_seq = realloc(m->last_seq, np * 8);
            if (!m->gen || !m->last_op || !m->last_seq) { perror("realloc"); exit(3); }
            for (size_t q = m->pages; q < np; q++) { m->gen[q] = 0; note(m, q, 'g'); }
            total += grow * PAGE;
            m->pages = np;
            for (int j = 0; j < 16; j++) check_page(m, below(np), "after mremap grow");
            counts[5]++;
        } else if (r < 90) { /* mremap shrink */
            if (m->holes || m->pages < 8) continue;
            size_t np = m->pages - 1 - below(m->pages / 2);
            void *p = mremap(m->base, m->pages * PAGE, np * PAGE, 0);
            if (p != m->base) { perror("mremap shrink"); exit(3); }
            total -= (m->pages - np) * PAGE;
            m->pages = np;
            for (int j = 0; j < 16; j++) check_page(m, below(np), "after mremap shrink");
            counts[6]++;
        } else if (r < 99) { /* a sequential read through a few units */
            n = 512 * (1 + below(3));
            if (n > m->pages) n = m->pages;
            a = below(m->pages - n + 1);
            for (size_t p = a; p < a + n; p++) check_page(m, p, "stream read");
            counts[7]++;
        } else if (now - last_fork >= 2.0) { /* a fork every 2 s at most */
            fork_and_check();
            last_fork = now;
        }
    }
    for (int k = 0; k < MAXMAP; k++) {
        if (!maps[k].live) continue;
        for (size_t p = 0; p < maps[k].pages; p++) check_page(&maps[k], p, "final check");
    }
    printf("stress ok: %llu ops (write %llu, read %llu, dontneed %llu, munmap-part %llu, "
           "munmap %llu, mremap-grow %llu, mremap-shrink %llu, stream %llu), %llu forks\n",
           (unsigned long long)seq, (unsigned long long)counts[0], (unsigned long long)counts[1],
           (unsigned long long)counts[2], (unsigned long long)counts[3],
           (unsigned long long)counts[4], (unsigned long long)counts[5],
           (unsigned long long)counts[6], (unsigned long long)counts[7],
           (unsigned long long)forks);
    return 0;
}
