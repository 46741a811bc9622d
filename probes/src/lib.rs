//! The research probes (`gpu-ipc probe ...`): measured answers to the four questions people ask before they trust
//! shared GPU memory, and their report (`gpu-ipc report`).
//!
//! Every probe is one folder behind one trait, [`Probe`], listed once in [`PROBES`]: the command line, the
//! helper processes and the report find it there. A probe runs its exporter and importer in two processes (helper
//! processes of the `gpu-ipc` binary, `harness::child`), records where it ran (`harness::env`) and reports
//! distributions (`harness::stats`), as JSON and as text; every probe's JSON has the same envelope,
//! `harness::MeasurementOutput`. A probe measures the machine as it finds it: with MPS when a daemon runs, without
//! otherwise (its JSON says which). [`report`] runs every probe twice, without MPS and under a private MPS daemon,
//! and assembles the answers.

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

pub mod coherency;
pub mod crash;
pub mod overhead;
mod probe;
pub mod report;
pub mod vmm_compat;

use clap::{ArgMatches, Command, FromArgMatches, Subcommand};
use harness::MeasurementError;
use harness::child::{Channel, ChildTask};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use probe::{Probe, TypedRenderer, command_for, run_with, typed_output, typed_section, typed_verdict};

/// Every probe, in report order: the one list a new probe joins.
pub static PROBES: [&dyn Probe; 4] =
    [&overhead::Overhead, &coherency::Coherency, &vmm_compat::VmmCompat, &crash::Crash];

/// The probe called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static dyn Probe> {
    PROBES.iter().copied().find(|probe| probe.name() == name)
}

/// A probe named by the user or in a recorded run: one of [`PROBES`], compared, ordered and written by its name.
#[derive(Clone, Copy)]
pub struct ProbeName(&'static dyn Probe);

/// A name that names no probe; says which names there are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no probe is called {given:?} (there are: {})", known.join(", "))]
pub struct UnknownProbe {
    /// The name given.
    pub given: String,
    /// The probes' names, in report order.
    pub known: Vec<&'static str>,
}

impl ProbeName {
    /// Every probe, in report order.
    pub fn all() -> Vec<Self> {
        PROBES.iter().map(|probe| Self(*probe)).collect()
    }

    /// The probe called `name`; `Err` lists the names there are.
    ///
    /// # Errors
    /// No probe is called `name`.
    pub fn parse(name: &str) -> Result<Self, UnknownProbe> {
        find(name).map(Self).ok_or_else(|| UnknownProbe {
            given: name.to_owned(),
            known: PROBES.iter().map(|probe| probe.name()).collect(),
        })
    }

    /// The probe itself.
    pub fn probe(self) -> &'static dyn Probe {
        self.0
    }

    /// The subcommand and file name: `overhead`, `coherency`, `vmm-compat`, `crash`.
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// A short title for the list of answers.
    pub fn title(self) -> &'static str {
        self.0.title()
    }

    /// The question, used as the heading when the probe's own section has none.
    pub fn question(self) -> &'static str {
        self.0.question()
    }

    fn index(self) -> usize {
        PROBES.iter().position(|probe| probe.name() == self.name()).unwrap_or(usize::MAX)
    }
}

impl std::fmt::Debug for ProbeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProbeName({})", self.name())
    }
}

impl std::fmt::Display for ProbeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl PartialEq for ProbeName {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for ProbeName {}

impl std::hash::Hash for ProbeName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl PartialOrd for ProbeName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Report order, the order of [`PROBES`].
impl Ord for ProbeName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.index().cmp(&other.index())
    }
}

impl Serialize for ProbeName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for ProbeName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Self::parse(&name).map_err(serde::de::Error::custom)
    }
}

/// `gpu-ipc probe <name> [options]`: one subcommand per probe of [`PROBES`], each with its own options.
#[derive(Debug, Clone)]
pub struct ProbeCommand {
    probe: ProbeName,
    matches: ArgMatches,
}

impl ProbeCommand {
    /// Runs the chosen probe; returns the exit status.
    pub fn run(&self) -> u8 {
        self.probe.probe().run(&self.matches)
    }
}

impl FromArgMatches for ProbeCommand {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let Some((name, sub)) = matches.subcommand() else {
            return Err(clap::Error::raw(clap::error::ErrorKind::MissingSubcommand, "name a probe\n"));
        };
        let probe = ProbeName::parse(name)
            .map_err(|e| clap::Error::raw(clap::error::ErrorKind::InvalidSubcommand, format!("{e}\n")))?;
        Ok(Self { probe, matches: sub.clone() })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Subcommand for ProbeCommand {
    fn augment_subcommands(command: Command) -> Command {
        PROBES.iter().fold(command, |command, probe| command.subcommand(probe.command()))
    }

    fn augment_subcommands_for_update(command: Command) -> Command {
        Self::augment_subcommands(command)
    }

    fn has_subcommand(name: &str) -> bool {
        find(name).is_some()
    }
}

/// The probe whose helper role `role` is (`<probe name>-<role>`), if any.
pub fn owner_of_role(role: &str) -> Option<&'static dyn Probe> {
    PROBES.iter().copied().find(|probe| role.strip_prefix(probe.name()).is_some_and(|rest| rest.starts_with('-')))
}

/// Runs a probe's helper task in this process (the `gpu-ipc helper` side).
///
/// # Errors
/// A role no probe owns, or the role's failure.
pub fn child(task: ChildTask, channel: &Channel) -> Result<(), MeasurementError> {
    match owner_of_role(&task.role) {
        Some(probe) => probe.child(task, channel),
        None => Err(MeasurementError::UnknownRole(task.role)),
    }
}

/// The probe called `name` (tests only: a name that is not in [`PROBES`] fails the test).
#[cfg(test)]
#[allow(clippy::expect_used)]
pub(crate) fn test_name(name: &str) -> ProbeName {
    ProbeName::parse(name).expect("a probe of PROBES")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_probe_is_found_by_its_name_and_in_report_order() {
        let names: Vec<&str> = ProbeName::all().iter().map(|p| p.name()).collect();
        assert_eq!(names, ["overhead", "coherency", "vmm-compat", "crash"]);
        for name in names {
            assert_eq!(ProbeName::parse(name).unwrap().name(), name);
        }
        let err = ProbeName::parse("bandwidth").unwrap_err();
        assert!(err.to_string().contains("overhead, coherency, vmm-compat, crash"), "{err}");
        assert!(test_name("overhead") < test_name("crash"));
    }

    #[test]
    fn helper_roles_are_routed_to_the_probe_whose_name_they_start_with() {
        let owner = |role: &str| owner_of_role(role).map(|probe| probe.name());
        assert_eq!(owner("overhead-exporter"), Some("overhead"));
        assert_eq!(owner("coherency-writer"), Some("coherency"));
        assert_eq!(owner("vmm-compat-importer"), Some("vmm-compat"));
        assert_eq!(owner("crash-observer"), Some("crash"));
        assert_eq!(owner("bench-consumer"), None);
        assert_eq!(owner("overheadless-x"), None);
    }

    #[test]
    fn each_probe_has_a_subcommand_with_the_common_options() {
        for probe in PROBES {
            let command = probe.command();
            assert_eq!(command.get_name(), probe.name());
            for option in ["json", "out", "quick", "device", "no_progress"] {
                assert!(command.get_arguments().any(|a| a.get_id() == option), "{} lacks --{option}", probe.name());
            }
        }
    }
}
