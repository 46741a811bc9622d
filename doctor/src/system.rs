//! Facts about the machine that decide whether CUDA IPC can work, read without CUDA.
//!
//! Every probe reads from paths held in a [`SystemRoot`], so tests point it at a fake `/proc` tree in a temporary
//! folder; the parsers behind the probes are pure functions. A probe never fails: what it cannot read becomes
//! [`Fact::Unknown`] with the reason, because a doctor that stops at the first unreadable file helps nobody.

use std::io;
use std::path::{Path, PathBuf};

use harness::fact::Fact;
use harness::mps::{MpsStatus, probe_mps};
use serde::{Deserialize, Serialize};

use crate::transport::NetworkTransport;

/// Inode of the initial PID namespace (`PROC_PID_INIT_INO` in the kernel's `proc_ns.h`, fixed since Linux 3.8).
pub const INITIAL_PID_NAMESPACE_INODE: u64 = 0xEFFF_FFFC;

/// Inode of the initial IPC namespace (`PROC_IPC_INIT_INO` in the kernel's `proc_ns.h`).
pub const INITIAL_IPC_NAMESPACE_INODE: u64 = 0xEFFF_FFFF;

/// Words in a cgroup path that mean "this process runs in a container".
const CONTAINER_CGROUP_WORDS: [&str; 5] = ["docker", "kubepods", "containerd", "libpod", "lxc"];

/// Where the probes read from. [`SystemRoot::real`] is this machine; `SystemRoot::under` (tests only) is a fake tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemRoot {
    /// The procfs mount, normally `/proc`.
    pub proc_dir: PathBuf,
    /// The device folder, normally `/dev`.
    pub dev_dir: PathBuf,
    /// The POSIX shared-memory mount, normally `/dev/shm`.
    pub dev_shm: PathBuf,
    /// The file-system root, where container runtimes leave `/.dockerenv` and `/run/.containerenv`.
    pub fs_root: PathBuf,
    /// The value of the `container` environment variable (set by systemd-nspawn, podman, LXC), if any.
    pub container_env: Option<String>,
    /// Where the MPS control pipe would be: `CUDA_MPS_PIPE_DIRECTORY`, or [`harness::mps::DEFAULT_MPS_PIPE_DIRECTORY`].
    pub mps_pipe_directory: PathBuf,
    /// Whether `mps_pipe_directory` came from `CUDA_MPS_PIPE_DIRECTORY`.
    pub mps_pipe_directory_from_env: bool,
    /// The sysfs mount, normally `/sys` (RDMA devices).
    pub sys_dir: PathBuf,
    /// `UCX_TLS` and `UCX_NET_DEVICES` of the environment, if set.
    pub ucx_env: (Option<String>, Option<String>),
}

impl SystemRoot {
    /// The real machine: `/proc`, `/dev`, `/dev/shm`, `/sys`, `/`, and the process environment.
    pub fn real() -> Self {
        let (mps_pipe_directory, mps_pipe_directory_from_env) = harness::mps::pipe_directory();
        Self {
            proc_dir: PathBuf::from("/proc"),
            dev_dir: PathBuf::from("/dev"),
            dev_shm: PathBuf::from("/dev/shm"),
            fs_root: PathBuf::from("/"),
            container_env: std::env::var("container").ok().filter(|value| !value.is_empty()),
            mps_pipe_directory,
            mps_pipe_directory_from_env,
            sys_dir: PathBuf::from("/sys"),
            ucx_env: (std::env::var("UCX_TLS").ok(), std::env::var("UCX_NET_DEVICES").ok()),
        }
    }

    /// A fake machine whose `/proc`, `/dev`, `/dev/shm`, `/sys`, `/` and `/tmp/nvidia-mps` all lie under `root`, with no
    /// environment variables set.
    #[cfg(test)]
    pub fn under(root: &Path) -> Self {
        Self {
            proc_dir: root.join("proc"),
            dev_dir: root.join("dev"),
            dev_shm: root.join("dev/shm"),
            fs_root: root.to_path_buf(),
            container_env: None,
            mps_pipe_directory: root.join("tmp/nvidia-mps"),
            mps_pipe_directory_from_env: false,
            sys_dir: root.join("sys"),
            ucx_env: (None, None),
        }
    }
}

