/*
 * writebench: the per-call microbenchmark and truth workload. Writes COUNT blocks of SIZE bytes
 * (default 4096) to PATH with write(2), one call each, then closes it. With "dsync" the file is
 * opened O_DSYNC, so each call waits for the device (a latency long enough for strace -T to time).
 * With "region=BYTES" each block is a pwrite(2) at (i * SIZE) mod BYTES: the same pages again and again, so
 * page allocation does not hide the per-call cost (writebench-static is the same, linked statically).
 *   writebench PATH COUNT [SIZE] [dsync | region=BYTES]
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
    long region = 0;
    if (argc > 4 && strcmp(argv[4], "dsync") == 0) flags |= O_DSYNC;
    if (argc > 4 && strncmp(argv[4], "region=", 7) == 0) region = atol(argv[4] + 7);
    char *buf = calloc(1, size);
    int fd = open(argv[1], flags, 0644);
    if (buf == NULL || fd < 0) {
        fprintf(stderr, "writebench: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    for (long i = 0; i < count; i++) {
        ssize_t done = region > 0 ? pwrite(fd, buf, size, (off_t)((i * (long)size) % region))
                                  : write(fd, buf, size);
        if (done != (ssize_t)size) {
            fprintf(stderr, "writebench: short write: %s\n", strerror(errno));
            return 1;
        }
    }
    close(fd);
    free(buf);
    return 0;
}
