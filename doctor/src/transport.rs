//! What a ring bridged to another machine over NIXL (UCX) would move its frames with: the RDMA devices, whether
//! GPUDirect RDMA is loaded, and the `UCX_TLS` / `UCX_NET_DEVICES` the process would hand to UCX.
//!
//! UCX picks its transports itself and falls back to TCP without a word when RDMA is missing or excluded, which is
//! the known trap of NIXL deployments: a bridge then runs at a fraction of the bandwidth. The bridge reports the
//! transport it actually got (`python -m gpu_ipc.bridge`, docs/beyond-one-machine.md); the doctor says beforehand
//! what this machine offers.

use std::path::Path;

use harness::fact::Fact;
use serde::{Deserialize, Serialize};

use crate::finding::{Finding, Severity};

/// The facts about this machine's network transports that decide what UCX can use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkTransport {
    /// RDMA devices (InfiniBand or RoCE adapters), from `/sys/class/infiniband`, sorted.
    pub rdma_devices: Fact<Vec<String>>,
    /// Whether `nvidia_peermem` (GPUDirect RDMA: adapters read and write GPU memory directly) is loaded, from
    /// `/proc/modules`.
    pub gpudirect_rdma: Fact<bool>,
    /// `UCX_TLS` as this process sees it (`None`: unset, UCX picks among all transports).
    pub ucx_tls: Option<String>,
    /// `UCX_NET_DEVICES` as this process sees it.
    pub ucx_net_devices: Option<String>,
}

impl Default for NetworkTransport {
    fn default() -> Self {
        let not_read = || "not collected".to_owned();
        Self {
            rdma_devices: Fact::Unknown(not_read()),
            gpudirect_rdma: Fact::Unknown(not_read()),
            ucx_tls: None,
            ucx_net_devices: None,
        }
    }
}

/// Reads the facts: `sys_dir` is normally `/sys`, `proc_dir` `/proc`; the two variables as the process has them.
pub fn probe(
    sys_dir: &Path,
    proc_dir: &Path,
    ucx_tls: Option<String>,
    ucx_net_devices: Option<String>,
) -> NetworkTransport {
    let class = sys_dir.join("class/infiniband");
    let rdma_devices = match std::fs::read_dir(&class) {
        Ok(entries) => {
            let mut names: Vec<String> =
                entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
            names.sort();
            Fact::Known(names)
        }
        // No such class: the kernel has no RDMA device (or no RDMA core loaded), which is an answer.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Fact::Known(Vec::new()),
        Err(e) => Fact::Unknown(format!("{}: {e}", class.display())),
    };
    let modules = proc_dir.join("modules");
    let gpudirect_rdma = match std::fs::read_to_string(&modules) {
        Ok(text) => Fact::Known(text.lines().any(|line| line.split_whitespace().next() == Some("nvidia_peermem"))),
        Err(e) => Fact::Unknown(format!("{}: {e}", modules.display())),
    };
    let set = |value: Option<String>| value.filter(|v| !v.trim().is_empty());
    NetworkTransport { rdma_devices, gpudirect_rdma, ucx_tls: set(ucx_tls), ucx_net_devices: set(ucx_net_devices) }
}

/// Whether a `UCX_TLS` value lets UCX use one of `names` (UCX's syntax: a comma-separated list of transports or
/// aliases, `all`, or `^` before a list of transports to leave out).
pub fn ucx_tls_allows(value: &str, names: &[&str]) -> bool {
    let (excluding, list) = match value.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, value.trim()),
    };
    let listed: Vec<&str> = list.split(',').map(str::trim).filter(|t| !t.is_empty()).collect();
    let names_one = listed.iter().any(|t| names.contains(t));
    if excluding { !names_one } else { listed.contains(&"all") || names_one }
}

/// The transports (or aliases) that carry GPU memory between processes of one machine without host copies.
const CUDA_IPC: [&str; 2] = ["cuda_ipc", "cuda"];
/// The transports (or aliases) on RDMA devices.
const RDMA: [&str; 10] = ["rc", "rc_v", "rc_x", "rc_mlx5", "ud", "ud_v", "ud_x", "dc", "dc_x", "ib"];

