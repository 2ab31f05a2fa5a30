// memprobe_torch_attribution.hpp without torch or CUDA: histories in torch's
// snapshot shape, made by a small scripted caching allocator (Sim) that
// keeps, as c10 does, an exact `allocated` counter over whole blocks and
// its peak since a reset; the replay's table is checked against what Sim
// knows. Usage: test_torch_attribution OUT_DIR (the records written there
// are read again by tests/tests/torch_header.rs).
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "memprobe_torch_attribution.hpp"

#include "check.hpp"

namespace at = memprobe::torch::attribution;
using u64 = std::uint64_t;
constexpr u64 KIB = 1ull << 10, MIB = 1ull << 20, GIB = 1ull << 30;

/* A scripted caching allocator: one segment per stream (blocks bumped
 * from its start, never reused), the history as torch records it
 * (request sizes), the counters as c10 keeps them (block sizes). */
struct Sim {
    struct B {
        u64 bytes, requested;
        bool allocated, active;
        std::vector<at::Frame> frames;
    };
    struct Seg {
        u64 address, bytes, stream, next;
        std::map<u64, B> blocks;
    };
    std::vector<Seg> segs;
    std::vector<at::Event> events;
    std::int64_t clock = 1'000'000;
    u64 allocated = 0, active = 0, peak_allocated = 0, peak_active = 0;

    Seg &seg(u64 stream) {
        for (Seg &s : segs)
            if (s.stream == stream) return s;
        u64 base = 0x7f0000000000ull + segs.size() * 64 * GIB;
        segs.push_back(Seg{base, 8 * GIB, stream, base, {}});
        event(at::Action::SegmentAlloc, base, 8 * GIB, stream);
        return segs.back();
    }
    void event(at::Action a, u64 addr, u64 size, u64 stream, std::vector<at::Frame> f = {}) {
        events.push_back(at::Event{a, addr, size, stream, clock++, std::move(f)});
    }
    /* `block` is the block the allocator hands out (default: the request
     * rounded, as when it splits). */
    u64 alloc(u64 requested, u64 stream = 0, std::vector<at::Frame> f = {}, u64 block = 0) {
        if (!block) block = at::rounded(requested);
        Seg &s = seg(stream);
        u64 addr = s.next;
        s.next += block;
        s.blocks[addr] = B{block, requested, true, true, f};
        allocated += block;
        active += block;
        peak_allocated = std::max(peak_allocated, allocated);
        peak_active = std::max(peak_active, active);
        event(at::Action::Alloc, addr, requested, stream, std::move(f));
        return addr;
    }
    B &find(u64 addr, u64 *stream) {
        for (Seg &s : segs)
            if (s.blocks.count(addr)) {
                *stream = s.stream;
                return s.blocks[addr];
            }
        std::abort();
    }
    void free_requested(u64 addr) {
        u64 st;
        B &b = find(addr, &st);
        b.allocated = false;
        allocated -= b.bytes;
        event(at::Action::FreeRequested, addr, b.requested, st, b.frames);
    }
    void free_completed(u64 addr) {
        u64 st;
        B &b = find(addr, &st);
        b.active = false;
        active -= b.bytes;
        event(at::Action::FreeCompleted, addr, b.requested, st, b.frames);
    }
    void free(u64 addr) {
        free_requested(addr);
        free_completed(addr);
    }
    /* What a step boundary does: c10's resetPeakStats, and the step's start. */
    std::int64_t step_begin() {
        peak_allocated = allocated;
        peak_active = active;
        return clock++;
    }
    void oom(u64 requested, u64 free_bytes) { event(at::Action::Oom, free_bytes, requested, 0); }
    /* torch's snapshot: segments tiled by their blocks (a free block
     * between and after), and the last `max_entries` entries. */
    at::History history(std::size_t max_entries = 0, std::optional<std::int64_t> since = std::nullopt) const {
        at::History h;
        for (const Seg &s : segs) {
            at::Segment out{s.address, s.bytes, s.stream, {}};
            u64 at_addr = s.address;
            for (const auto &[addr, b] : s.blocks) {
                if (addr > at_addr) out.blocks.push_back(at::SnapshotBlock{addr - at_addr, 0, false, false, {}});
                out.blocks.push_back(at::SnapshotBlock{b.bytes, b.requested, b.allocated, b.active, b.frames});
                at_addr = addr + b.bytes;
            }
            if (at_addr < s.address + s.bytes)
                out.blocks.push_back(at::SnapshotBlock{s.address + s.bytes - at_addr, 0, false, false, {}});
            h.segments.push_back(out);
        }
        std::size_t from = max_entries && events.size() > max_entries ? events.size() - max_entries : 0;
        h.events.assign(events.begin() + static_cast<std::ptrdiff_t>(from), events.end());
        h.max_entries = max_entries;
        h.recording_since_us = since;
        return h;
    }
};

