/*
 * memprobe_torch_attribution.hpp — which blocks of PyTorch's CUDA caching
 * allocator were live at a step's exact peak, from torch's own allocator
 * history, written as memprobe's torch attribution record
 * ("memprobe.torch_attribution/1", the same JSON the Python integrations
 * write). Header-only, C++17, no torch and no CUDA: memprobe_torch.hpp
 * feeds it torch's snapshot (recordHistory + snapshot); anything else
 * (a test, a tool reading a saved history) may feed it a History by hand.
 *
 * The replay walks back from the snapshot: the live blocks the snapshot's
 * segments hold, then every history entry since the step began undone, one
 * at a time, newest first. Each point in between is a moment of the step;
 * the first moment holding the most bytes is the step's peak, and what was
 * live then is the table. Nothing before the step's start is needed, so a
 * ring buffer that dropped old entries still gives an exact table as long
 * as it kept every entry since the step began; when it did not (or the
 * history was turned on during the step, or the entries contradict the
 * snapshot) the record says so and names no block: never a guess.
 *
 * Sizes: torch's history records each request's size; the allocator counts
 * whole blocks (requests rounded up to 512 bytes, and a large block not
 * split when less than 1 MiB would remain). A block still live at the
 * snapshot has its exact size from the snapshot; one freed since is its
 * request rounded to 512 bytes. What the step's exact peak holds beyond the
 * blocks so sized is kept apart as `rest.unplaced_bytes` (at most 1 MiB per
 * such large block, else the replay is refused as inconsistent), so that
 * blocks + rest equal the exact peak to the byte.
 */
#ifndef MEMPROBE_TORCH_ATTRIBUTION_HPP
#define MEMPROBE_TORCH_ATTRIBUTION_HPP

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unistd.h>

namespace memprobe::torch::attribution {

/** The record's schema string; readers check it. */
inline constexpr const char *SCHEMA = "memprobe.torch_attribution/1";
/** A record file's size limit: frames are trimmed, then blocks move to rest. */
inline constexpr std::size_t MAX_RECORD_BYTES = 256 * 1024;
/** The allocator's request rounding (kMinBlockSize). */
inline constexpr std::uint64_t BLOCK_ROUND = 512;
/** The most a large block may exceed its rounded request (kSmallSize: the
 *  allocator splits a cached block only when more than this would remain). */
inline constexpr std::uint64_t UNSPLIT_MAX = 1 << 20;

/** One frame of the stack that allocated a block. */
struct Frame {
    std::string file;
    std::int64_t line = 0;
    std::string function;
};

/** torch's TraceEntry actions, in torch's order. */
enum class Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
};

/** One history entry (torch's TraceEntry): for Oom, `address` is the free
 *  bytes CUDA reported and `size` the failing request. */
struct Event {
    Action action = Action::Alloc;
    std::uint64_t address = 0;
    std::uint64_t size = 0;
    std::uint64_t stream = 0;
    std::int64_t time_us = 0; /**< Unix time, microseconds (torch's time_us) */
    std::vector<Frame> frames;
};

/** One block of a segment at the snapshot (torch's BlockInfo). */
struct SnapshotBlock {
    std::uint64_t bytes = 0;     /**< the block's size */
    std::uint64_t requested = 0; /**< what was asked for */
    bool allocated = false;      /**< not yet freed by its owner */
    bool active = false;         /**< allocated, or freed but still in use by a stream */
    std::vector<Frame> frames;
};

/** One segment (one cudaMalloc or expandable range) at the snapshot. */
struct Segment {
    std::uint64_t address = 0;
    std::uint64_t bytes = 0;
    std::uint64_t stream = 0;
    std::vector<SnapshotBlock> blocks; /**< in address order, tiling the segment */
};

/** What torch's snapshot gives for one device. */
struct History {
    std::vector<Segment> segments;
    std::vector<Event> events;    /**< oldest first */
    std::size_t max_entries = 0;  /**< the ring buffer's size (0: unbounded) */
    /** When recording began (Unix µs), if known: a step that began before
     *  it cannot be replayed. */
    std::optional<std::int64_t> recording_since_us;
};

/** Which counter the replay follows. torch's `allocated` bytes (what
 *  max_memory_allocated reports) drop when the owner frees a block
 *  (FREE_REQUESTED); its `active` bytes only when the allocator has
 *  finished with it (FREE_COMPLETED, later when another stream used it). */
