/* Allocates, touches and frees `bytes`: a spike held for one munmap.
 * Returns 0 when the memory could not be mapped: a test must check it, or
 * a spike that never happened reads as a spike memprobe missed. */
#ifndef MEMPROBE_SPIKE_H
#define MEMPROBE_SPIKE_H
#include <stddef.h>
#include <sys/mman.h>

static int spike(size_t bytes) {
    char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    size_t i;
    if (p == MAP_FAILED) return 0;
    for (i = 0; i < bytes; i += 4096) ((volatile char *)p)[i] = 1;
    munmap(p, bytes);
    return 1;
}

#define MIB ((uint64_t)1 << 20)
/* The kernel counts RSS in per-CPU batches: readings may trail by ~hundreds of KiB. */
#define SLACK (2 * MIB)
#endif
