//! `gpu-ipc ps SOCKET`: who is attached to a ring, pool, semaphore or work queue, as its owner knows it. Asks the
//! owner over its socket (a status request: no CUDA, no record taken) and prints a table or JSON.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use gpu_ipc::toolkit::door::{self, PeerStatus, StatusReport};
use harness::exit::{EXIT_FAILED, EXIT_OK};
use serde::Serialize;

/// The options of `gpu-ipc ps`.
#[derive(Debug, Args)]
pub struct PsArgs {
    /// The socket of the ring's producer or of the object's owner.
    pub socket: PathBuf,
    /// Print the report as JSON (`path`, `kind`, `backend`, `owner_pid`, `peers`: `id`, `pid` (null: another PID
    /// namespace), `uid`, `gid`, `since_unix_ms`, `last_sign_ms` (null: none known), `state`, `name`, `detail`).
    #[arg(long)]
    pub json: bool,
    /// How long to wait for the owner's answer, in seconds.
    #[arg(long, default_value_t = 2.0)]
    pub timeout: f64,
}

#[derive(Serialize)]
struct PsJson<'a> {
    path: &'a Path,
    #[serde(flatten)]
    report: &'a StatusReport,
}

/// Runs `gpu-ipc ps`; returns the exit status: 0 the owner answered, 1 it could not be asked (nothing listens,
/// another user's socket, no answer in time).
pub fn main(args: &PsArgs) -> u8 {
    let timeout = Duration::try_from_secs_f64(args.timeout.max(0.001)).unwrap_or(Duration::from_secs(2));
    match door::status(&args.socket, timeout) {
        Ok(report) => {
            if args.json {
                match serde_json::to_string_pretty(&PsJson { path: &args.socket, report: &report }) {
                    Ok(text) => println!("{text}"),
                    Err(e) => {
                        eprintln!("gpu-ipc ps: {e}");
                        return EXIT_FAILED;
                    }
                }
            } else {
                print!("{}", render(&args.socket, &report, SystemTime::now()));
            }
            EXIT_OK
        }
        Err(e) => {
            eprintln!("gpu-ipc ps: {e}");
            EXIT_FAILED
        }
    }
}

/// The table `gpu-ipc ps` prints, with ages counted from `now`.
pub fn render(path: &Path, report: &StatusReport, now: SystemTime) -> String {
    let count = report.peers.len();
    let mut out = format!(
        "{} at {} (backend {}, owner pid {}): {count} peer{}\n",
        report.kind,
        path.display(),
        report.backend,
        report.owner_pid,
        if count == 1 { "" } else { "s" }
    );
    if count == 0 {
        return out;
    }
    let header = ["PEER", "PID", "UID", "ATTACHED", "STATE", "LAST SIGN", "NAME", "DETAIL"].map(str::to_owned);
    let rows: Vec<[String; 8]> = report.peers.iter().map(|peer| row(peer, now)).collect();
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for line in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = line.iter().zip(widths).map(|(cell, width)| format!("{cell:<width$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn row(peer: &PeerStatus, now: SystemTime) -> [String; 8] {
    let attached = match peer.since_unix_ms {
        0 => "-".to_owned(),
        ms => {
            let since = UNIX_EPOCH + Duration::from_millis(ms);
            format!("{} ago", age(now.duration_since(since).unwrap_or_default()))
        }
    };
    [
        peer.id.to_string(),
        peer.pid.map_or_else(|| "other PID namespace".to_owned(), |pid| pid.to_string()),
        peer.uid.to_string(),
        attached,
        peer.state.to_string(),
        peer.last_sign_ms.map_or_else(|| "-".to_owned(), |ms| format!("{} ago", age(Duration::from_millis(ms)))),
        if peer.name.is_empty() { "-".to_owned() } else { peer.name.clone() },
        peer.detail.clone(),
    ]
}

/// `850 ms`, `12.3 s`, `4 min`, `2 h`.
fn age(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", d.as_secs_f64()),
        60_000..7_200_000 => format!("{} min", d.as_secs() / 60),
        _ => format!("{} h", d.as_secs() / 3600),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use gpu_ipc::BackendKind;
    use gpu_ipc::toolkit::door::{ObjectKind, PeerState};

    #[test]
    fn the_table_names_each_peer_and_a_hidden_pid() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let peer = |id, pid, state, name: &str| PeerStatus {
            id,
            pid,
            uid: 1000,
            gid: 1000,
            since_unix_ms: 1_000_000_000 - 90_000,
            last_sign_ms: Some(120),
            state,
            name: name.to_owned(),
            detail: "released frame 7; the producer is at frame 9".to_owned(),
        };
        let report = StatusReport {
            kind: ObjectKind::Ring,
            backend: BackendKind::Vmm,
            owner_pid: 42,
            peers: vec![peer(0, Some(4321), PeerState::Attached, "viewer"), peer(3, None, PeerState::Lost, "")],
        };
        let text = render(Path::new("/run/cam.sock"), &report, now);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "ring at /run/cam.sock (backend vmm, owner pid 42): 2 peers");
        assert!(lines[1].starts_with("PEER  PID"), "{text}");
        assert!(lines[2].contains("4321") && lines[2].contains("viewer") && lines[2].contains("1 min ago"), "{text}");
        assert!(lines[2].contains("attached") && lines[2].contains("120 ms ago"), "{text}");
        assert!(lines[3].contains("other PID namespace") && lines[3].contains("lost"), "{text}");
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn ages_read_like_a_person_would_say_them() {
        assert_eq!(age(Duration::from_millis(850)), "850 ms");
        assert_eq!(age(Duration::from_millis(12_345)), "12.3 s");
        assert_eq!(age(Duration::from_secs(240)), "4 min");
        assert_eq!(age(Duration::from_secs(3 * 3600)), "3 h");
    }
}