enum class Counter { Allocated, Active };

/** One live block in a table. */
struct Block {
    std::uint64_t bytes = 0;
    std::uint64_t requested = 0;
    std::uint64_t stream = 0;
    std::uint64_t address = 0;
    bool exact = false; /**< size from the snapshot, not a rounded request */
    std::vector<Frame> frames;
    std::optional<std::string> module;
};

/** What was live at one moment, biggest first, and what the history says
 *  about its own completeness. */
struct Table {
    bool complete = false;
    std::string reason;        /**< why not complete; empty when complete */
    std::size_t entries = 0;   /**< history entries held */
    bool lost_entries = false; /**< the ring buffer was full: older entries dropped */
    std::vector<Block> blocks; /**< the top blocks */
    std::size_t rest_blocks = 0;
    std::uint64_t rest_block_bytes = 0;       /**< the other live blocks' bytes */
    std::optional<std::uint64_t> unplaced;    /**< exact peak − the blocks' sizes */
    std::uint64_t live_bytes = 0;             /**< every live block's bytes */
    std::optional<std::int64_t> moment_us;    /**< when the moment was (Unix µs) */
    std::optional<std::uint64_t> requested;   /**< an OOM's failing request */
    std::vector<Segment> segments;            /**< an OOM's segments */
    /** rest.bytes: the other blocks plus what no block holds (null when
     *  incomplete). */
    std::optional<std::uint64_t> rest_bytes() const {
        if (!complete) return std::nullopt;
        return rest_block_bytes + unplaced.value_or(0);
    }
};

/** The allocator's rounding of a request (torch's round_size without
 *  roundup_power2_divisions). */
inline std::uint64_t rounded(std::uint64_t requested) {
    if (requested < BLOCK_ROUND) return BLOCK_ROUND;
    return (requested + BLOCK_ROUND - 1) / BLOCK_ROUND * BLOCK_ROUND;
}

/** Whether a frame is torch's own (c10, ATen, torch, the standard library):
 *  the user's frames are listed first. */
inline bool is_torch_frame(const Frame &f) {
    static const char *const prefixes[] = {"c10::", "at::", "torch::", "std::", "__"};
    for (const char *p : prefixes)
        if (f.function.rfind(p, 0) == 0) return true;
    static const char *const parts[] = {"/torch/", "/c10/", "/aten/", "libtorch", "libc10"};
    for (const char *p : parts)
        if (f.file.find(p) != std::string::npos) return true;
    return false;
}

/** The frames, the user's first, each group in its original order. */
inline std::vector<Frame> user_first(std::vector<Frame> frames) {
    std::stable_partition(frames.begin(), frames.end(), [](const Frame &f) { return !is_torch_frame(f); });
    return frames;
}

namespace detail {

/* A live block during the replay; its frames stay where the history keeps
 * them (copied only for the blocks a table names). */
struct Live {
    std::uint64_t bytes = 0;
    std::uint64_t requested = 0;
    std::uint64_t stream = 0;
    bool exact = false;
    const std::vector<Frame> *frames = nullptr;
};
using State = std::unordered_map<std::uint64_t, Live>;

/** The live blocks at the snapshot, by address. */
inline State snapshot_state(const History &h, Counter c, std::uint64_t &sum) {
    State s;
    sum = 0;
    for (const Segment &seg : h.segments) {
        std::uint64_t at = seg.address;
        for (const SnapshotBlock &b : seg.blocks) {
            if (c == Counter::Allocated ? b.allocated : b.active) {
                s[at] = Live{b.bytes, b.requested, seg.stream, true, &b.frames};
                sum += b.bytes;
            }
            at += b.bytes;
        }
    }
    return s;
}

/** The entry that ends a block's life for this counter. */
inline bool is_free(Action a, Counter c) {
    return c == Counter::Allocated ? a == Action::FreeRequested : a == Action::FreeCompleted;
}

/** Undoes event `e` on `s` (the state after it becomes the state before
 *  it). False, with `why`, when the entry contradicts the state. */
inline bool undo(State &s, std::uint64_t &sum, const Event &e, Counter c, std::string &why) {
    if (e.action == Action::Alloc) {
        auto it = s.find(e.address);
        if (it == s.end()) {
            why = "an allocation at " + std::to_string(e.address) + " that the later state does not hold";
            return false;
        }
        sum -= it->second.bytes;
        s.erase(it);
    } else if (is_free(e.action, c)) {
        if (s.count(e.address)) {
            why = "a free at " + std::to_string(e.address) + " while a later block lives there";
            return false;
        }
        s[e.address] = Live{rounded(e.size), e.size, e.stream, false, &e.frames};
        sum += rounded(e.size);
    }
    return true;
}

}  // namespace detail

