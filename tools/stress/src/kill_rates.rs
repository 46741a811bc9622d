//! The rate table of the kernel-kill trials (`mps-kills`): each cell's trials counted, so that a GPU run gives how
//! often a kill faulted the other clients rather than one anecdote. Stands on the trials' records
//! ([`crate::kernel_kills`]), which know nothing of it.

use serde::Serialize;

use crate::kernel_kills::{KernelCell, KernelKillRun};
use crate::outcome::Status;

/// A cell's trials counted: how often a kill faulted the other clients, so that a GPU run gives rates.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelKillRate {
    /// The cell.
    pub cell: KernelCell,
    /// Trials run (not counting those not run).
    pub trials: u32,
    /// Trials in which at least one client that was not killed faulted.
    pub trials_with_fault: u32,
    /// Clients that faulted, over all trials.
    pub clients_faulted: u32,
    /// Clients that were not killed, over all trials (`trials * CLIENTS`).
    pub clients: u32,
    /// Trials that failed (a hang, a wrong ending, a fault without MPS).
    pub failed: u32,
    /// The slowest survivor's end after the kill, in seconds, over the trials that recorded one.
    pub survivor_end_max_s: Option<f64>,
}

impl KernelKillRate {
    /// `faulted in 2/3 trials (4/9 clients), 0 failed`, or `not run` for a cell with no trial run.
    pub fn summary(&self) -> String {
        if self.trials == 0 {
            return "not run".to_owned();
        }
        format!(
            "faulted in {}/{} trials ({}/{} clients), {} failed",
            self.trials_with_fault, self.trials, self.clients_faulted, self.clients, self.failed
        )
    }
}

/// The rates of every cell in `runs`, in the order cells first appear.
pub fn rates(runs: &[KernelKillRun]) -> Vec<KernelKillRate> {
    let mut order: Vec<KernelCell> = Vec::new();
    for r in runs {
        if !order.contains(&r.cell) {
            order.push(r.cell);
        }
    }
    order
        .into_iter()
        .map(|cell| {
            let ran: Vec<&KernelKillRun> =
                runs.iter().filter(|r| r.cell == cell && r.status != Status::NotRun).collect();
            KernelKillRate {
                cell,
                trials: ran.len() as u32,
                trials_with_fault: ran.iter().filter(|r| r.faulted > 0).count() as u32,
                clients_faulted: ran.iter().map(|r| r.faulted).sum(),
                clients: ran.iter().map(|r| r.clients).sum(),
                failed: ran.iter().filter(|r| r.status == Status::Failed).count() as u32,
                survivor_end_max_s: ran.iter().filter_map(|r| r.survivor_end_s).reduce(f64::max),
            }
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::kernel_kills::KernelKind;
    use crate::schedule::Victim;

    #[test]
    fn rates_count_each_cells_trials_with_a_fault_and_leave_out_those_not_run() {
        let cell = KernelCell {
            backend: "vmm",
            kind: KernelKind::Persistent,
            victim: Victim::Producer,
            mps: true,
            lease: true,
        };
        let other = KernelCell { backend: "legacy", ..cell };
        let run = |cell, trial, status, faulted, end| KernelKillRun {
            trial,
            faulted,
            survivor_end_s: end,
            ..KernelKillRun::new(cell, status, String::new())
        };
        let runs = vec![
            run(cell, 1, Status::Finding, 2, Some(0.2)),
            run(other, 1, Status::Passed, 0, Some(0.1)),
            run(cell, 2, Status::Passed, 0, Some(0.5)),
            run(cell, 3, Status::Failed, 3, None),
            run(other, 2, Status::NotRun, 0, None),
        ];
        let r = rates(&runs);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].cell, cell);
        assert_eq!((r[0].trials, r[0].trials_with_fault, r[0].clients_faulted, r[0].clients), (3, 2, 5, 9));
        assert_eq!((r[0].failed, r[0].survivor_end_max_s), (1, Some(0.5)));
        assert_eq!(r[0].summary(), "faulted in 2/3 trials (5/9 clients), 1 failed");
        assert_eq!(
            (r[1].trials, r[1].trials_with_fault, r[1].summary().as_str()),
            (1, 0, "faulted in 0/1 trials (0/3 clients), 0 failed")
        );
        let none = rates(&[run(other, 1, Status::NotRun, 0, None)]);
        assert_eq!(none[0].summary(), "not run");
    }
}
