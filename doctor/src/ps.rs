//! `gpu-ipc ps SOCKET`: who is attached to a ring, pool, semaphore or work queue, as its owner knows it. Asks the
//! owner over its socket (a status request: no CUDA, no record taken) and prints a table or JSON. On a weight set's
//! socket (a pool whose buffers are the arenas `SET/GENERATION`) it also lists the sets, the newest generation the
//! owner published, and which reader holds which generation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use gpu_ipc::toolkit::door::{self, ObjectKind, PeerStatus, StatusReport};
use harness::exit::{EXIT_FAILED, EXIT_OK};
use serde::Serialize;

/// The options of `gpu-ipc ps`.
#[derive(Debug, Args)]
pub struct PsArgs {
    /// The socket of the ring's producer or of the object's owner.
    pub socket: PathBuf,
    /// Print the report as JSON (`path`, `kind`, `backend`, `owner_pid`, `peers`: `id`, `pid` (null: another PID
    /// namespace), `uid`, `gid`, `since_unix_ms`, `last_sign_ms` (null: none known), `state`, `name`, `detail`;
    /// on a weight set's socket `weight_sets`: `set`, `newest` (null: unknown), `generations`: `generation`,
    /// `holders`: `peer`, `pid`).
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
    #[serde(skip_serializing_if = "Vec::is_empty")]
    weight_sets: Vec<WeightSet>,
}

/// A weight set served at a pool's socket, as its readers' holds show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WeightSet {
    /// The set's name.
    pub set: String,
    /// The newest generation the owner published (the pool's note word), when a reader's line carries it.
    pub newest: Option<u64>,
    /// The generations readers hold, oldest first, each with who holds it.
    pub generations: Vec<HeldGeneration>,
}

/// One generation of a weight set and the readers that hold it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldGeneration {
    /// The generation.
    pub generation: u64,
    /// Its holders.
    pub holders: Vec<Holder>,
}

/// A reader holding a generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    /// Its peer number.
    pub peer: u32,
    /// Its pid (`None`: another PID namespace).
    pub pid: Option<u32>,
}

/// The weight sets a pool's status shows: every pinned buffer named `SET/GENERATION` in a peer's detail (`note N;
/// holds V views of B buffers: NAME, NAME`, as many names as fit its line), grouped by set; empty for any other
/// object, or a pool whose buffers are not arenas.
pub fn weight_sets(report: &StatusReport) -> Vec<WeightSet> {
    if report.kind != ObjectKind::Pool {
        return Vec::new();
    }
    /// Per set: the newest generation seen in a note, and the holders of each generation.
    type Seen = (Option<u64>, BTreeMap<u64, Vec<Holder>>);
    let mut sets: BTreeMap<String, Seen> = BTreeMap::new();
    for peer in &report.peers {
        // A reader of a set on several devices is one peer per part, each detail after `part K: `: every part's
        // reader is listed as a holder, and the note is part 0's and the others' alike (they publish together).
        let detail = match peer.detail.strip_prefix("part ").and_then(|rest| rest.split_once(": ")) {
            Some((part, rest)) if part.parse::<u32>().is_ok() => rest,
            _ => peer.detail.as_str(),
        };
        let (note, holds) = match detail.split_once("; ") {
            Some((note, rest)) if note.starts_with("note ") => (note["note ".len()..].parse::<u64>().ok(), rest),
            _ => (None, detail),
        };
        let Some((_, names)) = holds.split_once(" buffers: ") else { continue };
        for name in names.split(", ") {
            let Some((set, generation)) = name.rsplit_once('/') else { continue };
            let Ok(generation) = generation.parse::<u64>() else { continue };
            let (newest, generations) = sets.entry(set.to_owned()).or_default();
            *newest = (*newest).max(note);
            generations.entry(generation).or_default().push(Holder { peer: peer.id, pid: peer.pid });
        }
    }
    sets.into_iter()
        .map(|(set, (newest, generations))| WeightSet {
            set,
            newest,
            generations: generations
                .into_iter()
                .map(|(generation, holders)| HeldGeneration { generation, holders })
                .collect(),
        })
        .collect()
}