/** How complete the history is for a moment starting at `since_us`. */
inline bool covers(const History &h, std::int64_t since_us, std::string &why, bool &lost) {
    lost = h.max_entries > 0 && h.events.size() >= h.max_entries;
    if (h.recording_since_us && *h.recording_since_us > since_us) {
        why = "torch's history was turned on after the step began";
        return false;
    }
    if (lost && (h.events.empty() || h.events.front().time_us > since_us)) {
        why = "torch's history (a ring buffer of " + std::to_string(h.max_entries) +
              " entries) dropped entries made during the step: raise max_entries";
        return false;
    }
    return true;
}

namespace detail {

/** The state at point `point` (after entry point-1; point == n is the
 *  snapshot), reached by undoing entries from the newest; its sum in `sum`.
 *  False, with `why`, when an entry contradicts the state. */
inline bool state_at(const History &h, std::size_t point, Counter c, State &s, std::uint64_t &sum,
                     std::string &why) {
    s = snapshot_state(h, c, sum);
    for (std::size_t k = h.events.size(); k > point; k--)
        if (!undo(s, sum, h.events[k - 1], c, why)) return false;
    return true;
}

/** The table of the live blocks of `s`, biggest first, the top named, each
 *  with the frames of its own allocation where the history still has it
 *  (the latest entry at its address before `point`). */
inline void fill(Table &t, const History &h, std::size_t point, State &s, std::uint64_t sum, std::size_t top) {
    std::unordered_map<std::uint64_t, bool> seen;
    std::size_t found = 0;
    for (std::size_t k = point; k > 0 && found < s.size(); k--) {
        const Event &e = h.events[k - 1];
        if (e.action != Action::Alloc || !seen.emplace(e.address, true).second) continue;
        auto it = s.find(e.address);
        if (it == s.end()) continue;
        found++;
        if (!e.frames.empty()) it->second.frames = &e.frames;
    }
    std::vector<std::pair<std::uint64_t, const Live *>> live;
    live.reserve(s.size());
    for (const auto &kv : s) live.emplace_back(kv.first, &kv.second);
    std::sort(live.begin(), live.end(), [](const auto &a, const auto &b) {
        return a.second->bytes != b.second->bytes ? a.second->bytes > b.second->bytes : a.first < b.first;
    });
    t.live_bytes = sum;
    for (std::size_t i = 0; i < live.size(); i++) {
        const Live &l = *live[i].second;
        if (i < top) {
            t.blocks.push_back(Block{l.bytes, l.requested, l.stream, live[i].first, l.exact,
                                     l.frames ? user_first(*l.frames) : std::vector<Frame>{}, {}});
        } else {
            t.rest_blocks++;
            t.rest_block_bytes += l.bytes;
        }
    }
}

/** What the allocator's rounding may add above the replayed sizes: up to
 *  UNSPLIT_MAX for each large block whose size is a rounded request. */
inline std::uint64_t slack(const State &s) {
    std::uint64_t v = 0;
    for (const auto &kv : s)
        if (!kv.second.exact && kv.second.bytes > UNSPLIT_MAX) v += UNSPLIT_MAX;
    return v;
}

}  // namespace detail

/** The table of live blocks at a moment: the first moment, at or after
 *  `since_us`, holding the most bytes of `counter` (a step's peak). With
 *  `exact_peak` (memprobe's exact peak of the step), the blocks' sizes are
 *  checked against it and what no block holds is `unplaced`. */
