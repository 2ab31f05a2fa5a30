/*
 * next.c: a second interposer, preloaded after memprobe's, that wraps
 * getpid and finds the real one with dlsym(RTLD_NEXT) -- the way malloc
 * replacements and profilers find what they wrap. RTLD_NEXT is relative to
 * the caller: memprobe's dlsym must pass the lookup on as if this library
 * had called glibc itself, or this wrapper would find itself (and recurse).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((visibility("default"))) pid_t getpid(void) {
    static pid_t (*next)(void);
    if (!next) {
        next = (pid_t (*)(void))dlsym(RTLD_NEXT, "getpid");
    }
    if (!next || next == getpid) {
        return -1;
    }
    return next();
}

/* What the program checks: the real getpid was found. */
__attribute__((visibility("default"))) int next_found_real(void) {
    return getpid() == (pid_t)syscall(SYS_getpid);
}
