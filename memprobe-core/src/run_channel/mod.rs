//! The channel from a traced program to `memprobe run`: every
//! [`Tracker`](crate::Tracker) sends its phase boundaries and records to
//! the Unix datagram socket named by [`ENV`] (`MEMPROBE_RUN_CHANNEL`), one
//! JSON object per datagram, so the run's summary, JSON and chart can show
//! the program's epochs and steps.
//!
//! - [`protocol`]: the messages, their encoding (the sender's) and decoding
//!   (`memprobe run`'s), in one place;
//! - `sender`: [`RunChannel`], the socket, what it keeps while the receiver
//!   is full, the counts of what it dropped, the flush at exit;
//! - `batch`: a tracker's steps folded into one message;
//! - `hook`: a tracker's end of the channel (which channel, its number);
//! - [`ranks`]: the process's rank in a job of several, from the variables
//!   its launcher set (torchrun, MPI, Slurm), sent in every message.
//!
//! The training thread is never blocked or slowed for it, and nothing sent
//! is lost without being counted:
//!
//! - the variable is read once per process, at the first phase boundary;
//!   unset, a boundary costs one atomic load;
//! - the socket is unbound and non-blocking (`SOCK_DGRAM | SOCK_CLOEXEC |
//!   SOCK_NONBLOCK`), connected to the receiver once when it exists (which
//!   spares the kernel a path lookup per message) and otherwise given the
//!   address at each send; each datagram goes out with one `send` (or
//!   `sendto`) with `MSG_DONTWAIT | MSG_NOSIGNAL`;
//! - steps are batched: the ends of consecutive steps of a tracker are
//!   folded into one `steps` message (how many, the first and last step's
//!   numbers and times, and per source the step with the largest peak),
//!   sent once the batch spans [`BATCH_NS`] or holds [`BATCH_STEPS`] steps,
//!   and before any other message of its tracker (so a step never arrives
//!   after the epoch that held it). A step that lasts longer than
//!   [`BATCH_NS`] goes out alone, at its end;
//! - when the receiver's queue is full (`EAGAIN`, `ENOBUFS`) a message is
//!   kept, in order, and sent before the next one (by any tracker of the
//!   process), when a tracker is dropped and at the process's exit (an
//!   `atexit` handler; a program that leaves through `_exit`, or Go's
//!   `os.Exit`, must drop its trackers first). Those two wait for the
//!   receiver up to [`FLUSH_WAIT`]. At most [`MAX_PENDING`] messages are
//!   kept: beyond it a batch of steps is dropped first, a boundary only
//!   when no batch is left to drop;
//! - a message dropped (the queue over its bound, the receiver gone, the
//!   process killed before its exit) is counted, and every later message
//!   carries the counts (`dropped`, and `dropped_steps`: the steps in the
//!   batches among them), so the receiver knows what it lost;
//! - once the receiver is gone (`ENOENT`, `ECONNREFUSED`, `ENOTCONN`), the
//!   next [`GONE_SKIP`] messages are counted as dropped without a system
//!   call; a receiver bound at the path later is reached by address;
//! - nothing is printed, nothing panics.
//!
//! A forked child keeps the socket (datagrams need no connection) and sends
//! with its own pid (taken again after each fork, which the fork handlers
//! count: no `getpid` per message); its counters start again at 0 and what
//! the parent had kept is not sent twice.
//! The times are `CLOCK_MONOTONIC` nanoseconds, which the receiver shares.
//! The messages are described in [`protocol`].

mod batch;
mod hook;
pub mod protocol;
pub mod ranks;
mod sender;

pub(crate) use hook::Hook;
pub use protocol::{MAX_DATAGRAM, VERSION};
pub use ranks::Ranks;
pub use sender::RunChannel;

use std::time::Duration;

/// The environment variable naming the socket: set by `memprobe run` for
/// the command it runs (and so for that command's children).
pub const ENV: &str = "MEMPROBE_RUN_CHANNEL";

/// Messages counted as dropped, without a system call, after the receiver
/// was found gone: a dead parent costs a training loop almost nothing.
pub const GONE_SKIP: u64 = 256;

/// A batch of steps is sent once it spans this long (first step's start to
/// last step's end), in nanoseconds.
pub const BATCH_NS: u64 = 20_000_000;

/// ... or once it holds this many steps.
pub const BATCH_STEPS: u64 = 4096;

/// At most this many messages are kept while the receiver's queue is full.
pub const MAX_PENDING: usize = 1024;

/// How long a dropped tracker, or the process's exit, waits for the
/// receiver to take what was kept.
pub const FLUSH_WAIT: Duration = Duration::from_secs(1);
