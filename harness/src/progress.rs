//! Progress of a long probe on stderr: a bar on a terminal, a line per stage (and per quarter of a stage)
//! otherwise, nothing with `--json` or `--no-progress`. Never on stdout, which carries the result.

use std::io::IsTerminal;
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A probe's progress reporter; cheap to call from the probe's inner loops.
#[derive(Debug)]
pub struct Progress {
    name: String,
    mode: Mode,
    state: Mutex<State>,
}

#[derive(Debug)]
enum Mode {
    Off,
    Lines,
    Bar(ProgressBar),
}

#[derive(Debug, Default)]
struct State {
    stage: String,
    total: u64,
    done: u64,
    last_quarter: u64,
}

impl Progress {
    /// A reporter for probe `name`; silent unless `enabled`.
    pub fn new(name: &str, enabled: bool) -> Self {
        let mode = if !enabled {
            Mode::Off
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
                .map(|s| s.progress_chars("=> "))
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_prefix(format!("gpu-ipc probe {name}"));
            Mode::Bar(bar)
        } else {
            Mode::Lines
        };
        Self { name: name.to_owned(), mode, state: Mutex::new(State::default()) }
    }

    /// A silent reporter (tests, and callers that show their own progress).
    pub fn silent() -> Self {
        Self::new("", false)
    }

    /// Starts a stage of `total` steps called `stage`.
    pub fn stage(&self, stage: &str, total: u64) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *state = State { stage: stage.to_owned(), total, done: 0, last_quarter: 0 };
        match &self.mode {
            Mode::Off => {}
            Mode::Lines => eprintln!("gpu-ipc probe {}: {stage} (0/{total})", self.name),
            Mode::Bar(bar) => {
                bar.set_length(total);
                bar.set_position(0);
                bar.set_message(stage.to_owned());
            }
        }
    }

    /// Marks one more step of the current stage done, with an optional note on what it was.
    pub fn step(&self, note: &str) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.done += 1;
        match &self.mode {
            Mode::Off => {}
            Mode::Lines => {
                let quarter = (state.done * 4).checked_div(state.total).unwrap_or(4);
                if quarter > state.last_quarter {
                    state.last_quarter = quarter;
                    eprintln!("gpu-ipc probe {}: {} ({}/{}) {note}", self.name, state.stage, state.done, state.total);
                }
            }
            Mode::Bar(bar) => {
                bar.set_position(state.done);
                if !note.is_empty() {
                    bar.set_message(format!("{}: {note}", state.stage));
                }
            }
        }
    }

    /// Clears the bar (the result follows on stdout).
    pub fn finish(&self) {
        if let Mode::Bar(bar) = &self.mode {
            bar.finish_and_clear();
        }
    }
}