impl Default for SystemRoot {
    fn default() -> Self {
        Self::real()
    }
}

/// Everything the doctor knows about the machine outside CUDA.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemReport {
    /// The running kernel's release, from `uname(2)`.
    pub kernel_release: String,
    /// This process's PID namespace. Legacy CUDA IPC and `pidfd_getfd` need both processes to see each other's
    /// pids; passing an fd with `SCM_RIGHTS` (the vmm backend) does not care.
    pub pid_namespace: Fact<NamespaceInfo>,
    /// This process's IPC namespace. Containers that share CUDA IPC handles are usually started with `--ipc=host`.
    pub ipc_namespace: Fact<NamespaceInfo>,
    /// Yama's `ptrace_scope` (0 to 3). Unknown when Yama is not active, which leaves ptrace to the classic rules.
    pub ptrace_scope: Fact<u8>,
    /// Size and free space of `/dev/shm`.
    pub dev_shm: Fact<ShmSpace>,
    /// Whether the kernel is Windows Subsystem for Linux's.
    pub wsl: Fact<bool>,
    /// Signs that this process runs in a container.
    pub container: ContainerHints,
    /// Whether an MPS control daemon or server is running, or its control pipe exists.
    pub mps: MpsStatus,
    /// The loaded NVIDIA kernel module, from `/proc/driver/nvidia/version`.
    pub nvidia_kernel_module: Fact<NvidiaKernelModule>,
    /// Names of the `/dev/nvidia*` device nodes (e.g. `nvidia0`, `nvidiactl`, `nvidia-uvm`), sorted.
    pub device_nodes: Fact<Vec<String>>,
    /// What a ring bridged to another machine over NIXL (UCX) could move its frames with (absent from reports
    /// written before it was collected).
    #[serde(default)]
    pub transport: NetworkTransport,
}

/// A Linux namespace this process is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceInfo {
    /// The namespace's inode number, from the `/proc/self/ns/<kind>` link (`pid:[4026531836]`).
    pub inode: u64,
    /// Whether it is the host's initial namespace (the kernel's fixed inode for it).
    pub initial: bool,
    /// Whether PID 1 (the host's or the container's init) is in the same namespace; `None` when `/proc/1/ns` is not
    /// readable, which is the normal case for a user who is not root.
    pub same_as_pid1: Option<bool>,
}

/// Size of the `/dev/shm` file system, from `statvfs(3)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmSpace {
    /// Total size in bytes.
    pub total_bytes: u64,
    /// Bytes an unprivileged process may still use.
    pub free_bytes: u64,
}

/// Evidence that this process runs inside a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerHints {
    /// Whether any evidence was found.
    pub detected: bool,
    /// One line per piece of evidence (e.g. `/.dockerenv exists`), or per source that could not be read.
    pub evidence: Vec<String>,
}

/// The NVIDIA kernel module, as `/proc/driver/nvidia/version` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvidiaKernelModule {
    /// The driver version, e.g. `580.65.06`.
    pub version: String,
    /// Whether it is the open-source kernel module ("Open Kernel Module").
    pub open: bool,
    /// The `NVRM version:` line as written.
    pub description: String,
}

/// Reads every fact in [`SystemReport`] from `root`.
pub fn collect(root: &SystemRoot) -> SystemReport {
    let report = SystemReport {
        kernel_release: kernel_release(),
        pid_namespace: probe_namespace(&root.proc_dir, "pid", INITIAL_PID_NAMESPACE_INODE),
        ipc_namespace: probe_namespace(&root.proc_dir, "ipc", INITIAL_IPC_NAMESPACE_INODE),
        ptrace_scope: probe_ptrace_scope(&root.proc_dir),
        dev_shm: probe_dev_shm(&root.dev_shm),
        wsl: probe_wsl(&root.proc_dir),
        container: probe_container(root),
        mps: probe_mps(&root.proc_dir, &root.mps_pipe_directory, root.mps_pipe_directory_from_env),
        nvidia_kernel_module: probe_nvidia_kernel_module(&root.proc_dir),
        device_nodes: probe_device_nodes(&root.dev_dir),
        transport: crate::transport::probe(
            &root.sys_dir,
            &root.proc_dir,
            root.ucx_env.0.clone(),
            root.ucx_env.1.clone(),
        ),
    };
    tracing::debug!(?report, "system probes done");
    report
}