inline Table replay_to_peak(const History &h, std::int64_t since_us, std::optional<std::uint64_t> exact_peak,
                            Counter counter = Counter::Allocated, std::size_t top = 10) {
    Table t;
    t.entries = h.events.size();
    if (!covers(h, since_us, t.reason, t.lost_entries)) return t;
    const std::size_t n = h.events.size();
    std::size_t first = n;  // the first entry made since `since_us`
    while (first > 0 && h.events[first - 1].time_us >= since_us) first--;

    // The sum at every point since, newest first: point k is the state
    // after entry k-1 (k == first: the interval's start). The earliest point
    // with the highest sum is the peak.
    std::uint64_t sum = 0;
    detail::State s = detail::snapshot_state(h, counter, sum);
    std::uint64_t best = sum;
    std::size_t point = n;
    for (std::size_t k = n; k > first; k--) {
        if (!detail::undo(s, sum, h.events[k - 1], counter, t.reason)) {
            t.reason = "torch's history contradicts its snapshot: " + t.reason;
            return t;
        }
        if (sum >= best) {
            best = sum;
            point = k - 1;
        }
    }
    detail::state_at(h, point, counter, s, sum, t.reason);
    t.moment_us = point > first ? h.events[point - 1].time_us : since_us;
    if (exact_peak) {
        const std::uint64_t allowed = detail::slack(s);
        if (sum > *exact_peak) {
            t.reason = "the replayed peak (" + std::to_string(sum) + " B) is above the exact peak (" +
                       std::to_string(*exact_peak) + " B): the history and the step do not match";
            return t;
        }
        if (*exact_peak - sum > allowed) {
            t.reason = "the exact peak (" + std::to_string(*exact_peak) + " B) is " +
                       std::to_string(*exact_peak - sum) +
                       " B above the replayed blocks, more than the allocator's rounding allows (" +
                       std::to_string(allowed) + " B): the history and the step do not match";
            return t;
        }
        t.unplaced = *exact_peak - sum;
    }
    t.complete = true;
    detail::fill(t, h, point, s, sum, top);
    return t;
}

/** The table at an out-of-memory error: what was live when the last OOM
 *  entry of the history was made, its failing request, and every segment
 *  (reserved − allocated per segment is the fragmentation). */
inline Table at_oom(const History &h, Counter counter = Counter::Allocated, std::size_t top = 10) {
    Table t;
    t.entries = h.events.size();
    t.lost_entries = h.max_entries > 0 && h.events.size() >= h.max_entries;
    t.segments = h.segments;
    std::size_t point = h.events.size();
    while (point > 0 && h.events[point - 1].action != Action::Oom) point--;
    if (point == 0) {
        t.reason = "torch's history holds no out-of-memory entry";
        return t;
    }
    t.requested = h.events[point - 1].size;
    t.moment_us = h.events[point - 1].time_us;
    detail::State s;
    std::uint64_t sum = 0;
    if (!detail::state_at(h, point, counter, s, sum, t.reason)) {
        t.reason = "torch's history contradicts its snapshot: " + t.reason;
        return t;
    }
    t.complete = true;
    detail::fill(t, h, point, s, sum, top);
    return t;
}

/** What a record says about itself, beside its table. */
struct RecordInfo {
    std::string kind = "epoch_peak"; /**< "epoch_peak" or "oom" */
    int rank = 0;
    std::optional<std::int64_t> epoch;
    std::optional<std::int64_t> step;
    std::string stage = "train";
    int device = 0;
    std::optional<std::uint64_t> peak_bytes;
    double cost_ms = 0;
};

namespace detail {

/** A JSON string: escapes, and bytes that are not UTF-8 as U+FFFD. */
inline void json_string(std::string &out, const std::string &s) {
    out += '"';
    for (std::size_t i = 0; i < s.size();) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += static_cast<char>(c);
            i++;
        } else if (c == '\n' || c == '\t' || c == '\r') {
            out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : "\\r";
            i++;
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
            i++;
        } else if (c < 0x80) {
            out += static_cast<char>(c);
            i++;
        } else {
            std::size_t len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
            bool ok = len > 0 && i + len <= s.size();
            for (std::size_t k = 1; ok && k < len; k++) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
            if (ok) {
                out.append(s, i, len);
                i += len;
            } else {
                out += "\xef\xbf\xbd";
                i++;
            }
        }
    }
    out += '"';
}

template <class T> void json_opt(std::string &out, const std::optional<T> &v) {
    out += v ? std::to_string(*v) : "null";
}

