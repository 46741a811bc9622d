//! The memory pool with named buffers: an owner that allocates and fills named buffers, an importer that attaches,
//! checks every buffer against its pattern in place and measures what attaching and looking up cost, and `bench`,
//! which runs both (the importer as a child process) and prints the figures.
//!
//! ```text
//! pool bench --backend vmm --capacity-mib 1024 --buffers 64 --attaches 20 --json
//! pool owner --socket /tmp/pool.sock --backend legacy --capacity-mib 256 --buffers 16   # until stdin closes
//! pool importer --socket /tmp/pool.sock --backend legacy --json
//! ```
//! `--backend host` runs without a GPU (host memory). Exit status: 0 every buffer verified; 1 a mismatch or another
//! error; 3 no CUDA driver (use `--backend host`).

#![forbid(unsafe_code)] // Only ipc-core's driver and sys layers may contain `unsafe`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use gpu_ipc::BackendKind;
use gpu_ipc::core::backend::{Backend, GpuBackend};
use gpu_ipc::core::host::{Host, HostContext};
use gpu_ipc::driver::Context;
use gpu_ipc::pool::{DType, PoolConfig, PoolError, PoolStats, SharedPool, TensorDesc};
use gpu_ipc_examples::pool_work::{
    GpuMemory, HostMemory, ImporterReport, PoolMemory, fill, no_driver, run_importer, seed_of,
};
use gpu_ipc_examples::{EXIT_NO_DRIVER, RoleArgs, print_summary, stdin_closed_flag};

/// Share named GPU buffers between processes through one pool.
#[derive(Debug, Parser)]
#[command(version, after_help = gpu_ipc_examples::exit::HELP)]
struct Args {
    #[command(subcommand)]
    role: Role,
}

/// What the owner makes.
#[derive(Debug, Clone, clap::Args)]
struct OwnerArgs {
    /// The pool's one block, in MiB.
    #[arg(long, default_value_t = 256)]
    capacity_mib: u64,
    /// Named buffers `tensor/0` .. that share the block equally.
    #[arg(long, default_value_t = 16)]
    buffers: u64,
}

/// What the importer measures.
#[derive(Debug, Clone, clap::Args)]
struct ImporterArgs {
    /// Attaches to time (each one imports the whole pool).
    #[arg(long, default_value_t = 10)]
    attaches: u64,
    /// Rounds of lookups of every name to time.
    #[arg(long, default_value_t = 2000)]
    rounds: u64,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Make a pool, allocate and fill its buffers, serve importers until stdin closes or `--hold-secs` pass.
    Owner {
        #[command(flatten)]
        common: RoleArgs,
        #[command(flatten)]
        owner: OwnerArgs,
        /// The pool's socket.
        #[arg(long, default_value = "/tmp/gpu-ipc-pool.sock")]
        socket: PathBuf,
        /// Serve at most this long.
        #[arg(long, default_value_t = 600)]
        hold_secs: u64,
    },
    /// Attach, check every buffer in place, time attaches and lookups.
    Importer {
        #[command(flatten)]
        common: RoleArgs,
        #[command(flatten)]
        importer: ImporterArgs,
        /// The pool's socket.
        #[arg(long, default_value = "/tmp/gpu-ipc-pool.sock")]
        socket: PathBuf,
    },
    /// An owner here and an importer in a child process: the attach cost at this capacity, and the lookup cost.
    Bench {
        #[command(flatten)]
        common: RoleArgs,
        #[command(flatten)]
        owner: OwnerArgs,
        #[command(flatten)]
        importer: ImporterArgs,
    },
}

#[derive(Debug, serde::Serialize)]
struct OwnerSummary {
    role: &'static str,
    backend: &'static str,
    buffers: u64,
    buffer_bytes: u64,
    stats: PoolStats,
}

#[derive(Debug, serde::Serialize)]
struct BenchSummary {
    role: &'static str,
    backend: &'static str,
    capacity_bytes: u64,
    buffers: u64,
    create_ms: f64,
    importer: ImporterReport,
}

/// Code generic over the backend, run for the backend chosen at run time with its context.
trait Program {
    type Output;
    fn run<B: Backend, M: PoolMemory<B>>(self, ctx: B::Context) -> Result<Self::Output, PoolError>;
}

fn with_backend<P: Program>(kind: BackendKind, device: i32, program: P) -> Result<P::Output, PoolError> {
    struct Gpu<P>(P, i32);
    impl<P: Program> gpu_ipc::GpuBackendVisitor for Gpu<P> {
        type Output = Result<P::Output, PoolError>;
        fn visit<B: GpuBackend>(self) -> Self::Output {
            let ctx = Context::for_ordinal(self.1).map_err(|e| PoolError::Backend(e.into()))?;
            self.0.run::<B, GpuMemory>(ctx)
        }
    }
    match kind {
        BackendKind::Host => program.run::<Host, HostMemory>(HostContext),
        gpu => gpu_ipc::dispatch_gpu(gpu, Gpu(program, device)).map_err(|e| PoolError::Config(e.to_string()))?,
    }
}

/// Makes the pool and its buffers, each filled with its pattern.
fn make_pool<B: Backend, M: PoolMemory<B>>(
    ctx: &B::Context,
    socket: &Path,
    args: &OwnerArgs,
) -> Result<(SharedPool<B>, Vec<gpu_ipc::pool::BufferHandle<B>>), PoolError> {
    let capacity = args.capacity_mib << 20;
    let pool = SharedPool::<B>::create(ctx, socket, PoolConfig::new(capacity))?;
    let each = (capacity / args.buffers.max(1)) / 256 * 256;
    let mut handles = Vec::new();
    for i in 0..args.buffers {
        let name = format!("tensor/{i}");
        let handle = pool.alloc(&name, each, 256, Some(TensorDesc::contiguous(DType::U8, [each])?))?;
        fill::<B, M>(&handle, seed_of(&name))?;
        handles.push(handle);
    }
    Ok((pool, handles))
}

