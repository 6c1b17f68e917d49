/* fork + exec from a process with swapped-out uswap memory; the parent keeps its data. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#define SZ (96ul << 20)
int main(void) {
    uint64_t *p = malloc(SZ);
    if (!p) { perror("malloc"); return 3; }
    for (size_t i = 0; i < SZ / 8; i++) p[i] = i * 2654435761u;
    fflush(stdout);
    pid_t c = fork();
    if (c < 0) { perror("fork"); return 3; }
    if (c == 0) {
        execl("/bin/sh", "sh", "-c", "exit 3", (char *)NULL);
        _exit(127);
    }
    int st;
    if (waitpid(c, &st, 0) != c) { perror("waitpid"); return 3; }
    for (size_t i = 0; i < SZ / 8; i++)
        if (p[i] != i * 2654435761u) { printf("parent data wrong at word %zu\n", i); return 1; }
    free(p);
    printf("child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 0;
}
