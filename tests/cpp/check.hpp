// The C++ tests' CHECK: counts, never aborts; each test ends with
// "N passed, N failed". Include it after every other header: glog's CHECK
// comes with libtorch's unwinder headers (C++ stacks) and is replaced here.
#ifndef MEMPROBE_TESTS_CHECK_HPP
#define MEMPROBE_TESTS_CHECK_HPP
#include <cstdio>

static int passed = 0, failed = 0;
#undef CHECK
#define CHECK(c)                                                                       \
    do {                                                                               \
        if (c) {                                                                       \
            ++passed;                                                                  \
        } else {                                                                       \
            ++failed;                                                                  \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
        }                                                                              \
    } while (0)
#endif
