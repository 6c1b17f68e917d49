/* Sparse allocations: `sparse N SIZE DIR [TOUCH]` mallocs N blocks of SIZE bytes and
 * writes TOUCH bytes (default 1) at the start of each, with a value of its own; then
 * prints the free space of the filesystem holding DIR (statvfs f_bavail * f_frsize) as
 * "free=BYTES", reads every written byte back, frees the blocks and prints
 * "sparse ok". Exits 1 when a block cannot be allocated or a byte differs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: sparse N SIZE DIR [TOUCH]\n");
        return 2;
    }
    int n = atoi(argv[1]);
    size_t size = strtoull(argv[2], 0, 0), touch = argc > 4 ? strtoull(argv[4], 0, 0) : 1;
    unsigned char **b = calloc(n, sizeof *b);
    for (int i = 0; i < n; i++) {
        b[i] = malloc(size);
        if (!b[i]) {
            printf("malloc %d of %zu bytes failed\n", i, size);
            return 1;
        }
        for (size_t k = 0; k < touch; k++) b[i][k] = (unsigned char)(i * 31 + k + 1);
    }
    struct statvfs st;
    if (statvfs(argv[3], &st) != 0) {
        perror("statvfs");
        return 1;
    }
    printf("free=%llu\n", (unsigned long long)st.f_bavail * st.f_frsize);
    fflush(stdout);
    for (int i = 0; i < n; i++) {
        for (size_t k = 0; k < touch; k++)
            if (b[i][k] != (unsigned char)(i * 31 + k + 1)) {
                printf("block %d byte %zu differs\n", i, k);
                return 1;
            }
        free(b[i]);
    }
    printf("sparse ok\n");
    return 0;
}
