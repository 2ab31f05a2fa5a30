/* Allocates, touches and frees `bytes`: a spike held for one munmap. */
#ifndef MEMPROBE_SPIKE_H
#define MEMPROBE_SPIKE_H
#include <stddef.h>
#include <sys/mman.h>

static void spike(size_t bytes) {
    char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    size_t i;
    if (p == MAP_FAILED) return;
    for (i = 0; i < bytes; i += 4096) ((volatile char *)p)[i] = 1;
    munmap(p, bytes);
}

#define MIB ((uint64_t)1 << 20)
/* The kernel counts RSS in per-CPU batches: readings may trail by ~hundreds of KiB. */
#define SLACK (2 * MIB)
#endif
