//! `gpu-ipc report` on a machine without a driver (hidden with `GPU_IPC_LIBCUDA`, so this also runs on the GPU
//! machine): it checks the driver before it touches any file, says so in one line and exits with status 3; its
//! output folder, given or default, is left exactly as it was.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;

/// A folder of its own under the system's temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> Self {
        let path = std::env::temp_dir().join(format!("gpu-ipc-report-cli-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn report_without_driver(cwd: &Path, args: &[&str]) -> Output {
    Command::new(common::gpu_ipc_exe())
        .arg("report")
        .args(args)
        .current_dir(cwd)
        .env("GPU_IPC_LIBCUDA", "/nonexistent/libcuda.so.1")
        .output()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Everything under `dir` (relative path): each file with its contents, each folder as `None`.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap_or_else(|e| panic!("{}: {e}", next.display())) {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            let name = path.strip_prefix(dir).unwrap_or(&path).to_path_buf();
            if path.is_dir() {
                files.insert(name, None);
                pending.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                files.insert(name, Some(bytes));
            }
        }
    }
    files
}

fn assert_one_no_driver_line(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(stderr.lines().count(), 1, "exactly one line: {stderr}");
    assert!(stderr.starts_with("gpu-ipc report: no CUDA driver: "), "{stderr}");
    assert!(stderr.contains("libcuda.so.1"), "names the library: {stderr}");
    assert!(out.stdout.is_empty(), "nothing on stdout: {out:?}");
}

#[test]
fn without_a_driver_it_says_so_in_one_line_and_writes_nothing() {
    let cwd = TempDir::new("default");
    for args in [&[][..], &["--quick"], &["--only", "crash", "--mps-only"]] {
        let out = report_without_driver(&cwd.0, args);
        assert_one_no_driver_line(&out);
        // Not even the default folder (./gpu-ipc-report/) is created.
        assert!(snapshot(&cwd.0).is_empty(), "{args:?} wrote {:?}", snapshot(&cwd.0));
    }
}

#[test]
fn without_a_driver_a_given_folder_is_left_untouched() {
    // A copy of a committed report: the README, a plot, and raw JSON, logs and the run log that a probe run would
    // write to (the file a report run once deleted before failing is among them).
    let out_dir = TempDir::new("given");
    let dir = &out_dir.0;
    std::fs::create_dir_all(dir.join("raw")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir_all(dir.join("plots")).unwrap_or_else(|e| panic!("{e}"));
    let files = [
        ("README.md", "# the committed report\n"),
        ("plots/overhead-read.svg", "<svg/>\n"),
        ("raw/overhead-no-mps.json", "{\"probe\": \"overhead\"}\n"),
        ("raw/overhead-no-mps.log", "a log\n"),
        ("raw/runs.json", "{\"runs\": []}\n"),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("{e}"));
    }
    let before = snapshot(dir);
    let cwd = TempDir::new("cwd");
    let out = report_without_driver(&cwd.0, &["--out", dir.to_str().unwrap_or_else(|| panic!("not UTF-8"))]);
    assert_one_no_driver_line(&out);
    assert_eq!(snapshot(dir), before, "the folder is unchanged");
    assert!(snapshot(&cwd.0).is_empty(), "and nothing was written elsewhere");
}
