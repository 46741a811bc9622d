//! `gpu-ipc probe crash` on the command line, without a GPU: its help and its argument checks.

use std::process::Command;

mod common;

fn gpu_ipc(args: &[&str]) -> std::process::Output {
    match Command::new(common::gpu_ipc_exe()).args(args).output() {
        Ok(output) => output,
        Err(e) => panic!("could not run gpu-ipc: {e}"),
    }
}

#[test]
fn help_names_the_question_and_every_option() {
    let output = gpu_ipc(&["probe", "crash", "--help"]);
    assert_eq!(output.status.code(), Some(0));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("Does shared memory survive the death"), "{text}");
    for option in [
        "--json",
        "--quick",
        "--out",
        "--device",
        "--no-progress",
        "--repetitions",
        "--mib",
        "--backend",
        "--max-seconds",
    ] {
        assert!(text.contains(option), "{option} missing from:\n{text}");
    }
}

#[test]
fn out_of_range_arguments_are_usage_errors() {
    for args in [["--repetitions", "0"], ["--mib", "1"], ["--max-seconds", "0"]] {
        let output = gpu_ipc(&["probe", "crash", args[0], args[1]]);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }
}
