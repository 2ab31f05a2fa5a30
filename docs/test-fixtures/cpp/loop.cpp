// docs-test fixture: the names the README's C++ block takes from a libtorch
// training program — a data loader, a training step, an evaluation, and
// c10's cache release (a stand-in: libtorch is not installed here).
#include <vector>
#include "memprobe.hpp"
// docs-test: includes

namespace c10::cuda::CUDACachingAllocator {
inline void emptyCache() {}
}  // namespace c10::cuda::CUDACachingAllocator

static const int epochs = 2;
static std::vector<int> loader{1, 2, 3};
static void train(int) {}
static void evaluate() {}

int main() {
    // docs-test: block
    return 0;
}
