/*
 * writebench: the per-call microbenchmark and truth workload. Writes COUNT blocks of SIZE bytes
 * (default 4096) to PATH with write(2), one call each, then closes it. With "dsync" the file is
 * opened O_DSYNC, so each call waits for the device (a latency long enough for strace -T to time).
 *   writebench PATH COUNT [SIZE] [dsync]
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: writebench PATH COUNT [SIZE] [dsync]\n");
        return 64;
    }
    long count = atol(argv[2]);
    size_t size = argc > 3 ? (size_t)atol(argv[3]) : 4096;
    int flags = O_WRONLY | O_CREAT | O_TRUNC;
    if (argc > 4 && strcmp(argv[4], "dsync") == 0) flags |= O_DSYNC;
    char *buf = calloc(1, size);
    int fd = open(argv[1], flags, 0644);
    if (buf == NULL || fd < 0) {
        fprintf(stderr, "writebench: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    for (long i = 0; i < count; i++) {
        if (write(fd, buf, size) != (ssize_t)size) {
            fprintf(stderr, "writebench: short write: %s\n", strerror(errno));
            return 1;
        }
    }
    close(fd);
    free(buf);
    return 0;
}
