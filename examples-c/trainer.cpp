// A C++ "trainer" using memprobe's RAII layer (memprobe.hpp): scoped epochs
// and steps, a PeakMemMetric-style table on stdout, a ClearCacheHook-style
// cache-release policy, and the leak flag firing on a loop that leaks.
//
//   usage: trainer_cpp [epochs] [leak_mib_per_epoch]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "memprobe.hpp"

namespace {
constexpr std::size_t MIB = 1u << 20;

// A framework's allocator cache, in miniature: freed blocks are kept around
// until someone empties the cache.
std::vector<std::vector<char>> cache;

std::vector<char> touched(std::size_t bytes) {
    std::vector<char> v(bytes);
    for (std::size_t i = 0; i < bytes; i += 4096) v[i] = 1;
    return v;
}
}  // namespace

int main(int argc, char **argv) {
    const int epochs = argc > 1 ? std::atoi(argv[1]) : 5;
    const std::size_t leak = (argc > 2 ? static_cast<std::size_t>(std::atoi(argv[2])) : 8) * MIB;
    try {
        memprobe::Source rss = memprobe::Source::process();
        memprobe::Tracker tracker({rss});
        tracker.add_table_sink(memprobe::PhaseKind::Epoch, 1);
        tracker.add_release("empty_cache", false, [] {
            cache.clear();
            cache.shrink_to_fit();
            return true;
        });
        tracker.release_every(memprobe::PhaseKind::Epoch, 1);  // ClearCacheHook's default: every epoch
        tracker.set_leak_policy(MIB, 2);                     // > 1 MiB growth, 2 epochs in a row

        std::vector<std::vector<char>> leaked;  // the bug this run has
        for (int e = 0; e < epochs; ++e) {
            auto epoch = tracker.scope(memprobe::PhaseKind::Epoch);
            for (int s = 0; s < 4; ++s) {
                auto step = tracker.scope(memprobe::PhaseKind::Step);
                std::vector<char> activations = touched(32 * MIB);  // freed at the end of the step
                cache.push_back(touched(4 * MIB));                   // kept until the cache is emptied
            }
            leaked.push_back(touched(leak));
            std::fflush(stdout);
            memprobe::Tracker::Record r = epoch.end();
            std::printf("epoch %llu: peak %.1f MiB, releases %u, leak flag %s\n",
                        static_cast<unsigned long long>(r.phase.index), r.deltas[0].peak / double(MIB),
                        r.phase.n_releases, (r.phase.leak_flags & 1) ? "ON" : "off");
        }
        std::printf("releases fired: %llu; process flagged as leaking: %s\n",
                    static_cast<unsigned long long>(tracker.releases_fired()), tracker.leaking(0) ? "yes" : "no");
        return 0;
    } catch (const memprobe::Error &e) {
        std::fprintf(stderr, "trainer_cpp: %s: %s\n", e.status_name(), e.what());
        return 1;
    }
}
