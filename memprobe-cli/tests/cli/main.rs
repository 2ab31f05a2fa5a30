//! Integration tests of the `memprobe` command.

mod commands;
mod exit_codes;
mod helper;
mod outputs;
mod peaks;
mod phases;
mod schema;
mod serve;
mod support;
mod terminal;
