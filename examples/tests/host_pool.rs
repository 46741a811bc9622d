//! The `pool` example program on the host backend (no GPU): `bench` runs an owner and an importer process, and
//! the importer finds and checks every buffer; `owner` and `importer` run as separate programs too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Proc, exe, socket};

#[test]
fn bench_checks_every_buffer_and_reports_attach_and_lookup_costs() {
    let out = Command::new(exe("pool"))
        .args(["bench", "--backend", "host", "--capacity-mib", "16", "--buffers", "24", "--attaches", "3"])
        .args(["--rounds", "50", "--json"])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", out.status);
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let importer = &summary["importer"];
    assert_eq!(summary["capacity_bytes"], 16 << 20, "{summary}");
    assert_eq!((importer["buffers"].as_u64(), importer["verified"].as_u64()), (Some(24), Some(24)), "{summary}");
    assert_eq!(importer["mismatched_words"], 0);
    assert_eq!(importer["attaches"], 3);
    assert_eq!(importer["lookups"], 24 * 50);
    assert!(importer["attach_ms_p50"].as_f64().unwrap() > 0.0 && importer["lookup_ns_p50"].as_f64().unwrap() > 0.0);
}

#[test]
fn an_owner_program_serves_an_importer_program_until_its_stdin_closes() {
    let sock = socket("pool-owner");
    let owner_args: Vec<String> = ["owner", "--backend", "host", "--capacity-mib", "4", "--buffers", "8", "--json"]
        .iter()
        .map(ToString::to_string)
        .chain(["--socket".to_owned(), sock.to_str().unwrap().to_owned()])
        .collect();
    let mut owner = Proc::spawn("pool owner", exe("pool"), &owner_args);
    owner.wait_for_line("READY", Duration::from_secs(20));
    let out = Command::new(exe("pool"))
        .args(["importer", "--backend", "host", "--attaches", "2", "--rounds", "10", "--json", "--socket"])
        .arg(&sock)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", out.status);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((report["buffers"].as_u64(), report["verified"].as_u64()), (Some(8), Some(8)), "{report}");
    owner.close_stdin();
    let (status, _, summary) = owner.finish(Duration::from_secs(10));
    assert!(status.success(), "{status}");
    assert_eq!(summary["buffers"], 8, "{summary}");
    assert_eq!(summary["stats"]["importers"], 0, "{summary}");
    assert_eq!(summary["stats"]["live_buffers"], 8, "{summary}");
}