struct Owner {
    socket: PathBuf,
    args: OwnerArgs,
    hold: Duration,
}

impl Program for Owner {
    type Output = OwnerSummary;
    fn run<B: Backend, M: PoolMemory<B>>(self, ctx: B::Context) -> Result<OwnerSummary, PoolError> {
        let (pool, handles) = make_pool::<B, M>(&ctx, &self.socket, &self.args)?;
        eprintln!("pool owner: READY at {} ({} buffers)", pool.path().display(), handles.len());
        let stdin_closed = stdin_closed_flag();
        let start = Instant::now();
        while !stdin_closed.load(Ordering::Acquire) && start.elapsed() < self.hold {
            std::thread::sleep(Duration::from_millis(20));
        }
        let buffer_bytes = handles.iter().map(|h| h.len()).sum();
        Ok(OwnerSummary {
            role: "owner",
            backend: B::KIND.name(),
            buffers: handles.len() as u64,
            buffer_bytes,
            stats: pool.stats(),
        })
    }
}

struct Importer {
    socket: PathBuf,
    args: ImporterArgs,
}

impl Program for Importer {
    type Output = ImporterReport;
    fn run<B: Backend, M: PoolMemory<B>>(self, ctx: B::Context) -> Result<ImporterReport, PoolError> {
        run_importer::<B, M>(&ctx, &self.socket, self.args.attaches, self.args.rounds)
    }
}

struct Bench {
    common: RoleArgs,
    owner: OwnerArgs,
    importer: ImporterArgs,
}

impl Program for Bench {
    type Output = BenchSummary;
    fn run<B: Backend, M: PoolMemory<B>>(self, ctx: B::Context) -> Result<BenchSummary, PoolError> {
        let socket = std::env::temp_dir().join(format!("gpu-ipc-pool-bench-{}.sock", std::process::id()));
        let start = Instant::now();
        let (pool, handles) = make_pool::<B, M>(&ctx, &socket, &self.owner)?;
        let create_ms = start.elapsed().as_secs_f64() * 1e3;
        let exe = std::env::current_exe().map_err(|e| PoolError::Config(format!("finding this program: {e}")))?;
        let mut child = Command::new(exe)
            .args(["importer", "--json", "--backend", B::KIND.name()])
            .args(["--device", &self.common.device.to_string(), "--socket"])
            .arg(pool.path())
            .args(["--attaches", &self.importer.attaches.to_string(), "--rounds", &self.importer.rounds.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| PoolError::Config(format!("starting the importer: {e}")))?;
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            let _ = stdout.read_to_string(&mut out);
        }
        let status = child.wait().map_err(|e| PoolError::Config(format!("waiting for the importer: {e}")))?;
        if !status.success() {
            return Err(PoolError::Config(format!("the importer failed ({status}): {out}")));
        }
        let importer: ImporterReport = serde_json::from_str(out.trim())
            .map_err(|e| PoolError::Config(format!("the importer's summary {out:?}: {e}")))?;
        Ok(BenchSummary {
            role: "bench",
            backend: B::KIND.name(),
            capacity_bytes: pool.stats().capacity_bytes,
            buffers: handles.len() as u64,
            create_ms,
            importer,
        })
    }
}

fn human_report(r: &ImporterReport) -> String {
    format!(
        "attach p50 {:.3} ms, p99 {:.3} ms ({} attaches); lookup p50 {:.0} ns, p99 {:.0} ns ({} lookups); {}/{} \
         buffers verified, {} mismatched words",
        r.attach_ms_p50,
        r.attach_ms_p99,
        r.attaches,
        r.lookup_ns_p50,
        r.lookup_ns_p99,
        r.lookups,
        r.verified,
        r.buffers,
        r.mismatched_words
    )
}

fn main() -> ExitCode {
    let args = Args::parse();
    let outcome = match args.role {
        Role::Owner { common, owner, socket, hold_secs } => {
            let program = Owner { socket, args: owner, hold: Duration::from_secs(hold_secs) };
            with_backend(common.backend, common.device, program).map(|s| {
                print_summary(common.json, &s, |s| {
                    format!("pool owner ({}): {} buffers, {:?}", s.backend, s.buffers, s.stats)
                });
                true
            })
        }
        Role::Importer { common, importer, socket } => {
            with_backend(common.backend, common.device, Importer { socket, args: importer }).map(|r| {
                print_summary(common.json, &r, human_report);
                r.mismatched_words == 0 && r.verified == r.buffers
            })
        }
        Role::Bench { common, owner, importer } => {
            let (kind, device, json) = (common.backend, common.device, common.json);
            with_backend(kind, device, Bench { common, owner, importer }).map(|s| {
                print_summary(json, &s, |s| {
                    format!(
                        "pool bench ({}, {} bytes, {} buffers): {}",
                        s.backend,
                        s.capacity_bytes,
                        s.buffers,
                        human_report(&s.importer)
                    )
                });
                s.importer.mismatched_words == 0 && s.importer.verified == s.importer.buffers
            })
        }
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(gpu_ipc_examples::exit::EXIT_FAILURE),
        Err(e) if no_driver(&e) => {
            eprintln!("pool: {e} (`--backend host` runs without a GPU)");
            ExitCode::from(EXIT_NO_DRIVER)
        }
        Err(e) => {
            eprintln!("pool: {e}");
            ExitCode::from(gpu_ipc_examples::exit::EXIT_FAILURE)
        }
    }
}
