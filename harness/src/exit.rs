//! The one table of exit statuses of `gpu-ipc` and its tools. Every command uses these four; what 0 and 1 mean
//! in words is said by each command's `--help`.

/// Success: the doctor found every built backend ready; a probe ran and printed its verdict (whatever it says);
/// the report was written with every run; the benchmark finished; every stress check passed.
pub const EXIT_OK: u8 = 0;
/// The command ran but did not succeed: a backend failed its self-test, a probe or benchmark could not finish, a
/// report run failed or left no JSON, a stress check failed. The output says which and why.
pub const EXIT_FAILED: u8 = 1;
/// The command line was wrong (clap exits with this code by itself).
pub const EXIT_USAGE: u8 = 2;
/// No usable CUDA driver, or no GPU: nothing could be measured.
pub const EXIT_NO_CUDA: u8 = 3;