/// The running kernel's release, from `uname(2)` (which cannot fail).
pub fn kernel_release() -> String {
    rustix::system::uname().release().to_string_lossy().into_owned()
}

/// Reads the namespace of `kind` (`pid`, `ipc`, ...) from `<proc>/self/ns/<kind>` and compares it with
/// `initial_inode` and with PID 1's.
pub fn probe_namespace(proc_dir: &Path, kind: &str, initial_inode: u64) -> Fact<NamespaceInfo> {
    let own_link = proc_dir.join("self/ns").join(kind);
    let inode = match read_namespace_inode(&own_link, kind) {
        Ok(inode) => inode,
        Err(why) => return Fact::Unknown(why),
    };
    let same_as_pid1 =
        read_namespace_inode(&proc_dir.join("1/ns").join(kind), kind).ok().map(|pid1_inode| pid1_inode == inode);
    Fact::Known(NamespaceInfo { inode, initial: inode == initial_inode, same_as_pid1 })
}

fn read_namespace_inode(link: &Path, kind: &str) -> Result<u64, String> {
    let target = std::fs::read_link(link).map_err(|err| format!("cannot read link {}: {err}", link.display()))?;
    let text = target.to_string_lossy();
    parse_namespace_link(&text, kind)
        .ok_or_else(|| format!("{} points to {text:?}, not {kind}:[<inode>]", link.display()))
}

/// Parses a namespace link target such as `pid:[4026531836]` into its inode; `None` if it is not of `kind`.
pub fn parse_namespace_link(target: &str, kind: &str) -> Option<u64> {
    target.strip_prefix(kind)?.strip_prefix(":[")?.strip_suffix(']')?.parse().ok()
}

/// Reads Yama's `ptrace_scope` from `<proc>/sys/kernel/yama/ptrace_scope`.
pub fn probe_ptrace_scope(proc_dir: &Path) -> Fact<u8> {
    let path = proc_dir.join("sys/kernel/yama/ptrace_scope");
    match std::fs::read_to_string(&path) {
        Ok(text) => match parse_ptrace_scope(&text) {
            Ok(scope) => Fact::Known(scope),
            Err(why) => Fact::Unknown(format!("{}: {why}", path.display())),
        },
        Err(err) if err.kind() == io::ErrorKind::NotFound => Fact::Unknown(format!(
            "Yama is not active ({} does not exist); ptrace follows the classic uid and capability rules",
            path.display()
        )),
        Err(err) => Fact::Unknown(format!("cannot read {}: {err}", path.display())),
    }
}

/// Parses the contents of `ptrace_scope`: one number from 0 to 3.
pub fn parse_ptrace_scope(text: &str) -> Result<u8, String> {
    let trimmed = text.trim();
    match trimmed.parse::<u8>() {
        Ok(scope) if scope <= 3 => Ok(scope),
        _ => Err(format!("expected a number from 0 to 3, found {trimmed:?}")),
    }
}

/// Reads the size and free space of the shared-memory mount at `dev_shm` with `statvfs(3)`.
pub fn probe_dev_shm(dev_shm: &Path) -> Fact<ShmSpace> {
    match rustix::fs::statvfs(dev_shm) {
        Ok(stat) => Fact::Known(ShmSpace {
            total_bytes: stat.f_blocks.saturating_mul(stat.f_frsize),
            free_bytes: stat.f_bavail.saturating_mul(stat.f_frsize),
        }),
        Err(err) => Fact::Unknown(format!("statvfs({}) failed: {err}", dev_shm.display())),
    }
}

/// Whether the kernel is WSL's, from `<proc>/sys/kernel/osrelease`.
pub fn probe_wsl(proc_dir: &Path) -> Fact<bool> {
    let path = proc_dir.join("sys/kernel/osrelease");
    match std::fs::read_to_string(&path) {
        Ok(release) => Fact::Known(is_wsl_release(&release)),
        Err(err) => Fact::Unknown(format!("cannot read {}: {err}", path.display())),
    }
}

/// Whether a kernel release names WSL: WSL 2 kernels end in `-microsoft-standard-WSL2`, WSL 1 in `-Microsoft`.
pub fn is_wsl_release(release: &str) -> bool {
    let lower = release.to_ascii_lowercase();
    lower.contains("microsoft") || lower.contains("wsl")
}

