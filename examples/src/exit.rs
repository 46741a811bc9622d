//! The exit statuses of every example program (`producer`, `consumer`, `pipeline`, `semaphore`, `pool`,
//! `work_queue`, `cudarc_frames`): one table, here and in `docs/exit-codes.md` (a test keeps the two equal), and
//! shown by each program's `--help`.
//!
//! | status | constant | meaning |
//! |---:|---|---|
//! | 0 | [`EXIT_OK`] | done: the run did what was asked (a consumer: every frame checked matched) |
//! | 1 | [`EXIT_FAILURE`] | an error, a mismatch, or a run whose counts do not add up; the line on stderr says which |
//! | 2 | [`EXIT_USAGE`] | the command line is wrong (clap's own status) |
//! | 3 | [`EXIT_NO_DRIVER`] | no CUDA driver (`libcuda.so.1`); `--backend host` runs without one |
//! | 4 | [`EXIT_PEER_GONE`] | the other side ended under the program: a producer or owner died; a semaphore poisoned by a dead poster, or closed by its owner |
//! | 5 | [`EXIT_EVICTED`] | a consumer the producer evicted (it stopped releasing frames) |
//! | 6 | [`EXIT_NO_CONSUMER`] | a pipeline stage whose downstream consumer left (without `--wait-for-downstream`) |

/// Done.
pub const EXIT_OK: u8 = 0;
/// An error, a mismatch, or counts that do not add up.
pub const EXIT_FAILURE: u8 = 1;
/// A wrong command line (what clap exits with).
pub const EXIT_USAGE: u8 = 2;
/// No CUDA driver (the same as the `gpu-ipc` command's).
pub const EXIT_NO_DRIVER: u8 = 3;
/// The other side ended under the program: a producer or owner died, a semaphore was poisoned by a dead poster or
/// closed by its owner. Not a clean end of stream (that is 0).
pub const EXIT_PEER_GONE: u8 = 4;
/// A consumer the producer evicted (it stopped releasing frames; see `consumer --stall-after`).
pub const EXIT_EVICTED: u8 = 5;
/// A pipeline stage whose downstream consumer left.
pub const EXIT_NO_CONSUMER: u8 = 6;

/// Every status with its constant's name, in the table's order.
pub const TABLE: [(u8, &str); 7] = [
    (EXIT_OK, "EXIT_OK"),
    (EXIT_FAILURE, "EXIT_FAILURE"),
    (EXIT_USAGE, "EXIT_USAGE"),
    (EXIT_NO_DRIVER, "EXIT_NO_DRIVER"),
    (EXIT_PEER_GONE, "EXIT_PEER_GONE"),
    (EXIT_EVICTED, "EXIT_EVICTED"),
    (EXIT_NO_CONSUMER, "EXIT_NO_CONSUMER"),
];

/// What every program's `--help` ends with.
pub const HELP: &str = "Exit status: 0 done; 1 an error; 2 a wrong command line; 3 no CUDA driver (try --backend host); \
4 the other side ended (a producer or owner died, a semaphore poisoned by a dead poster or closed); 5 evicted; \
6 no downstream consumer. See docs/exit-codes.md.";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The rows `| status | constant | ... |` of a markdown table.
    fn rows(text: &str) -> Vec<(u8, String)> {
        text.lines()
            .map(|line| line.trim_start_matches("//!").trim())
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let status = cells.get(1)?.parse::<u8>().ok()?;
                let name = cells.get(2)?.trim_matches(|c| c == '`' || c == '[' || c == ']').to_owned();
                Some((status, name))
            })
            .collect()
    }

    #[test]
    fn the_docs_table_and_this_modules_table_are_the_constants() {
        let expected: Vec<(u8, String)> = TABLE.iter().map(|&(code, name)| (code, name.to_owned())).collect();
        assert_eq!(rows(include_str!("exit.rs")), expected);
        assert_eq!(rows(include_str!("../../docs/exit-codes.md")), expected);
        for (code, _) in TABLE {
            assert!(HELP.contains(&format!("{code} ")), "--help leaves out {code}");
        }
    }
}
