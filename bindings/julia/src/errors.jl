# Part of module MemProbe (src/MemProbe.jl includes it).
# ---------------------------------------------------------------------------
# Statuses and errors
#
# Constants, enum values and struct layouts below copy include/memprobe.h;
# tests/tests/bindings_cover_header.rs checks each against the header (a
# constant's C name is MEMPROBE_STATUS_<name> or MEMPROBE_<name> unless a
# trailing `# MEMPROBE_...` comment names it; structs name theirs in a
# `# layout:` comment).

const OK = UInt32(0)
const NULL_POINTER = UInt32(1)
const INVALID_ARGUMENT = UInt32(2)
const INVALID_HANDLE = UInt32(3)
const INVALID_ID = UInt32(4)
const WRONG_ORDER = UInt32(5)
const UNAVAILABLE = UInt32(6)
const UNSUPPORTED = UInt32(7)
const PERMISSION_DENIED = UInt32(8)
const IO_ERROR = UInt32(9)  # MEMPROBE_STATUS_IO
const PARSE = UInt32(10)
const GPU_LOST = UInt32(11)
const BUFFER_TOO_SMALL = UInt32(12)
const PANIC = UInt32(13)
const INTERNAL = UInt32(14)
const OUT_OF_MEMORY = UInt32(15)

"""
    MemprobeError(status, message)

A failed memprobe call: `status` is a `memprobe_status` value
(`MemProbe.WRONG_ORDER`, ...), `message` the library's explanation.
"""
struct MemprobeError <: Exception
    status::UInt32
    message::String
end

status_name(s::Integer) = unsafe_string(ccall(sym(:memprobe_status_name), Cstring, (UInt32,), s))

Base.showerror(io::IO, e::MemprobeError) =
    print(io, "MemprobeError: ", e.message, " [", status_name(e.status), "]")

last_error() = unsafe_string(ccall(sym(:memprobe_last_error), Cstring, ()))

# memprobe_last_error is thread-local: read it on the thread that failed,
# with no task switch in between (no yield point between the two calls).
@inline function check(st::UInt32)
    st == OK || throw(MemprobeError(st, last_error()))
    nothing
end
