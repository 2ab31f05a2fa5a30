//! Integration tests of the `memprobe` command.

mod attribution;
mod commands;
mod descriptors;
mod exit_codes;
mod fake_gpu_libs;
mod gpu_origins_views;
mod gpu_stacks_json;
mod helper;
mod host_kinds;
mod max_cpu;
mod oom;
mod outputs;
mod peaks;
mod phases;
mod pss;
mod schema;
mod serve;
mod support;
mod terminal;