inline std::string render(const RecordInfo &info, const Table &t, std::size_t frames_cap, std::size_t n_blocks,
                          std::size_t n_segments = static_cast<std::size_t>(-1)) {
    std::string o = "{\"schema\":";
    json_string(o, SCHEMA);
    o += ",\"kind\":";
    json_string(o, info.kind);
    o += ",\"rank\":" + std::to_string(info.rank) + ",\"epoch\":";
    json_opt(o, info.epoch);
    o += ",\"step\":";
    json_opt(o, info.step);
    o += ",\"stage\":";
    json_string(o, info.stage);
    o += ",\"device\":" + std::to_string(info.device) + ",\"peak_bytes\":";
    json_opt(o, info.peak_bytes);
    o += ",\"requested_bytes\":";
    json_opt(o, t.requested);
    o += ",\"blocks\":[";
    std::uint64_t moved_bytes = 0;
    std::size_t shown = std::min(n_blocks, t.complete ? t.blocks.size() : 0);
    for (std::size_t i = shown; i < (t.complete ? t.blocks.size() : 0); i++) moved_bytes += t.blocks[i].bytes;
    for (std::size_t i = 0; i < shown; i++) {
        const Block &b = t.blocks[i];
        if (i) o += ',';
        o += "{\"bytes\":" + std::to_string(b.bytes) + ",\"stream\":" + std::to_string(b.stream) +
             ",\"address\":" + std::to_string(b.address) + ",\"frames\":[";
        for (std::size_t f = 0; f < std::min(frames_cap, b.frames.size()); f++) {
            if (f) o += ',';
            o += "{\"file\":";
            json_string(o, b.frames[f].file);
            o += ",\"line\":" + std::to_string(b.frames[f].line) + ",\"function\":";
            json_string(o, b.frames[f].function);
            o += '}';
        }
        o += "],\"module\":";
        if (b.module)
            json_string(o, *b.module);
        else
            o += "null";
        o += '}';
    }
    o += "],\"rest\":{\"bytes\":";
    std::optional<std::uint64_t> rest = t.rest_bytes();
    if (rest) rest = *rest + moved_bytes;
    json_opt(o, rest);
    o += ",\"blocks\":";
    o += t.complete ? std::to_string(t.rest_blocks + (t.blocks.size() - shown)) : "null";
    o += ",\"unplaced_bytes\":";
    json_opt(o, t.complete ? t.unplaced : std::nullopt);
    o += "},\"segments\":";
    if (info.kind == "oom") {
        o += '[';
        for (std::size_t i = 0; i < std::min(n_segments, t.segments.size()); i++) {
            const Segment &s = t.segments[i];
            std::uint64_t allocated = 0;
            for (const SnapshotBlock &b : s.blocks)
                if (b.allocated) allocated += b.bytes;
            if (i) o += ',';
            o += "{\"address\":" + std::to_string(s.address) + ",\"bytes\":" + std::to_string(s.bytes) +
                 ",\"allocated\":" + std::to_string(allocated) + ",\"stream\":" + std::to_string(s.stream) + '}';
        }
        o += ']';
    } else {
        o += "null";
    }
    o += ",\"history\":{\"complete\":";
    o += t.complete ? "true" : "false";
    o += ",\"entries\":" + std::to_string(t.entries) + ",\"lost_entries\":";
    o += t.lost_entries ? "true" : "false";
    if (!t.complete) {
        o += ",\"reason\":";
        json_string(o, t.reason);
    }
    char cost[32];
    std::snprintf(cost, sizeof cost, "%.3f", info.cost_ms);
    o += "},\"cost_ms\":";
    o += cost;
    o += ",\"truncated\":";
    return o;
}

}  // namespace detail

/** The record as JSON, at most `limit` bytes: when larger, frames are cut
 *  (to 8, then 1, then none per block), then the smallest shown blocks move
 *  into "rest", then an OOM's segments are dropped; "truncated" says so.
 *  Sums stay exact. */
inline std::string to_json(const RecordInfo &info, const Table &t, std::size_t limit = MAX_RECORD_BYTES) {
    const std::size_t all_frames = static_cast<std::size_t>(-1);
    const std::size_t caps[] = {all_frames, 8, 1, 0};
    std::size_t n = t.blocks.size();
    for (std::size_t cap : caps) {
        std::string s = detail::render(info, t, cap, n);
        bool cut = cap != all_frames;
        if (s.size() + 8 <= limit || (cap == 0 && n == 0)) return s + (cut ? "true}" : "false}");
    }
    while (n > 0) {
        n--;
        std::string s = detail::render(info, t, 0, n);
        if (s.size() + 8 <= limit) return s + "true}";
    }
    // An OOM's segments last: halved until the record fits.
    for (std::size_t segs = t.segments.size() / 2;; segs /= 2) {
        std::string s = detail::render(info, t, 0, 0, segs);
        if (s.size() + 8 <= limit || segs == 0) return s + "true}";
    }
}