fn finding(id: &str, severity: Severity, what: String, why: &str, fix: Option<&str>) -> Finding {
    Finding { id: id.to_owned(), severity, what, why: why.to_owned(), fix: fix.map(str::to_owned) }
}

/// What the facts mean for a bridge over NIXL: never a failure (most rings never leave their machine), a warning
/// when `UCX_TLS` shuts out the fast path this machine has.
pub fn findings(transport: &NetworkTransport) -> Vec<Finding> {
    let mut found = Vec::new();
    if let Some(tls) = &transport.ucx_tls
        && !ucx_tls_allows(tls, &CUDA_IPC)
    {
        found.push(finding(
            "ucx-tls-no-cuda-ipc",
            Severity::Warn,
            format!("UCX_TLS={tls} leaves out cuda_ipc"),
            "a bridge over NIXL between processes of this machine then moves GPU frames through host memory (TCP or \
             shared-memory copies) instead of GPU to GPU",
            Some("add cuda_ipc (or cuda) to UCX_TLS, or unset it; the bridge's summary names the transport it got"),
        ));
    }
    let devices = transport.rdma_devices.known();
    match devices {
        Some(devices) if devices.is_empty() => found.push(finding(
            "no-rdma-device",
            Severity::Info,
            "No RDMA device (nothing in /sys/class/infiniband)".to_owned(),
            "a bridge over NIXL to another machine would carry frames over TCP, through host memory, at a fraction of \
             an RDMA link's bandwidth; rings within this machine are not affected",
            None,
        )),
        Some(devices) => {
            if let Some(tls) = &transport.ucx_tls
                && !ucx_tls_allows(tls, &RDMA)
            {
                found.push(finding(
                    "ucx-tls-no-rdma",
                    Severity::Warn,
                    format!("UCX_TLS={tls} leaves out every RDMA transport, with {} here", devices.join(", ")),
                    "a bridge over NIXL to another machine would fall back to TCP although RDMA is available",
                    Some("add rc (or ib) to UCX_TLS, or unset it"),
                ));
            }
            match transport.gpudirect_rdma {
                Fact::Known(true) => found.push(finding(
                    "gpudirect-rdma",
                    Severity::Info,
                    format!("RDMA devices {} with GPUDirect RDMA (nvidia_peermem loaded)", devices.join(", ")),
                    "a bridge over NIXL to another machine can move frames from GPU memory to the network and back \
                     without host copies",
                    None,
                )),
                _ => found.push(finding(
                    "no-gpudirect-rdma",
                    Severity::Info,
                    format!("RDMA devices {} but nvidia_peermem is not loaded", devices.join(", ")),
                    "without GPUDirect RDMA, UCX stages GPU frames through host memory on their way to another \
                     machine (or uses DMA-BUF where the kernel and the open NVIDIA module support it)",
                    Some("modprobe nvidia_peermem (root), then run the bridge again and check the transport it names"),
                )),
            }
        }
        None => {}
    }
    found
}

