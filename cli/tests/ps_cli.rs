//! `gpu-ipc ps` against a live ring of the host backend (no GPU): the table, the JSON, and the exit status when
//! nothing listens.

use std::process::Command;
use std::time::Duration;

use gpu_ipc::core::frames::{AttachOptions, Consumer, Producer, ProducerConfig};
use gpu_ipc::core::host::{Host, HostContext};
use gpu_ipc::core::wire::{FrameGeometry, PixelFormat, SyncStrategy};

mod common;

const T: Duration = Duration::from_secs(10);

#[test]
fn ps_lists_a_rings_consumer_as_a_table_and_as_json() {
    let path = std::env::temp_dir().join(format!("gpu-ipc-ps-cli-{}.sock", std::process::id()));
    let geometry = FrameGeometry::new(64, 16, PixelFormat::Rgba8).unwrap_or_else(|e| panic!("{e}"));
    let config = ProducerConfig::new(&path, geometry, 2, SyncStrategy::CpuSpin);
    let mut producer = Producer::<Host>::create(&HostContext, config).unwrap_or_else(|e| panic!("{e}"));
    let attacher = {
        let path = path.clone();
        std::thread::spawn(move || {
            let options = AttachOptions { name: "cli-viewer".into(), timeout: T, ..AttachOptions::default() };
            Consumer::<Host>::attach(&HostContext, &path, &options).unwrap_or_else(|e| panic!("{e}"))
        })
    };
    producer.wait_for_consumers(1, T).unwrap_or_else(|e| panic!("{e}"));
    let consumer = attacher.join().unwrap_or_else(|_| panic!("attach panicked"));

    let out = Command::new(common::gpu_ipc_exe()).arg("ps").arg(&path).output().unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text.starts_with(&format!("ring at {} (backend host", path.display())), "{text}");
    assert!(text.contains("1 peer\n"), "{text}");
    let row = text.lines().nth(2).unwrap_or_default();
    assert!(
        row.contains("cli-viewer") && row.contains("attached") && row.contains(&std::process::id().to_string()),
        "{text}"
    );

    let out = Command::new(common::gpu_ipc_exe())
        .args(["ps", "--json"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(json["kind"], "ring");
    assert_eq!(json["backend"], "host");
    assert_eq!(json["owner_pid"], std::process::id());
    assert_eq!(json["peers"][0]["name"], "cli-viewer");
    assert_eq!(json["peers"][0]["state"], "attached");
    assert_eq!(json["peers"][0]["pid"], std::process::id());
    drop(consumer);
}

#[test]
fn ps_with_nothing_listening_says_so_and_exits_1() {
    let path = std::env::temp_dir().join(format!("gpu-ipc-ps-cli-nobody-{}.sock", std::process::id()));
    let out = Command::new(common::gpu_ipc_exe()).arg("ps").arg(&path).output().unwrap_or_else(|e| panic!("{e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr.starts_with("gpu-ipc ps: nothing listens at "), "{stderr}");
    assert!(out.stdout.is_empty());
}
