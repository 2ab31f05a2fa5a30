//! One module per subcommand; each `main` returns the exit status.

pub(crate) mod gpus;
pub(crate) mod run;
pub(crate) mod serve;
pub(crate) mod status;
pub(crate) mod watch;