/// One line for the doctor's system table.
pub fn describe(transport: &NetworkTransport) -> String {
    let devices = match &transport.rdma_devices {
        Fact::Known(devices) if devices.is_empty() => "no RDMA device".to_owned(),
        Fact::Known(devices) => format!("RDMA {}", devices.join(" ")),
        Fact::Unknown(why) => format!("RDMA devices unknown ({why})"),
    };
    let peermem = match transport.gpudirect_rdma {
        Fact::Known(true) => "; nvidia_peermem loaded",
        Fact::Known(false) => "; nvidia_peermem not loaded",
        Fact::Unknown(_) => "",
    };
    let tls = transport.ucx_tls.as_deref().map_or(String::new(), |tls| format!("; UCX_TLS={tls}"));
    let net = transport.ucx_net_devices.as_deref().map_or(String::new(), |n| format!("; UCX_NET_DEVICES={n}"));
    format!("{devices}{peermem}{tls}{net}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn ids(found: &[Finding]) -> Vec<&str> {
        found.iter().map(|f| f.id.as_str()).collect()
    }

    fn transport(devices: &[&str], peermem: bool, tls: Option<&str>) -> NetworkTransport {
        NetworkTransport {
            rdma_devices: Fact::Known(devices.iter().map(|d| (*d).to_owned()).collect()),
            gpudirect_rdma: Fact::Known(peermem),
            ucx_tls: tls.map(str::to_owned),
            ucx_net_devices: None,
        }
    }

    #[test]
    fn ucx_tls_lists_and_exclusions_are_read_as_ucx_reads_them() {
        assert!(ucx_tls_allows("all", &CUDA_IPC));
        assert!(ucx_tls_allows("tcp,cuda_ipc", &CUDA_IPC));
        assert!(ucx_tls_allows("sm,cuda", &CUDA_IPC));
        assert!(!ucx_tls_allows("tcp,cuda_copy", &CUDA_IPC));
        assert!(ucx_tls_allows("^tcp", &CUDA_IPC));
        assert!(!ucx_tls_allows("^cuda_ipc,tcp", &CUDA_IPC));
        assert!(ucx_tls_allows("rc,cuda_copy", &RDMA));
        assert!(!ucx_tls_allows("tcp,cuda_copy", &RDMA));
    }

    #[test]
    fn the_findings_say_what_a_bridge_would_get() {
        assert_eq!(ids(&findings(&transport(&[], false, None))), ["no-rdma-device"]);
        assert_eq!(
            ids(&findings(&transport(&[], false, Some("tcp,cuda_copy")))),
            ["ucx-tls-no-cuda-ipc", "no-rdma-device"]
        );
        assert_eq!(ids(&findings(&transport(&["mlx5_0"], true, None))), ["gpudirect-rdma"]);
        assert_eq!(ids(&findings(&transport(&["mlx5_0"], false, None))), ["no-gpudirect-rdma"]);
        assert_eq!(
            ids(&findings(&transport(&["mlx5_0"], true, Some("tcp,cuda_ipc")))),
            ["ucx-tls-no-rdma", "gpudirect-rdma"]
        );
        let warn = findings(&transport(&[], false, Some("tcp")));
        assert_eq!(warn[0].severity, Severity::Warn);
        assert!(findings(&NetworkTransport::default()).is_empty(), "nothing known, nothing said");
    }

    #[test]
    fn probe_reads_the_devices_and_the_module_list() {
        let dir = std::env::temp_dir().join(format!("gpu-ipc-doctor-transport-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sys/class/infiniband/mlx5_1")).unwrap();
        std::fs::create_dir_all(dir.join("sys/class/infiniband/mlx5_0")).unwrap();
        std::fs::create_dir_all(dir.join("proc")).unwrap();
        std::fs::write(dir.join("proc/modules"), "nvidia_uvm 1 0 - Live 0x0\nnvidia_peermem 16384 0 - Live 0x0\n")
            .unwrap();
        let found = probe(&dir.join("sys"), &dir.join("proc"), Some("  ".to_owned()), Some("mlx5_0:1".to_owned()));
        assert_eq!(found.rdma_devices, Fact::Known(vec!["mlx5_0".to_owned(), "mlx5_1".to_owned()]));
        assert_eq!(found.gpudirect_rdma, Fact::Known(true));
        assert_eq!((found.ucx_tls.as_deref(), found.ucx_net_devices.as_deref()), (None, Some("mlx5_0:1")));
        assert_eq!(describe(&found), "RDMA mlx5_0 mlx5_1; nvidia_peermem loaded; UCX_NET_DEVICES=mlx5_0:1");
        let none = probe(&dir.join("nothing"), &dir.join("proc"), None, None);
        assert_eq!(none.rdma_devices, Fact::Known(Vec::new()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
