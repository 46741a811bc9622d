//! The hidden helper command, without a GPU: `gpu-ipc helper --socket PATH` (and its first name, `probe-child`)
//! connects to the parent's socket, reads its task in the helper channel's framing, answers a role no room owns
//! with a failure message and exit status 1, and routes the doctor's self-test role to the doctor (which, with the
//! driver hidden by `GPU_IPC_LIBCUDA`, answers with its failure and the fix); `--help` does not list it.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

/// One helper-channel message: a 4-byte little-endian length, a 4-byte fd count (0 here), then the JSON.
fn frame(json: &serde_json::Value) -> Vec<u8> {
    let body = serde_json::to_vec(json).unwrap_or_else(|e| panic!("{e}"));
    let mut bytes = u32::try_from(body.len()).unwrap_or_else(|e| panic!("{e}")).to_le_bytes().to_vec();
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&body);
    bytes
}

/// Starts `gpu-ipc <command> --socket ...` (with `env`), gives it `task`, and returns what it answered, its exit
/// status and its stderr.
fn answer_through(
    command: &str,
    task: &serde_json::Value,
    env: &[(&str, &str)],
) -> (serde_json::Value, Option<i32>, String) {
    let dir = std::env::temp_dir().join(format!("gpu-ipc-helper-cli-{}-{command}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let socket = dir.join("helper.sock");
    let listener = UnixListener::bind(&socket).unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(common::gpu_ipc_exe())
        .envs(env.iter().copied())
        .arg(command)
        .arg("--socket")
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let (mut stream, _) = listener.accept().unwrap_or_else(|e| panic!("{e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap_or_else(|e| panic!("{e}"));
    stream.write_all(&frame(task)).unwrap_or_else(|e| panic!("{e}"));
    let mut header = [0u8; 8];
    stream.read_exact(&mut header).unwrap_or_else(|e| panic!("{command}: no answer: {e}"));
    let [l0, l1, l2, l3, f0, f1, f2, f3] = header;
    assert_eq!(u32::from_le_bytes([f0, f1, f2, f3]), 0, "a failure carries no fds");
    let mut body = vec![0u8; u32::from_le_bytes([l0, l1, l2, l3]) as usize];
    stream.read_exact(&mut body).unwrap_or_else(|e| panic!("{e}"));
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{e}"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
            break status;
        }
        assert!(Instant::now() < deadline, "{command}: the helper did not exit");
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        pipe.read_to_string(&mut stderr).unwrap_or_else(|e| panic!("{e}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    (answer, status.code(), stderr)
}

#[test]
fn the_helper_and_its_first_name_refuse_an_unknown_role_over_the_channel() {
    let task = serde_json::json!({"role": "nobody-knows", "params": null});
    for command in ["helper", "probe-child"] {
        let (answer, code, stderr) = answer_through(command, &task, &[]);
        assert_eq!(answer["error"], "unknown helper role \"nobody-knows\"", "{command}: {answer}");
        assert_eq!(code, Some(1), "{command}: {stderr}");
        assert!(stderr.starts_with("gpu-ipc helper (nobody-knows): unknown helper role"), "{command}: {stderr}");
    }
}

#[test]
fn the_doctors_self_test_role_reaches_the_doctor_and_answers_with_the_fix() {
    let params = serde_json::json!({"backend": "legacy", "sync": "cpu-spin", "device": 0, "socket": "/nonexistent"});
    let task = serde_json::json!({"role": "doctor-self-test", "params": params});
    let (answer, code, stderr) = answer_through("helper", &task, &[("GPU_IPC_LIBCUDA", "/nonexistent/libcuda.so.1")]);
    assert_eq!(answer["fix"], "install the NVIDIA driver", "{answer}");
    assert!(answer["reason"].as_str().is_some_and(|r| r.contains("libcuda")), "{answer}");
    assert_eq!(code, Some(0), "the answer is the outcome: {stderr}");
}

#[test]
fn the_helper_is_not_listed_in_help() {
    let out = Command::new(common::gpu_ipc_exe()).arg("--help").output().unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text.contains("bench") && !text.contains("helper") && !text.contains("probe-child"), "{text}");
}
