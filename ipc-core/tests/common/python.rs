//! What the tests that run the scripts of `tests/python/` share: the interpreter, and a script (or any child
//! process) run with its output captured, waited for with a deadline, and killed on drop.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The interpreter: `$PYTHON` or `python3`. Panics, saying why, when it cannot run or is older than 3.`minor`.
pub fn python(minor: u32) -> String {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let check = format!("import sys; sys.exit(0 if sys.version_info >= (3, {minor}) else 1)");
    match Command::new(&python).args(["-c", &check]).output() {
        Ok(out) if out.status.success() => python,
        Ok(out) => panic!(
            "`{python}` runs but is not Python 3.{minor} or later ({}); these tests need python3 (set PYTHON)",
            out.status
        ),
        Err(err) => panic!("cannot run `{python}`: {err}; these tests need python3 (set PYTHON to its path)"),
    }
}

/// Lines of a child's output as they come, on a channel (closed when the child closes the pipe).
pub fn line_reader(pipe: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// All of a child's output, once it closes the pipe.
pub fn read_all(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

/// A child process, killed (and reaped) on drop if still running, so a failing test leaves none behind.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// What a finished script left.
pub struct Finished {
    /// What ran, for messages: "python consumer a", "python producer".
    pub what: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Finished {
    pub fn describe(&self) -> String {
        format!("{} exited {:?}\nstdout: {}\nstderr: {}", self.what, self.code, self.stdout, self.stderr)
    }

    /// The u64 field `key` of the JSON summary line, the last on stdout (flat, numbers only: no JSON parser needed).
    pub fn summary(&self, key: &str) -> u64 {
        let line = self.stdout.lines().last().unwrap_or_default();
        let pattern = format!("\"{key}\": ");
        let start = line.find(&pattern).unwrap_or_else(|| panic!("no {key} in the summary\n{}", self.describe()))
            + pattern.len();
        let digits: String = line[start..].chars().take_while(char::is_ascii_digit).collect();
        digits.parse().unwrap_or_else(|_| panic!("{key} is not a number\n{}", self.describe()))
    }
}

/// A script of `tests/python/` running as a child process, its stdout read line by line and its stderr kept;
/// killed on drop if still running.
pub struct PyScript {
    what: String,
    child: KillOnDrop,
    started: Instant,
    stdout: Receiver<String>,
    stdout_seen: Vec<String>,
    stderr: Option<JoinHandle<String>>,
}

impl PyScript {
    /// Starts `python tests/python/<script> --socket <socket> <options>` (the script found at run time,
    /// [`super::package_file`]); `what` names it in messages.
    pub fn spawn(python: &str, script: &str, what: &str, socket: &Path, options: &[&str]) -> Self {
        let script = super::package_file(&format!("tests/python/{script}"));
        let mut child = Command::new(python)
            .arg(&script)
            .arg("--socket")
            .arg(socket)
            .args(options)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start `{python} {}`: {err}", script.display()));
        let stdout = line_reader(child.stdout.take().unwrap());
        let stderr = Some(read_all(child.stderr.take().unwrap()));
        let child = KillOnDrop(child);
        Self { what: what.to_owned(), child, started: Instant::now(), stdout, stdout_seen: Vec::new(), stderr }
    }

    /// The next line on stdout, waiting at most `limit`; None past that or once stdout is closed. The line is also
    /// kept for [`PyScript::wait`]'s [`Finished::stdout`].
    pub fn next_line(&mut self, limit: Duration) -> Option<String> {
        let line = self.stdout.recv_timeout(limit).ok()?;
        self.stdout_seen.push(line.clone());
        Some(line)
    }

    /// Whether the process has exited (its status is kept for [`PyScript::wait`]).
    pub fn has_exited(&mut self) -> bool {
        self.child.0.try_wait().unwrap().is_some()
    }

    /// SIGKILLs the process; returns when it was killed.
    pub fn kill(&mut self) -> Instant {
        self.child.0.kill().unwrap();
        let killed = Instant::now();
        self.child.0.wait().unwrap();
        killed
    }

    /// Waits at most `limit` for the process to exit; kills it and panics, with its output, past that.
    pub fn wait(&mut self, limit: Duration) -> Finished {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.0.try_wait().unwrap() {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.0.kill();
                let _ = self.child.0.wait();
                break None;
            }
            thread::sleep(Duration::from_millis(5));
        };
        // The pipe closes with the process; take the lines still in flight.
        while let Ok(line) = self.stdout.recv_timeout(Duration::from_secs(1)) {
            self.stdout_seen.push(line);
        }
        let finished = Finished {
            what: self.what.clone(),
            code: status.and_then(|s| s.code()),
            stdout: self.stdout_seen.join("\n"),
            stderr: self.stderr.take().map(|h| h.join().unwrap()).unwrap_or_default(),
            elapsed: self.started.elapsed(),
        };
        assert!(status.is_some(), "still running after {limit:?}, killed\n{}", finished.describe());
        finished
    }
}