/// Looks for container evidence: marker files, cgroup paths, the `container` environment variable.
pub fn probe_container(root: &SystemRoot) -> ContainerHints {
    let mut evidence = Vec::new();
    let mut detected = false;
    for marker in [".dockerenv", "run/.containerenv"] {
        let path = root.fs_root.join(marker);
        if path.exists() {
            detected = true;
            evidence.push(format!("{} exists", path.display()));
        }
    }
    let cgroup_path = root.proc_dir.join("self/cgroup");
    match std::fs::read_to_string(&cgroup_path) {
        Ok(cgroups) => {
            for line in container_cgroup_lines(&cgroups) {
                detected = true;
                evidence.push(format!("{} mentions a container runtime: {line}", cgroup_path.display()));
            }
        }
        Err(err) => evidence.push(format!("cannot read {}: {err}", cgroup_path.display())),
    }
    if let Some(value) = &root.container_env {
        detected = true;
        evidence.push(format!("environment variable container={value}"));
    }
    ContainerHints { detected, evidence }
}

/// The lines of a `/proc/<pid>/cgroup` file whose path names a container runtime.
pub fn container_cgroup_lines(cgroups: &str) -> Vec<&str> {
    cgroups
        .lines()
        .filter(|line| {
            // Format: hierarchy-id:controllers:path; only the path says anything about containers.
            let path = line.splitn(3, ':').nth(2).unwrap_or("");
            CONTAINER_CGROUP_WORDS.iter().any(|word| path.contains(word))
        })
        .collect()
}

/// Reads the NVIDIA kernel module's version from `<proc>/driver/nvidia/version`.
pub fn probe_nvidia_kernel_module(proc_dir: &Path) -> Fact<NvidiaKernelModule> {
    let path = proc_dir.join("driver/nvidia/version");
    match std::fs::read_to_string(&path) {
        Ok(text) => parse_nvidia_version(&text)
            .map_or_else(|| Fact::Unknown(format!("{}: no NVRM version line", path.display())), Fact::Known),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Fact::Unknown(format!(
            "{} does not exist: the NVIDIA kernel module is not loaded here (normal inside WSL, and in containers \
             that do not mount it)",
            path.display()
        )),
        Err(err) => Fact::Unknown(format!("cannot read {}: {err}", path.display())),
    }
}

/// Parses `/proc/driver/nvidia/version`, e.g.
/// `NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (...)`.
pub fn parse_nvidia_version(text: &str) -> Option<NvidiaKernelModule> {
    let line = text.lines().find(|line| line.starts_with("NVRM version:"))?;
    let version = line.split_whitespace().find(|word| looks_like_driver_version(word))?;
    Some(NvidiaKernelModule {
        version: version.to_owned(),
        open: line.contains("Open Kernel Module"),
        description: line.trim().to_owned(),
    })
}

/// A driver version is dotted digits with at least one dot (`580.65.06`, `535.104`); `x86_64` is not one.
fn looks_like_driver_version(word: &str) -> bool {
    word.contains('.') && word.split('.').all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
}