static std::vector<at::Frame> at_line(const char *file, int line, const char *fn) {
    return {at::Frame{"/usr/include/c10/core/Allocator.h", 91, "c10::Allocator::allocate"},
            at::Frame{file, line, fn}};
}

static u64 sum_of(const at::Table &t) {
    u64 s = 0;
    for (const at::Block &b : t.blocks) s += b.bytes;
    return s + t.rest_bytes().value_or(0);
}

static std::string slurp(const std::string &path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

/* A known peak inside a step, between a smaller start and end, with the
 * previous step's larger blocks freed before it. */
static void known_peak_inside_a_step() {
    Sim sim;
    u64 weights = sim.alloc(300 * MIB, 0, at_line("model.cpp", 10, "Model::Model"));
    u64 old = sim.alloc(2 * GIB, 0, at_line("train.cpp", 30, "previous_step"));
    sim.free(old);  // the previous step's peak was higher: not this step's
    std::int64_t start = sim.step_begin();
    u64 act = sim.alloc(100 * MIB + 3, 0, at_line("train.cpp", 40, "forward"));
    u64 big = sim.alloc(1 * GIB, 0, at_line("train.cpp", 42, "forward"));
    u64 small = sim.alloc(100, 0, {});  // frameless
    sim.free(big);
    sim.free(act);
    u64 after = sim.alloc(500 * MIB, 0, at_line("train.cpp", 50, "backward"));
    (void)after;
    (void)weights;
    (void)small;
    const u64 peak = sim.peak_allocated;
    CHECK(peak == 300 * MIB + at::rounded(100 * MIB + 3) + GIB + 512);

    at::Table t = at::replay_to_peak(sim.history(), start, peak);
    CHECK(t.complete);
    CHECK(t.reason.empty());
    CHECK(t.live_bytes == peak);
    CHECK(t.unplaced == std::optional<u64>(0));
    CHECK(sum_of(t) == peak);
    CHECK(t.blocks.size() == 4 && t.rest_blocks == 0);
    CHECK(t.blocks[0].bytes == GIB && t.blocks[0].address == big);
    // The user's frame first, torch's own after it.
    CHECK(t.blocks[0].frames.size() == 2 && t.blocks[0].frames[0].file == "train.cpp" &&
          t.blocks[0].frames[0].line == 42 && t.blocks[0].frames[1].function == "c10::Allocator::allocate");
    CHECK(t.blocks[1].bytes == 300 * MIB && t.blocks[1].exact);
    CHECK(t.blocks[2].bytes == at::rounded(100 * MIB + 3) && !t.blocks[2].exact && t.blocks[2].requested == 100 * MIB + 3);
    CHECK(t.blocks[3].bytes == 512 && t.blocks[3].frames.empty() && !t.blocks[3].module);
    CHECK(t.moment_us.has_value() && *t.moment_us > start);

    // Top 2: the rest holds the others, the sum stays exact.
    at::Table t2 = at::replay_to_peak(sim.history(), start, peak, at::Counter::Allocated, 2);
    CHECK(t2.blocks.size() == 2 && t2.rest_blocks == 2 && sum_of(t2) == peak);
    CHECK(t2.rest_block_bytes == at::rounded(100 * MIB + 3) + 512);

    // Without the step's start the replay reaches further back: the earlier
    // 2 GiB moment is the history's highest.
    at::Table whole = at::replay_to_peak(sim.history(), 0, std::nullopt);
    CHECK(whole.complete && whole.live_bytes == 300 * MIB + 2 * GIB);
    // That moment against this step's exact peak: refused, never guessed.
    at::Table wrong = at::replay_to_peak(sim.history(), 0, peak);
    CHECK(!wrong.complete && wrong.blocks.empty() && !wrong.rest_bytes() &&
          wrong.reason.find("above the exact peak") != std::string::npos);
}

/* A step in which nothing is allocated: its peak is what was live at its
 * start. */
static void a_step_without_allocations() {
    Sim sim;
    sim.alloc(64 * MIB, 0, at_line("a.cpp", 1, "f"));
    std::int64_t start = sim.step_begin();
    at::Table t = at::replay_to_peak(sim.history(), start, sim.peak_allocated);
    CHECK(t.complete && t.blocks.size() == 1 && sum_of(t) == 64 * MIB && t.moment_us == start);
}

/* Blocks on several streams keep their stream. */
static void streams() {
    Sim sim;
    std::int64_t start = sim.step_begin();
    u64 a = sim.alloc(8 * MIB, 0, at_line("s.cpp", 1, "on_default"));
    u64 b = sim.alloc(16 * MIB, 0x5555aaaa0000ull, at_line("s.cpp", 2, "on_side_stream"));
    u64 c = sim.alloc(4 * MIB, 0x5555bbbb0000ull, at_line("s.cpp", 3, "on_third"));
    sim.free(b);
    sim.free(c);
    sim.free(a);
    at::Table t = at::replay_to_peak(sim.history(), start, sim.peak_allocated);
    CHECK(t.complete && sum_of(t) == 28 * MIB && t.blocks.size() == 3);
    CHECK(t.blocks[0].stream == 0x5555aaaa0000ull && t.blocks[0].frames[0].line == 2);
    CHECK(t.blocks[1].stream == 0 && t.blocks[2].stream == 0x5555bbbb0000ull);
}

/* A block freed by its owner while another stream still uses it: torch's
 * allocated bytes drop at FREE_REQUESTED, its active bytes only at
 * FREE_COMPLETED. */
static void free_requested_vs_free_completed() {
    Sim sim;
    std::int64_t start = sim.step_begin();
    u64 x = sim.alloc(256 * MIB, 0, at_line("f.cpp", 1, "x"));
    sim.free_requested(x);  // recorded on another stream: not completed
    u64 y = sim.alloc(200 * MIB, 0, at_line("f.cpp", 2, "y"));
    sim.free_completed(x);
    sim.free(y);
    CHECK(sim.peak_allocated == 256 * MIB && sim.peak_active == 456 * MIB);
    at::Table alloc = at::replay_to_peak(sim.history(), start, sim.peak_allocated, at::Counter::Allocated);
    CHECK(alloc.complete && sum_of(alloc) == 256 * MIB && alloc.blocks.size() == 1 && alloc.blocks[0].address == x);
    at::Table act = at::replay_to_peak(sim.history(), start, sim.peak_active, at::Counter::Active);
    CHECK(act.complete && sum_of(act) == 456 * MIB && act.blocks.size() == 2);
    // A block freed but not completed at the snapshot: live for active only.
    Sim s2;
    std::int64_t st2 = s2.step_begin();
    u64 z = s2.alloc(32 * MIB, 0, {});
    s2.free_requested(z);
    at::Table a2 = at::replay_to_peak(s2.history(), st2, s2.peak_active, at::Counter::Active);
    CHECK(a2.complete && a2.live_bytes == 32 * MIB && a2.blocks.size() == 1 && a2.blocks[0].exact);
    at::Table n2 = at::replay_to_peak(s2.history(), st2, s2.peak_allocated, at::Counter::Allocated);
    CHECK(n2.complete && n2.live_bytes == 32 * MIB);  // the moment before the free
}

/* Segment entries move no allocated byte; snapshot segments with several
 * blocks give each block its address. */
static void segment_alloc_and_free() {
    Sim sim;
    std::int64_t start = sim.step_begin();
    u64 a = sim.alloc(2 * MIB, 0, at_line("g.cpp", 1, "a"));
    sim.event(at::Action::SegmentAlloc, 0x100000000ull, 20 * MIB, 0);
    u64 b = sim.alloc(6 * MIB, 0, at_line("g.cpp", 2, "b"));
    sim.event(at::Action::SegmentFree, 0x100000000ull, 20 * MIB, 0);
    sim.event(at::Action::SegmentMap, 0x200000000ull, 2 * MIB, 0);
    sim.event(at::Action::SegmentUnmap, 0x200000000ull, 2 * MIB, 0);
    sim.event(at::Action::Snapshot, 0, 0, 0);
    at::Table t = at::replay_to_peak(sim.history(), start, sim.peak_allocated);
    CHECK(t.complete && sum_of(t) == 8 * MIB && t.blocks.size() == 2);
    CHECK(t.blocks[0].address == b && t.blocks[1].address == a && t.blocks[0].exact && t.blocks[1].exact);
}

/* A ring buffer that dropped the start: reported, not guessed. One that
 * dropped only entries before the step: exact. */
static void lost_ring_buffer_start() {
    Sim sim;
    for (int i = 0; i < 50; i++) sim.free(sim.alloc(MIB, 0, {}));
    std::int64_t start = sim.step_begin();
    u64 big = sim.alloc(GIB, 0, at_line("r.cpp", 7, "big"));
    for (int i = 0; i < 10; i++) sim.free(sim.alloc(MIB, 0, {}));
    sim.free(big);
    const u64 peak = sim.peak_allocated;
    // 32 entries kept of the step's 32: every entry since the step began.
    at::Table kept = at::replay_to_peak(sim.history(40), start, peak);
    CHECK(kept.complete && kept.lost_entries && sum_of(kept) == peak && kept.blocks[0].address == big);
    // 20 kept: the step's first entries are gone.
    at::Table lost = at::replay_to_peak(sim.history(20), start, peak);
    CHECK(!lost.complete && lost.lost_entries && lost.blocks.empty() && !lost.rest_bytes() && lost.entries == 20);
    CHECK(lost.reason.find("ring buffer of 20 entries") != std::string::npos);
    // Not full: nothing was dropped.
    at::Table all = at::replay_to_peak(sim.history(1000), start, peak);
    CHECK(all.complete && !all.lost_entries);
    // History turned on after the step began.
    at::Table late = at::replay_to_peak(sim.history(1000, start + 5), start, peak);
    CHECK(!late.complete && late.reason.find("turned on after") != std::string::npos);
}

/* Entries that contradict the snapshot are refused. */
static void contradictions() {
    Sim sim;
    std::int64_t start = sim.step_begin();
    sim.alloc(MIB, 0, {});
    at::History h = sim.history();
    h.events.push_back(at::Event{at::Action::Alloc, 0x1234, MIB, 0, sim.clock++, {}});
    at::Table t = at::replay_to_peak(h, start, MIB);
    CHECK(!t.complete && t.reason.find("contradicts") != std::string::npos);
    at::History h2 = sim.history();
    h2.events.push_back(at::Event{at::Action::FreeRequested, h2.segments[0].address, MIB, 0, sim.clock++, {}});
    at::Table t2 = at::replay_to_peak(h2, start, MIB);
    CHECK(!t2.complete && t2.reason.find("contradicts") != std::string::npos);
}

/* A large block the allocator did not split (less than 1 MiB would have
 * remained): its size is known only while it lives; once freed, what the
 * history cannot place is `unplaced`, and the sum stays exact. */
static void unsplit_blocks() {
    Sim sim;
    std::int64_t start = sim.step_begin();
    u64 req = GIB + 1536 * KIB;
    u64 b = sim.alloc(req, 0, at_line("u.cpp", 3, "unsplit"), GIB + 2 * MIB);
    sim.free(b);
    const u64 peak = sim.peak_allocated;
    at::Table t = at::replay_to_peak(sim.history(), start, peak);
    CHECK(t.complete && t.unplaced == std::optional<u64>(512 * KIB) && sum_of(t) == peak);
    CHECK(t.blocks[0].bytes == at::rounded(req) && !t.blocks[0].exact);
    // More than the rounding allows: refused.
    at::Table off = at::replay_to_peak(sim.history(), start, peak + 2 * MIB);
    CHECK(!off.complete && off.reason.find("rounding allows") != std::string::npos);
    // Still live at the snapshot: the exact size, nothing unplaced.
    Sim s2;
    std::int64_t st2 = s2.step_begin();
    s2.alloc(req, 0, {}, GIB + 2 * MIB);
    at::Table t2 = at::replay_to_peak(s2.history(), st2, s2.peak_allocated);
    CHECK(t2.complete && t2.unplaced == std::optional<u64>(0) && t2.blocks[0].bytes == GIB + 2 * MIB);
}

/* The table at an OOM: live blocks at the failing request, the request,
 * segments with their allocated bytes. */
static void out_of_memory() {
    Sim sim;
    u64 a = sim.alloc(3 * GIB, 0, at_line("o.cpp", 5, "weights"));
    u64 b = sim.alloc(GIB, 0, at_line("o.cpp", 6, "acts"));
    sim.free(b);
    sim.oom(40 * GIB, 2 * GIB);
    at::Table t = at::at_oom(sim.history());
    CHECK(t.complete && t.requested == std::optional<u64>(40 * GIB) && t.blocks.size() == 1 && t.blocks[0].address == a);
    CHECK(t.segments.size() == 1 && t.segments[0].bytes == 8 * GIB && sum_of(t) == 3 * GIB);
    Sim none;
    none.alloc(MIB, 0, {});
    at::Table n = at::at_oom(none.history());
    CHECK(!n.complete && n.reason.find("no out-of-memory entry") != std::string::npos);
}

/* The record: its JSON (escapes, invalid UTF-8), its size bound and file. */
static void records(const std::string &out) {
    Sim sim;
    std::int64_t start = sim.step_begin();
    std::vector<at::Frame> odd = {at::Frame{"dir \"q\"\\x\n\x01\xff.cpp", 9, "f\xc3\xa9()"}};
    sim.alloc(5 * MIB, 0, odd);
    at::Table t = at::replay_to_peak(sim.history(), start, sim.peak_allocated);
    at::RecordInfo info;
    info.epoch = 2;
    info.step = 812;
    info.peak_bytes = sim.peak_allocated;
    std::string j = at::to_json(info, t);
    CHECK(j.find("\"schema\":\"memprobe.torch_attribution/1\"") != std::string::npos);
    CHECK(j.find("dir \\\"q\\\"\\\\x\\n\\u0001\xef\xbf\xbd.cpp") != std::string::npos);
    CHECK(j.find("f\xc3\xa9()") != std::string::npos);
    CHECK(j.find("\"truncated\":false}") != std::string::npos);
    at::write_record(out, "escapes.json", j);

    // 2,000 blocks with 40 long frames each: frames trimmed, then blocks
    // moved into rest, within 256 KiB, sums exact.
    Sim big;
    std::int64_t s2 = big.step_begin();
    std::vector<at::Frame> deep;
    for (int i = 0; i < 40; i++)
        deep.push_back(at::Frame{std::string(200, 'p') + ".cpp", i, std::string(100, 'f')});
    for (int i = 0; i < 2000; i++) big.alloc(MIB + static_cast<u64>(i) * 512, 0, deep);
    at::Table bt = at::replay_to_peak(big.history(), s2, big.peak_allocated, at::Counter::Allocated, 2000);
    CHECK(bt.complete && bt.blocks.size() == 2000);
    info.peak_bytes = big.peak_allocated;
    std::string bj = at::to_json(info, bt);
    CHECK(bj.size() <= at::MAX_RECORD_BYTES);
    CHECK(bj.find("\"truncated\":true}") != std::string::npos);
    at::write_record(out, "truncated.json", bj);
    std::string small = at::to_json(info, bt, 4096);
    CHECK(small.size() <= 4096 && small.find("\"blocks\":[]") == std::string::npos);
    at::write_record(out, "truncated-4k.json", small);

    // An OOM with 5,000 segments: they are dropped last, the record fits.
    big.oom(GIB, 0);
    at::Table many = at::at_oom(big.history(), at::Counter::Allocated, 3);
    for (int i = 0; i < 5000; i++) many.segments.push_back(at::Segment{static_cast<u64>(i) << 30, 2 * MIB, 0, {}});
    at::RecordInfo oi;
    oi.kind = "oom";
    std::string oj = at::to_json(oi, many);
    CHECK(oj.size() <= at::MAX_RECORD_BYTES && oj.find("\"truncated\":true}") != std::string::npos);
    CHECK(oj.find("\"requested_bytes\":1073741824") != std::string::npos);
    at::write_record(out, "oom-segments.json", oj);

    // An incomplete record: no blocks, rest.bytes null.
    at::Table lost = at::replay_to_peak(big.history(100), s2, big.peak_allocated);
    std::string lj = at::to_json(info, lost);
    CHECK(lj.find("\"blocks\":[],\"rest\":{\"bytes\":null,\"blocks\":null") != std::string::npos);
    CHECK(lj.find("\"reason\":") != std::string::npos && j.find("\"reason\":") == std::string::npos);
    at::write_record(out, "incomplete.json", lj);
    CHECK(at::summary_line(info, lost).find(": blocks unknown (torch's history (a ring buffer of 100 entries)") !=
          std::string::npos);
    at::RecordInfo ti;
    ti.epoch = 4;
    ti.step = 9;
    ti.peak_bytes = bt.live_bytes;
    const std::string line = at::summary_line(ti, bt);
    CHECK(line.rfind("memprobe: epoch 4 peak ", 0) == 0 && line.find(" at step 9: ") != std::string::npos);
    CHECK(line.find(" in 1997 blocks") != std::string::npos);

    // Unwritable: a clear error naming the path, no partial file left.
    bool threw = false;
    try {
        at::write_record("/proc/memprobe-no-such-dir", "x.json", "{}");
    } catch (const std::system_error &e) {
        threw = std::string(e.what()).find("/proc/memprobe-no-such-dir") != std::string::npos;
    }
    CHECK(threw);
}

/* The Attributor: a history taken only when a step sets a new peak for its
 * epoch; one file per epoch (replaced by a higher step), one per OOM;
 * MEMPROBE_ATTRIBUTION_DIR wins over the default. */
static void attributor(const std::string &out) {
    Sim sim;
    const std::string fallback = out + "/default";
    ::setenv("MEMPROBE_ATTRIBUTION_DIR", (out + "/run").c_str(), 1);
    ::setenv("RANK", "3", 1);
    at::Options o;
    o.dir = fallback;
    at::Attributor a(o, [&] { return sim.history(); });
    CHECK(a.dir() == out + "/run");
    const u64 spikes[3][4] = {{10, 30, 20, 30}, {5, 5, 50, 40}, {1, 2, 3, 4}};
    std::size_t written = 0;
    for (int e = 0; e < 3; e++)
        for (int s = 0; s < 4; s++) {
            std::int64_t start = sim.step_begin();
            u64 p = sim.alloc(spikes[e][s] * MIB, 0, at_line("loop.cpp", 100 + e * 10 + s, "step"));
            sim.free(p);
            auto path = a.step_ended(e, e * 4 + s, sim.peak_allocated, start);
            if (path) {
                written++;
                CHECK(*path == out + "/run/" + at::file_name("epoch", e, 3));
                CHECK(a.last() && a.last()->complete && sum_of(*a.last()) == sim.peak_allocated);
            }
        }
    // New epoch peaks: epoch 0 steps 0,1; epoch 1 steps 0,2; epoch 2 all 4.
    CHECK(written == 8 && a.snapshots() == 8);
    std::string e1 = slurp(out + "/run/epoch-1-rank-3.json");
    CHECK(e1.find("\"step\":6,") != std::string::npos && e1.find("\"line\":112") != std::string::npos);
    CHECK(e1.find("\"peak_bytes\":52428800") != std::string::npos);
    CHECK(a.last_line() == "memprobe: epoch 2 peak 4.0 MiB on cuda:0 at step 11: 4.0 MiB loop.cpp:123 step, "
                           "rest 0.0 MiB in 0 blocks");
    sim.oom(GIB, 0);
    CHECK(a.out_of_memory(2, 11) == out + "/run/oom-0-rank-3.json");
    // What an out-of-memory report takes (memprobe_oom_report_event.live_blocks_json).
    CHECK(a.last_json() == slurp(out + "/run/oom-0-rank-3.json"));
    CHECK(a.last_json().find("\"kind\":\"oom\"") != std::string::npos);
    CHECK(a.last_line() == "memprobe: out of memory asking 1024.0 MiB on cuda:0: rest 0.0 MiB in 0 blocks");
    CHECK(a.out_of_memory() == out + "/run/oom-1-rank-3.json");
    CHECK(a.snapshots() == 10);
    ::unsetenv("MEMPROBE_ATTRIBUTION_DIR");
    ::unsetenv("RANK");
    at::Attributor d(o, [&] { return sim.history(); });
    CHECK(d.dir() == fallback);
    std::int64_t start = sim.step_begin();
    CHECK(d.step_ended(0, 0, sim.peak_allocated, start) == fallback + "/epoch-0-rank-0.json");
}

static void user_frames_first() {
    std::vector<at::Frame> f = {{"a/c10/x.h", 1, "g"}, {"u.cpp", 2, "user"}, {"t.cpp", 3, "at::native::empty"},
                                {"v.cpp", 4, "user2"}};
    auto r = at::user_first(f);
    CHECK(r[0].function == "user" && r[1].function == "user2" && r[2].line == 1 && r[3].line == 3);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: test_torch_attribution OUT_DIR\n");
        return 2;
    }
    const std::string out = argv[1];
    known_peak_inside_a_step();
    a_step_without_allocations();
    streams();
    free_requested_vs_free_completed();
    segment_alloc_and_free();
    lost_ring_buffer_start();
    contradictions();
    unsplit_blocks();
    out_of_memory();
    records(out);
    attributor(out);
    user_frames_first();
    std::printf("test_torch_attribution: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