/** One line for a record (a log line per epoch, as the Python side
 *  logs): its peak, the step, the top three blocks, the rest. */
inline std::string summary_line(const RecordInfo &info, const Table &t) {
    auto mib = [](std::optional<std::uint64_t> b) {
        if (!b) return std::string("?");
        char buf[40];
        std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(*b) / (1 << 20));
        return std::string(buf);
    };
    auto num = [](const std::optional<std::int64_t> &v) { return v ? std::to_string(*v) : std::string("?"); };
    std::string head = info.kind == "oom"
                           ? "memprobe: out of memory asking " + mib(t.requested) + " on cuda:" + std::to_string(info.device)
                           : "memprobe: epoch " + num(info.epoch) + " peak " + mib(info.peak_bytes) + " on cuda:" +
                                 std::to_string(info.device) + " at step " + num(info.step);
    if (!t.complete) return head + ": blocks unknown (" + t.reason + ")";
    std::string out = head + ": ";
    for (std::size_t i = 0; i < t.blocks.size() && i < 3; i++) {
        const Block &b = t.blocks[i];
        out += mib(b.bytes) + " ";
        if (!b.frames.empty()) {
            const Frame &f = b.frames.front();
            const std::size_t slash = f.file.find_last_of('/');
            out += (slash == std::string::npos ? f.file : f.file.substr(slash + 1)) + ":" + std::to_string(f.line) +
                   " " + f.function;
        } else {
            out += b.module ? *b.module : "no frame";
        }
        out += ", ";
    }
    std::uint64_t shown = 0;
    for (std::size_t i = 3; i < t.blocks.size(); i++) shown += t.blocks[i].bytes;
    return out + "rest " + mib(*t.rest_bytes() + shown) + " in " +
           std::to_string(t.rest_blocks + (t.blocks.size() > 3 ? t.blocks.size() - 3 : 0)) + " blocks";
}

/** The file name of a record: epoch-<E>-rank-<R>.json, oom-<N>-rank-<R>.json. */
inline std::string file_name(const std::string &kind, std::int64_t n, int rank) {
    return (kind == "oom" ? "oom-" : "epoch-") + std::to_string(n) + "-rank-" + std::to_string(rank) + ".json";
}

/** The rank of this process: RANK, else 0. */
inline int rank_from_env() {
    const char *r = std::getenv("RANK");
    if (!r || !*r) return 0;
    char *end = nullptr;
    long v = std::strtol(r, &end, 10);
    return end && *end == '\0' && v >= 0 && v <= 1 << 20 ? static_cast<int>(v) : 0;
}

/** Where records go: MEMPROBE_ATTRIBUTION_DIR when set (memprobe run sets
 *  it), else `fallback`. */
inline std::string record_dir(const std::string &fallback) {
    const char *d = std::getenv("MEMPROBE_ATTRIBUTION_DIR");
    return d && *d ? std::string(d) : fallback;
}

/** Writes `json` as dir/name through a temporary file renamed into place
 *  (a reader never sees a partial record); creates dir. Returns the path;
 *  throws std::system_error with the path on failure. */
inline std::string write_record(const std::string &dir, const std::string &name, const std::string &json) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw std::system_error(ec, "memprobe: cannot create the attribution directory " + dir);
    const std::string path = (fs::path(dir) / name).string();
    const std::string tmp = (fs::path(dir) / ("." + name + ".tmp" + std::to_string(::getpid()))).string();
    std::FILE *f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw std::system_error(errno, std::generic_category(), "memprobe: cannot write " + tmp);
    bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
    ok = std::fflush(f) == 0 && ok;
    int err = errno;
    ok = std::fclose(f) == 0 && ok;
    if (!ok) {
        std::remove(tmp.c_str());
        throw std::system_error(err ? err : EIO, std::generic_category(), "memprobe: cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        err = errno;
        std::remove(tmp.c_str());
        throw std::system_error(err, std::generic_category(), "memprobe: cannot rename " + tmp + " to " + path);
    }
    return path;
}

