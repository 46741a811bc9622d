//! Memory shared in place over several allocations side by side (what PyTorch's expandable segments make on a GPU),
//! between real processes on the host backend: the owner in the test process maps 20 allocations side by side
//! (`Host::allocate_side_by_side`), shares ranges inside one, over two, over twelve (more than one message of
//! fds) and over all of them; an importer child started from this test binary checks every byte of each, the owner
//! lets go of the memory and frees the buffers while the child holds its views, the child checks every byte again,
//! and once it is gone nothing stays shared and no fd is left open.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ipc_core::backend::SharedRegion;
use ipc_core::host::{Host, HostContext};
use ipc_toolkit::pool::{AttachOptions, PoolConfig, PoolImporter, SharedPool};

const ROLE: &str = "GPU_IPC_SIDE_BY_SIDE_CHILD";
const SOCKET: &str = "GPU_IPC_SIDE_BY_SIDE_SOCKET";
/// Allocations side by side, and pages in each.
const ALLOCATIONS: u64 = 20;
const PAGES_EACH: u64 = 16;

fn page() -> u64 {
    rustix::param::page_size() as u64
}

/// The byte at offset `i` of the whole range.
fn byte(i: u64) -> u8 {
    (i.wrapping_mul(0x9e37_79b9) >> 13) as u8
}

/// (name, offset, len) of each shared range: inside one allocation, over two, over twelve, over all.
fn ranges() -> Vec<(&'static str, u64, u64)> {
    let each = PAGES_EACH * page();
    vec![
        ("inside", 3 * each + 100, each - 200),
        ("two", each - 8, 16),
        ("twelve", 4 * each + 12, 11 * each),
        ("all", 0, ALLOCATIONS * each),
    ]
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Not a test of its own: the body of the importer child. Without the role variable it does nothing.
#[test]
#[ignore = "child-process entry point; run by the cross-process test, not on its own"]
fn child_process_entry_point() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let path = PathBuf::from(std::env::var(SOCKET).unwrap());
    let options = AttachOptions { name: "side-by-side".into(), timeout: Duration::from_secs(10) };
    let pool = PoolImporter::<Host>::attach(&HostContext, &path, &options).unwrap();
    let views: Vec<_> =
        ranges().into_iter().map(|(name, offset, len)| (pool.lookup(name).unwrap(), offset, len)).collect();
    let check = |round: &str| {
        for (view, offset, len) in &views {
            let mut seen = vec![0u8; *len as usize];
            view.read(0, &mut seen).unwrap();
            let wrong = seen.iter().enumerate().filter(|(i, b)| **b != byte(offset + *i as u64)).count();
            println!("{round} {} bytes={len} wrong={wrong}", view.name());
        }
    };
    check("CHECKED");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    check("RECHECKED");
}

#[test]
fn ranges_over_allocations_side_by_side_are_read_by_another_process_byte_for_byte_and_outlive_their_allocator() {
    let path = std::env::temp_dir().join(format!("gpu-ipc-side-by-side-{}.sock", std::process::id()));
    let pool = SharedPool::<Host>::create(&HostContext, &path, PoolConfig::sharing_only()).unwrap();
    let fds_before = open_fds();
    let sizes = vec![PAGES_EACH * page(); ALLOCATIONS as usize];
    let region = Host::allocate_side_by_side(&HostContext, &sizes).unwrap();
    let all: Vec<u8> = (0..region.len()).map(byte).collect();
    region.write(region.ptr(), &all).unwrap();
    let handles: Vec<_> = ranges()
        .into_iter()
        .map(|(name, offset, len)| pool.share_existing(name, region.ptr().offset(offset), len, None).unwrap())
        .collect();
    assert_eq!(pool.stats().shared_allocations, 4);

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry_point", "--ignored", "--nocapture", "--test-threads=1"])
        .env(ROLE, "importer")
        .env(SOCKET, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let results = |lines: &mut std::io::Lines<BufReader<std::process::ChildStdout>>, round: &str| {
        let mut seen = Vec::new();
        while seen.len() < ranges().len() {
            let line = lines.next().expect("the child ended early").unwrap();
            // The harness may print the test's name on the same line, before the first one.
            if let Some((_, rest)) = line.split_once(&format!("{round} ")) {
                seen.push(rest.to_owned());
            }
        }
        seen
    };
    let expected: Vec<String> = ranges().iter().map(|(name, _, len)| format!("{name} bytes={len} wrong=0")).collect();
    assert_eq!(results(&mut lines, "CHECKED"), expected);

    // The owner's allocator lets go, and the buffers are freed, while the child holds its views.
    drop(region);
    for handle in handles {
        pool.free(handle).unwrap();
    }
    assert_eq!(pool.stats().shared_allocations, 4, "the child's views hold every block");
    writeln!(child.stdin.as_mut().unwrap(), "again").unwrap();
    assert_eq!(results(&mut lines, "RECHECKED"), expected, "the bytes outlive the owner's allocator");
    assert!(child.wait().unwrap().success());
    drop((child, lines));

    // The pool's threads see the importer's hang-up and let go on their own time: wait for both (the shares, then
    // the fds: the connection's is closed after the last share goes), as the other pool tests wait for theirs.
    let start = Instant::now();
    while (pool.stats().shared_allocations != 0 || open_fds() != fds_before) && start.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(pool.stats().shared_allocations, 0, "nothing stays shared once the importer is gone");
    assert_eq!(open_fds(), fds_before, "every allocation's fd is closed");
}
