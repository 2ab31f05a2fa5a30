/* An interposer that over-counts by 1 MiB, to see the GPU validation fail
 * (bindings/python/tests/test_gpu_validation.py): preloaded before
 * libmemprobe_interpose.so (LD_PRELOAD="overcount.so libmemprobe_interpose.so",
 * which still counts every allocation), its in-process readings, current
 * bytes and a mark's peak, read 1 MiB more than were counted.
 *
 *   cc -shared -fPIC -o libovercount.so fake_interposer_overcount.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>

#define OVER (1ull << 20)

typedef unsigned long long (*current_fn)(int);
typedef unsigned long long (*take_fn)(int, int);

unsigned long long memprobe_interpose_current(int counter) {
    current_fn real;
    *(void **)&real = dlsym(RTLD_NEXT, "memprobe_interpose_current");
    return real ? real(counter) + OVER : OVER;
}

unsigned long long memprobe_interpose_mark_take(int slot, int counter) {
    take_fn real;
    *(void **)&real = dlsym(RTLD_NEXT, "memprobe_interpose_mark_take");
    return real ? real(slot, counter) + OVER : OVER;
}

/* The rest of what the validation reads, as the interposer answers it. */
int memprobe_interpose_mark_claim(void) {
    int (*real)(void);
    *(void **)&real = dlsym(RTLD_NEXT, "memprobe_interpose_mark_claim");
    return real ? real() : -1;
}

void memprobe_interpose_mark_release(int slot) {
    void (*real)(int);
    *(void **)&real = dlsym(RTLD_NEXT, "memprobe_interpose_mark_release");
    if (real) real(slot);
}