/// Lists the `nvidia*` device nodes in `dev_dir`.
pub fn probe_device_nodes(dev_dir: &Path) -> Fact<Vec<String>> {
    match std::fs::read_dir(dev_dir) {
        Ok(entries) => {
            let mut names: Vec<String> = entries
                .flatten()
                .filter_map(|entry| entry.file_name().to_str().map(str::to_owned))
                .filter(|name| name.starts_with("nvidia"))
                .collect();
            names.sort();
            Fact::Known(names)
        }
        Err(err) => Fact::Unknown(format!("cannot list {}: {err}", dev_dir.display())),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use harness::mps::{MpsProcess, MpsRole};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh, empty folder for one fake machine, removed on drop.
    struct FakeRoot(PathBuf);

    impl FakeRoot {
        fn new() -> Self {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "gpu-ipc-doctor-test-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn write(&self, relative: &str, contents: &[u8]) {
            let path = self.0.join(relative);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, contents).unwrap();
        }

        fn symlink(&self, relative: &str, target: &str) {
            let path = self.0.join(relative);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(target, path).unwrap();
        }

        fn mkfifo(&self, relative: &str) {
            let path = self.0.join(relative);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &path,
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o600),
                0,
            )
            .unwrap();
        }

        fn root(&self) -> SystemRoot {
            SystemRoot::under(&self.0)
        }
    }

    impl Drop for FakeRoot {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn namespace_link_parses_only_its_kind() {
        assert_eq!(parse_namespace_link("pid:[4026531836]", "pid"), Some(4_026_531_836));
        assert_eq!(parse_namespace_link("ipc:[4026532200]", "ipc"), Some(4_026_532_200));
        assert_eq!(parse_namespace_link("ipc:[4026532200]", "pid"), None);
        assert_eq!(parse_namespace_link("pid:[abc]", "pid"), None);
        assert_eq!(parse_namespace_link("pid:4026531836", "pid"), None);
    }

    #[test]
    fn ptrace_scope_accepts_zero_to_three() {
        assert_eq!(parse_ptrace_scope("1\n"), Ok(1));
        assert_eq!(parse_ptrace_scope("3"), Ok(3));
        assert!(parse_ptrace_scope("4\n").is_err());
        assert!(parse_ptrace_scope("").is_err());
        assert!(parse_ptrace_scope("one").is_err());
    }

    #[test]
    fn wsl_releases_are_recognised() {
        assert!(is_wsl_release("5.15.167.4-microsoft-standard-WSL2\n"));
        assert!(is_wsl_release("4.4.0-19041-Microsoft"));
        assert!(!is_wsl_release("6.8.0-60-generic"));
    }

    #[test]
    fn cgroup_lines_naming_runtimes_are_container_evidence() {
        let docker = "12:memory:/docker/0123abcd\n0::/system.slice/ssh.service\n";
        assert_eq!(container_cgroup_lines(docker), vec!["12:memory:/docker/0123abcd"]);
        let kube = "0::/kubepods.slice/kubepods-burstable.slice/cri-containerd-ab.scope\n";
        assert_eq!(container_cgroup_lines(kube).len(), 1);
        assert!(container_cgroup_lines("0::/\n").is_empty());
        assert!(container_cgroup_lines("0::/user.slice/user-1000.slice/session-2.scope\n").is_empty());
    }

    #[test]
    fn nvidia_version_file_parses_proprietary_and_open_modules() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC \
                           2023\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        let module = parse_nvidia_version(proprietary).unwrap();
        assert_eq!(module.version, "535.104.05");
        assert!(!module.open);
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  \
                    (dvs-builder@U22-I3-AE18-23-3)  Sun Jul 27 06:54:38 UTC 2025\n";
        let module = parse_nvidia_version(open).unwrap();
        assert_eq!(module.version, "580.65.06");
        assert!(module.open);
        // As read on the project's H100 machine.
        let h100 = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  \
                    (nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n";
        assert_eq!(parse_nvidia_version(h100).unwrap().version, "580.159.04");
        assert_eq!(parse_nvidia_version("GCC version: 12\n"), None);
    }

    #[test]
    fn fake_container_tree_is_read_in_full() {
        let fake = FakeRoot::new();
        fake.symlink("proc/self/ns/pid", "pid:[4026532301]");
        fake.symlink("proc/1/ns/pid", "pid:[4026532301]");
        fake.symlink("proc/self/ns/ipc", "ipc:[4026531839]");
        fake.write("proc/sys/kernel/yama/ptrace_scope", b"2\n");
        fake.write("proc/sys/kernel/osrelease", b"6.8.0-60-generic\n");
        fake.write("proc/self/cgroup", b"0::/kubepods/besteffort/pod1/abc\n");
        fake.write("proc/driver/nvidia/version", b"NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  x\n");
        fake.write("proc/4242/comm", b"nvidia-cuda-mps\n");
        fake.write("proc/4242/cmdline", b"nvidia-cuda-mps-control\0-d\0");
        fake.write("proc/4243/comm", b"bash\n");
        fake.write(".dockerenv", b"");
        fake.write("dev/nvidiactl", b"");
        fake.write("dev/nvidia0", b"");
        fake.write("dev/null", b"");
        fake.mkfifo("tmp/nvidia-mps/control");
        std::fs::create_dir_all(fake.0.join("dev/shm")).unwrap();

        let report = collect(&fake.root());

        let pid_ns = report.pid_namespace.known().unwrap();
        assert_eq!(pid_ns.inode, 4_026_532_301);
        assert!(!pid_ns.initial);
        assert_eq!(pid_ns.same_as_pid1, Some(true));
        let ipc_ns = report.ipc_namespace.known().unwrap();
        assert!(ipc_ns.initial);
        assert_eq!(ipc_ns.same_as_pid1, None);
        assert_eq!(report.ptrace_scope, Fact::Known(2));
        assert_eq!(report.wsl, Fact::Known(false));
        assert!(report.container.detected);
        assert_eq!(report.container.evidence.len(), 2);
        assert_eq!(report.mps.processes, Fact::Known(vec![MpsProcess { pid: 4242, role: MpsRole::Control }]));
        assert_eq!(report.mps.control_pipe, Fact::Known(true));
        assert!(report.mps.active());
        assert_eq!(report.nvidia_kernel_module.known().unwrap().version, "570.133.20");
        assert_eq!(report.device_nodes, Fact::Known(vec!["nvidia0".to_owned(), "nvidiactl".to_owned()]));
        // statvfs on a plain folder reports the file system it lives on: known, and never more free than total.
        let shm = report.dev_shm.known().unwrap();
        assert!(shm.free_bytes <= shm.total_bytes);
        assert!(!report.kernel_release.is_empty());
    }

    #[test]
    fn empty_tree_gives_reasons_instead_of_failing() {
        let fake = FakeRoot::new();
        let report = collect(&fake.root());

        let Fact::Unknown(why) = &report.pid_namespace else { panic!("expected unknown") };
        assert!(why.contains("ns/pid"), "{why}");
        let Fact::Unknown(why) = &report.ptrace_scope else { panic!("expected unknown") };
        assert!(why.contains("Yama is not active"), "{why}");
        assert!(matches!(report.dev_shm, Fact::Unknown(_)));
        assert!(matches!(report.wsl, Fact::Unknown(_)));
        let Fact::Unknown(why) = &report.nvidia_kernel_module else { panic!("expected unknown") };
        assert!(why.contains("not loaded"), "{why}");
        assert!(matches!(report.device_nodes, Fact::Unknown(_)));
        assert!(!report.container.detected);
        assert_eq!(report.container.evidence.len(), 1, "the unreadable cgroup file is noted");
        assert!(matches!(report.mps.processes, Fact::Unknown(_)));
        assert_eq!(report.mps.control_pipe, Fact::Known(false));
        assert!(!report.mps.active());
    }

    #[test]
    fn mps_pipe_directory_from_env_is_reported() {
        let fake = FakeRoot::new();
        fake.write("custom-pipes/control", b"not a fifo");
        let mut root = fake.root();
        root.mps_pipe_directory = fake.0.join("custom-pipes");
        root.mps_pipe_directory_from_env = true;
        let mps = probe_mps(&root.proc_dir, &root.mps_pipe_directory, root.mps_pipe_directory_from_env);
        assert!(mps.pipe_directory_from_env);
        assert!(mps.pipe_directory.ends_with("custom-pipes"));
        let Fact::Unknown(why) = &mps.control_pipe else { panic!("expected unknown") };
        assert!(why.contains("not a FIFO"), "{why}");
    }

    #[test]
    fn real_machine_reports_own_namespaces_and_kernel() {
        // Reading one's own /proc/self/ns links needs no privilege, so these are known on any Linux.
        let report = collect(&SystemRoot::real());
        println!("{report:#?}");
        assert!(report.pid_namespace.known().is_some(), "{:?}", report.pid_namespace);
        assert!(report.ipc_namespace.known().is_some(), "{:?}", report.ipc_namespace);
        assert!(!report.kernel_release.is_empty());
        assert!(matches!(report.wsl, Fact::Known(_)), "{:?}", report.wsl);
    }

    #[test]
    fn container_env_alone_is_evidence() {
        let fake = FakeRoot::new();
        fake.write("proc/self/cgroup", b"0::/\n");
        let mut root = fake.root();
        root.container_env = Some("podman".to_owned());
        let hints = probe_container(&root);
        assert!(hints.detected);
        assert_eq!(hints.evidence, vec!["environment variable container=podman".to_owned()]);
    }
}