/** Options of an Attributor. */
struct Options {
    int device = 0;
    std::size_t top = 10;          /**< blocks named per record */
    std::string stage = "train";
    std::optional<int> rank;       /**< default: RANK, else 0 */
    std::string dir = "memprobe-attribution"; /**< when MEMPROBE_ATTRIBUTION_DIR is not set */
    Counter counter = Counter::Allocated;
};

/** Wall-clock now, Unix microseconds (torch's history uses the same clock). */
inline std::int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

/** Decides when to look (a step that sets a new peak for its epoch), takes
 *  the history then, replays it and writes the record. The history comes
 *  from a function: torch's (memprobe_torch.hpp's TorchHistory) or a
 *  test's. */
class Attributor {
public:
    using Take = std::function<History()>;

    Attributor(Options o, Take take) : o_(std::move(o)), take_(std::move(take)) {
        rank_ = o_.rank ? *o_.rank : rank_from_env();
    }

    /** A step ended: it began at `started_us` (Unix µs) and its exact peak
     *  of torch_alloc:<device> was `peak_bytes`. When that is a new peak
     *  for `epoch` (above every earlier step of that epoch), takes the
     *  history, replays it and writes epoch-<epoch>-rank-<R>.json (a later,
     *  higher step of the epoch replaces it). Returns the file written, or
     *  nothing when the step set no new peak. */
    std::optional<std::string> step_ended(std::int64_t epoch, std::int64_t step, std::uint64_t peak_bytes,
                                          std::int64_t started_us) {
        if (epoch_ && *epoch_ == epoch && peak_bytes <= best_) return std::nullopt;
        epoch_ = epoch;
        best_ = peak_bytes;
        const auto t0 = std::chrono::steady_clock::now();
        History h = take_();
        snapshots_++;
        Table t = replay_to_peak(h, started_us, peak_bytes, o_.counter, o_.top);
        RecordInfo info;
        info.kind = "epoch_peak";
        info.rank = rank_;
        info.epoch = epoch;
        info.step = step;
        info.stage = o_.stage;
        info.device = o_.device;
        info.peak_bytes = peak_bytes;
        last_ = t;
        return write(info, t, t0, file_name("epoch", epoch, rank_));
    }

    /** An out-of-memory error happened: takes the history, writes
     *  oom-<N>-rank-<R>.json (N counts this process's OOMs from 0). */
    std::string out_of_memory(std::optional<std::int64_t> epoch = std::nullopt,
                              std::optional<std::int64_t> step = std::nullopt) {
        const auto t0 = std::chrono::steady_clock::now();
        History h = take_();
        snapshots_++;
        Table t = at_oom(h, o_.counter, o_.top);
        RecordInfo info;
        info.kind = "oom";
        info.rank = rank_;
        info.epoch = epoch;
        info.step = step;
        info.stage = o_.stage;
        info.device = o_.device;
        last_ = t;
        return write(info, t, t0, file_name("oom", ooms_++, rank_));
    }

    /** Histories taken (one per new epoch peak and per OOM). */
    std::size_t snapshots() const noexcept { return snapshots_; }
    /** The last table made. */
    const std::optional<Table> &last() const noexcept { return last_; }
    /** summary_line() of the last record written (for the program's log). */
    const std::string &last_line() const noexcept { return last_line_; }
    /** The JSON of the last record written, as written: after an OOM, what
     *  memprobe_oom_report_event.live_blocks_json takes, so that the
     *  out-of-memory report embeds the table. */
    const std::string &last_json() const noexcept { return last_json_; }
    /** Where records go now. */
    std::string dir() const { return record_dir(o_.dir); }
    const Options &options() const noexcept { return o_; }

private:
    std::string write(RecordInfo &info, const Table &t, std::chrono::steady_clock::time_point t0,
                      const std::string &name) {
        info.cost_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        last_line_ = summary_line(info, t);
        std::string json = to_json(info, t);
        std::string path = write_record(dir(), name, json);
        last_json_ = std::move(json);
        return path;
    }

    Options o_;
    Take take_;
    int rank_ = 0;
    std::optional<std::int64_t> epoch_;
    std::uint64_t best_ = 0;
    std::size_t snapshots_ = 0;
    std::int64_t ooms_ = 0;
    std::optional<Table> last_;
    std::string last_line_;
    std::string last_json_;
};

}  // namespace memprobe::torch::attribution

#endif /* MEMPROBE_TORCH_ATTRIBUTION_HPP */