/// Runs `gpu-ipc ps`; returns the exit status: 0 the owner answered, 1 it could not be asked (nothing listens,
/// another user's socket, no answer in time).
pub fn main(args: &PsArgs) -> u8 {
    let timeout = Duration::try_from_secs_f64(args.timeout.max(0.001)).unwrap_or(Duration::from_secs(2));
    match door::status(&args.socket, timeout) {
        Ok(report) => {
            if args.json {
                let json = PsJson { path: &args.socket, report: &report, weight_sets: weight_sets(&report) };
                match serde_json::to_string_pretty(&json) {
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
    for set in weight_sets(report) {
        let newest = set.newest.map_or_else(|| "unknown".to_owned(), |n| n.to_string());
        out.push_str(&format!("weight set {}: newest generation {newest}\n", set.set));
        for held in &set.generations {
            let holders: Vec<String> = held
                .holders
                .iter()
                .map(|h| match h.pid {
                    Some(pid) => format!("pid {pid} (peer {})", h.peer),
                    None => format!("peer {} (other PID namespace)", h.peer),
                })
                .collect();
            out.push_str(&format!("  generation {} held by {}\n", held.generation, holders.join(", ")));
        }
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
    use gpu_ipc::toolkit::door::PeerState;

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

    fn pool_peer(id: u32, pid: Option<u32>, detail: &str) -> PeerStatus {
        PeerStatus {
            id,
            pid,
            uid: 0,
            gid: 0,
            since_unix_ms: 0,
            last_sign_ms: None,
            state: PeerState::Attached,
            name: "weights reader of llama".to_owned(),
            detail: detail.to_owned(),
        }
    }

    #[test]
    fn weight_sets_are_read_from_the_readers_holds() {
        let report = StatusReport {
            kind: ObjectKind::Pool,
            backend: BackendKind::Vmm,
            owner_pid: 7,
            peers: vec![
                pool_peer(0, Some(100), "note 4; holds 2 views of 2 buffers: llama/3, mistral/9"),
                pool_peer(1, None, "note 4; holds 1 views of 1 buffers: llama/4"),
                pool_peer(2, Some(102), "holds 3 views of 1 buffers: llama/3"),
                pool_peer(3, Some(103), "holds 0 views of 0 buffers"),
                pool_peer(4, Some(104), "note 4; holds 1 views of 1 buffers: scratch, llama/x"),
            ],
        };
        // A set of parts: the same reader as one peer per part, each detail naming its part.
        let parts = StatusReport {
            peers: vec![
                pool_peer(5, Some(105), "part 0: note 6; holds 1 views of 1 buffers: moe/6"),
                pool_peer(6, Some(105), "part 1: note 6; holds 1 views of 1 buffers: moe/6"),
            ],
            ..report.clone()
        };
        let holder = |peer, pid| Holder { peer, pid };
        assert_eq!(
            weight_sets(&parts),
            [WeightSet {
                set: "moe".into(),
                newest: Some(6),
                generations: vec![HeldGeneration {
                    generation: 6,
                    holders: vec![holder(5, Some(105)), holder(6, Some(105))]
                }],
            }]
        );
        let sets = weight_sets(&report);
        let holder = |peer, pid| Holder { peer, pid };
        assert_eq!(
            sets,
            [
                WeightSet {
                    set: "llama".into(),
                    newest: Some(4),
                    generations: vec![
                        HeldGeneration { generation: 3, holders: vec![holder(0, Some(100)), holder(2, Some(102))] },
                        HeldGeneration { generation: 4, holders: vec![holder(1, None)] },
                    ],
                },
                WeightSet {
                    set: "mistral".into(),
                    newest: Some(4),
                    generations: vec![HeldGeneration { generation: 9, holders: vec![holder(0, Some(100))] }],
                },
            ]
        );
        let ring = StatusReport { kind: ObjectKind::Ring, ..report };
        assert!(weight_sets(&ring).is_empty());
    }

    /// A weight set served on the host backend, a reader holding generation 1 while the owner publishes 2: `ps`
    /// asks the owner's socket and names the set, the newest generation and who holds which.
    #[test]
    fn ps_on_a_weight_sets_socket_lists_the_sets_generations_and_holders() {
        use gpu_ipc::host::{Host, HostContext};
        use gpu_ipc::weights::{DType, TensorDesc, WeightsOptions, WeightsOwner, WeightsReader};

        let socket = std::env::temp_dir().join(format!("gpu-ipc-ps-weights-{}.sock", std::process::id()));
        let tensors = vec![("w".to_owned(), TensorDesc::contiguous(DType::F32, [4]).unwrap())];
        let mut owner =
            WeightsOwner::<Host>::create(&HostContext, &socket, "llama", tensors, WeightsOptions::default()).unwrap();
        owner.update(&[("w", &[1u8; 16][..])]).unwrap();
        let reader = WeightsReader::<Host>::open(&HostContext, &socket, "llama", Duration::from_secs(5)).unwrap();
        owner.update(&[("w", &[2u8; 16][..])]).unwrap();
        // The owner records the reader's pin when its door has handled the attach: wait for it (bounded).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let report = loop {
            let report = door::status(&socket, Duration::from_secs(2)).unwrap();
            if !weight_sets(&report).is_empty() || std::time::Instant::now() > deadline {
                break report;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let text = render(&socket, &report, SystemTime::now());
        assert!(text.contains("weight set llama: newest generation 2"), "{text}");
        let me = std::process::id();
        assert!(text.contains(&format!("  generation 1 held by pid {me} (peer ")), "{text}");
        assert_eq!(reader.generation(), 1);
        drop(reader);
        drop(owner);
    }

    #[test]
    fn ages_read_like_a_person_would_say_them() {
        assert_eq!(age(Duration::from_millis(850)), "850 ms");
        assert_eq!(age(Duration::from_millis(12_345)), "12.3 s");
        assert_eq!(age(Duration::from_secs(240)), "4 min");
        assert_eq!(age(Duration::from_secs(3 * 3600)), "3 h");
    }
}
