//! The exporting side: makes each allocation, records its attributes, runs each export, and has each import
//! done by a child process and, as the control, in this process.

use gpu_ipc::BackendKind;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use gpu_ipc::driver::{
    Context, DeviceBuffer, DeviceFeature, DeviceMemory, DevicePtr, DeviceSpan, DriverError, Event, EventFlags,
    HandleTypes, IpcMemHandle, ManagedBuffer, MemoryPool, PinnedHostBuffer, PoolAllocation, Stream, VmmAllocation,
    VmmGranularity, VmmMapping, address_range, pointer_allowed_handle_types, pointer_is_legacy_ipc_capable,
};

use super::importer::{
    ChildMessage, CompatTask, ImportReply, ImportRequest, Pattern, read_words, result_code, serve, write_words,
};
use super::judge::{ExporterMemory, ReadBack, Run, judge, judge_every_region, run_both};
use super::model::{
    AllocationFacts, AllocationKind, Attempt, BackendCheck, CHILD_DIED, CHILD_TIMEOUT, Cell, DATA_MISMATCH,
    DeviceAttributes, Operation, Results,
};
use harness::child::{ChildProcess, ChildTask};
use harness::progress::Progress;

/// Size of the device allocations: the VMM granularity on current GPUs.
const LARGE: u64 = 2 << 20;
/// Size of each of the two small allocations.
const SMALL: u64 = 4 << 10;
/// Size of the host and managed allocations.
const HOST: u64 = 64 << 10;
/// How long a child may take to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a child may take to answer one request (its first includes creating a CUDA context).
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// Reads the device attributes that bear on sharing.
pub fn device_attributes(ctx: &Context) -> DeviceAttributes {
    let dev = ctx.device();
    let flag = |feature| dev.supports(feature).ok();
    DeviceAttributes {
        unified_addressing: flag(DeviceFeature::UnifiedAddressing),
        virtual_memory_management: flag(DeviceFeature::VirtualMemoryManagement),
        posix_fd_handles: flag(DeviceFeature::PosixFdHandles),
        fabric_handles: flag(DeviceFeature::FabricHandles),
        memory_pools: flag(DeviceFeature::MemoryPools),
        mempool_handle_types: dev.memory_pool_handle_types().ok().map(|types| types.bits() as u32),
        ipc_events: flag(DeviceFeature::IpcEvents),
        managed_memory: flag(DeviceFeature::ManagedMemory),
    }
}

/// One allocation of each kind, kept alive while its cells run.
enum Owned {
    Device(Vec<DeviceBuffer>),
    Pool(PoolAllocation, MemoryPool),
    Vmm(VmmMapping),
    Host(PinnedHostBuffer),
    Managed(ManagedBuffer),
}

impl Owned {
    fn allocate(ctx: &Context, kind: AllocationKind) -> Result<Self, DriverError> {
        Ok(match kind {
            AllocationKind::MemAlloc => Self::Device(vec![DeviceBuffer::alloc(ctx, LARGE)?]),
            AllocationKind::MemAllocSmallPair => {
                Self::Device(vec![DeviceBuffer::alloc(ctx, SMALL)?, DeviceBuffer::alloc(ctx, SMALL)?])
            }
            AllocationKind::AsyncDefaultPool => {
                let pool = MemoryPool::device_default(ctx)?;
                Self::Pool(PoolAllocation::alloc(ctx, None, LARGE)?, pool)
            }
            AllocationKind::AsyncFdPool => {
                let pool = MemoryPool::create(ctx, HandleTypes::POSIX_FD)?;
                Self::Pool(PoolAllocation::alloc(ctx, Some(&pool), LARGE)?, pool)
            }
            AllocationKind::VmmNoHandle | AllocationKind::VmmPosixFd | AllocationKind::VmmFabric => {
                let types = match kind {
                    AllocationKind::VmmNoHandle => HandleTypes::NONE,
                    AllocationKind::VmmPosixFd => HandleTypes::POSIX_FD,
                    _ => HandleTypes::FABRIC,
                };
                let size = VmmGranularity::for_device(ctx.device())?.round_up(LARGE);
                Self::Vmm(VmmMapping::map(VmmAllocation::create_with_handle_types(ctx, size, types)?)?)
            }
            AllocationKind::PinnedHost => Self::Host(PinnedHostBuffer::alloc(ctx, HOST as usize)?),
            AllocationKind::Managed => Self::Managed(ManagedBuffer::alloc(ctx, HOST)?),
        })
    }

    /// Each allocation's region (two for the pair).
    fn regions(&self) -> Vec<Region<'_>> {
        match self {
            Self::Device(buffers) => buffers.iter().map(|b| Region::device(b.span())).collect(),
            Self::Pool(a, _) => vec![Region::device(a.span())],
            Self::Vmm(m) => vec![Region::device(m.span())],
            Self::Host(h) => vec![Region { ptr: h.device_ptr(), size: h.len() as u64, span: None }],
            Self::Managed(m) => vec![Region::device(m.span())],
        }
    }
}

/// One allocation as the cells see it: its address and size (for the export calls and queries), and the span the
/// exporter writes and reads its pattern through.
#[derive(Debug, Clone, Copy)]
struct Region<'a> {
    ptr: DevicePtr,
    size: u64,
    /// `None` for pinned host memory: its bytes are lent to Rust as slices, so no safe call lets the driver write
    /// them (and no export of it succeeds, so its pattern is never needed).
    span: Option<DeviceSpan<'a>>,
}

impl<'a> Region<'a> {
    fn device(span: DeviceSpan<'a>) -> Self {
        Self { ptr: span.ptr(), size: span.len(), span: Some(span) }
    }

    fn span(&self, what: &str) -> Result<DeviceSpan<'a>, Attempt> {
        self.span.ok_or_else(|| {
            Attempt::fails(
                NOT_DEVICE_MEMORY,
                format!("{what}: pinned host memory is not written or read through the driver"),
            )
        })
    }
}

/// Code of an exporter-side pattern write or read on memory that is not device memory (pinned host memory).
const NOT_DEVICE_MEMORY: &str = "NOT_DEVICE_MEMORY";

/// The importing child of one allocation kind; started on first use, started again after it died.
struct Importer {
    device: i32,
    enabled: bool,
    child: Option<ChildProcess>,
}

impl Importer {
    fn ask(&mut self, request: &ImportRequest, fds: Vec<OwnedFd>) -> Result<ImportReply, Attempt> {
        if !self.enabled {
            return Err(Attempt::not_run("no second process in this run"));
        }
        if self.child.is_none() {
            let spawned = ChildTask::of(&CompatTask::Importer { device: self.device })
                .map_err(harness::child::ChannelError::Json)
                .and_then(|task| ChildProcess::spawn(&task, &[], CONNECT_TIMEOUT));
            match spawned {
                Ok(child) => self.child = Some(child),
                Err(e) => return Err(Attempt::fails(CHILD_DIED, format!("could not start the importer: {e}"))),
            }
        }
        let Some(child) = self.child.as_mut() else { return Err(Attempt::fails(CHILD_DIED, "no importer")) };
        let started = Instant::now();
        let answer = child.channel().send(request, fds).and_then(|()| child.channel().recv(REPLY_TIMEOUT));
        match answer {
            Ok((ChildMessage::Reply(reply), _)) => Ok(reply),
            Ok((ChildMessage::Failure(f), _)) => {
                self.retire();
                Err(Attempt::fails(CHILD_DIED, format!("the importer failed: {}", f.error)))
            }
            Err(e) => {
                let code = if started.elapsed() >= REPLY_TIMEOUT { CHILD_TIMEOUT } else { CHILD_DIED };
                self.retire();
                Err(Attempt::fails(code, format!("the importer did not answer: {e}")))
            }
        }
    }

    /// Kills and reaps the child (the next request starts a new one).
    fn retire(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
            let _ = child.wait(Duration::from_secs(5));
        }
    }

    /// Tells the child to exit and waits (bounded) for it.
    fn finish(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.channel().send(&ImportRequest::Done, Vec::new());
            let _ = child.wait(Duration::from_secs(10));
        }
    }
}

/// The patterns of a kind: `which` 0 is the exporter's, 1 the child's, 2 the control's; `slot` the allocation.
fn base(kind: AllocationKind, which: u32, slot: u32) -> u32 {
    let index = AllocationKind::ALL.iter().position(|&k| k == kind).unwrap_or(0) as u32;
    0x5A00_0000 | (index << 16) | (which << 12) | (slot << 8)
}

fn words(size: u64) -> u32 {
    (size.min(4096) / 4) as u32
}

/// The exporter's regions on the GPU.
struct Regions<'a, 'r> {
    ctx: &'a Context,
    regions: &'a [Region<'r>],
}

impl ExporterMemory for Regions<'_, '_> {
    fn write(&mut self, region: usize, base: u32, words: u32) -> Result<(), Attempt> {
        let Some(region) = self.regions.get(region) else {
            return Err(Attempt::fails(DATA_MISMATCH, "no such region"));
        };
        write_words(self.ctx, region.span("writing the pattern in the exporter")?, base, words)
            .map_err(|e| Attempt::fails(&result_code(&e), "writing the pattern in the exporter"))
    }

    fn read(&mut self, region: usize, words: u32) -> ReadBack {
        let Some(region) = self.regions.get(region) else {
            return Err(Attempt::fails(DATA_MISMATCH, "no such region"));
        };
        let span = region.span("cuMemcpyDtoH in the exporter")?;
        // The importer synchronised before it replied; this context has nothing queued on the memory either, so
        // the synchronous cuMemcpyDtoH sees the importer's write.
        self.ctx.bind().map_err(|e| Attempt::fails(&result_code(&e), "cuCtxSetCurrent in the exporter"))?;
        read_words(span, words).map_err(|e| Attempt::fails(&result_code(&e), "cuMemcpyDtoH in the exporter"))
    }
}

/// Runs one import both ways: in the child (then the exporter reads back) and in this process (the control).
/// `request` makes each run's request (told whether it is the control), `fds` each run's fds (an fd is consumed
/// by sending it).
struct Runner<'a> {
    ctx: &'a Context,
    kind: AllocationKind,
    importer: &'a mut Importer,
}

impl Runner<'_> {
    fn pattern(&self, which: u32, slot: usize, size: u64) -> Pattern {
        Pattern {
            expect: base(self.kind, 0, slot as u32),
            write: base(self.kind, which, slot as u32),
            words: words(size),
        }
    }

    fn patterns(&self, which: u32, regions: &[Region<'_>]) -> Vec<Pattern> {
        regions.iter().enumerate().map(|(i, r)| self.pattern(which, i, r.size)).collect()
    }

    /// The cross-process run and the control, each with its own read-back.
    fn both(
        &mut self,
        regions: &[Region<'_>],
        request: impl Fn(&[Pattern], bool) -> ImportRequest,
        fds: impl Fn() -> Vec<OwnedFd>,
    ) -> (Run, Run) {
        let (cross, control) = (self.patterns(1, regions), self.patterns(2, regions));
        let ctx = self.ctx;
        let importer = &mut *self.importer;
        let mut memory = Regions { ctx, regions };
        run_both(
            &mut memory,
            (cross, |_: &mut Regions<'_, '_>, p: &[Pattern]| importer.ask(&request(p, false), fds()).map(|r| r.steps)),
            (control, |_: &mut Regions<'_, '_>, p: &[Pattern]| Ok(serve(ctx, &request(p, true), fds()).steps)),
        )
    }
}

fn cell(kind: AllocationKind, operation: Operation, observed: Attempt, same_process: Option<Attempt>) -> Cell {
    Cell { allocation: kind, operation, observed, same_process }
}

/// The import cell from one step index of both runs; `region` names the region whose read-back checks the
/// importer's write (for the steps that write).
fn import_cells(
    kind: AllocationKind,
    operation: Operation,
    runs: &(Run, Run),
    step: usize,
    region: Option<usize>,
) -> Cell {
    cell(kind, operation, judge(&runs.0, step, region), Some(judge(&runs.1, step, region)))
}

/// Runs every cell of one allocation kind.
fn run_kind(ctx: &Context, kind: AllocationKind, importer: &mut Importer, results: &mut Results) {
    let owned = match Owned::allocate(ctx, kind) {
        Ok(owned) => owned,
        Err(e) => {
            results.cells.push(cell(kind, Operation::Allocate, Attempt::fails(&result_code(&e), e.to_string()), None));
            for op in Operation::ALL.into_iter().skip(1) {
                let skipped = if is_pool_op(op) && !kind.is_pool() {
                    Attempt::not_applicable("not a pool allocation")
                } else {
                    Attempt::not_run("the allocation failed")
                };
                results.cells.push(cell(kind, op, skipped, None));
            }
            return;
        }
    };
    results.cells.push(cell(kind, Operation::Allocate, Attempt::works(), None));
    let regions = owned.regions();
    let Region { ptr, size, .. } = regions[0];
    results.allocations.push(facts(kind, ptr, size));

    legacy_cells(ctx, kind, &regions, importer, results);
    vmm_cells(ctx, kind, &owned, importer, results);
    pool_cells(ctx, kind, &owned, importer, results);
    event_cell(ctx, kind, importer, results);

    #[cfg(feature = "legacy")]
    {
        use gpu_ipc::core::backend::Backend;
        let legacy =
            gpu_ipc::legacy::Legacy::check_support(ctx).and_then(|()| gpu_ipc::legacy::Legacy::export_ptr(ptr));
        results.backend_checks.push(BackendCheck {
            backend: BackendKind::Legacy,
            allocation: kind,
            accepted: legacy.is_ok(),
            error: legacy.err().map(|e| e.to_string()).unwrap_or_default(),
        });
    }
}

fn is_pool_op(op: Operation) -> bool {
    matches!(op, Operation::PoolExport | Operation::PoolExportPointer | Operation::PoolImport)
}

fn facts(kind: AllocationKind, ptr: DevicePtr, size: u64) -> AllocationFacts {
    let legacy = pointer_is_legacy_ipc_capable(ptr);
    let allowed = pointer_allowed_handle_types(ptr);
    let query_error = legacy.as_ref().err().or(allowed.as_ref().err()).map(result_code);
    AllocationFacts {
        allocation: kind,
        bytes: size,
        legacy_ipc_capable: legacy.ok(),
        allowed_handle_types: allowed.ok(),
        query_error,
    }
}

fn legacy_cells(
    ctx: &Context,
    kind: AllocationKind,
    regions: &[Region<'_>],
    importer: &mut Importer,
    results: &mut Results,
) {
    let exported: Result<Vec<IpcMemHandle>, DriverError> = regions.iter().map(|r| IpcMemHandle::of(r.ptr)).collect();
    let handles = match exported {
        Ok(handles) => handles,
        Err(e) => {
            results.cells.push(cell(
                kind,
                Operation::LegacyExport,
                Attempt::fails(&result_code(&e), e.to_string()),
                None,
            ));
            for op in [Operation::LegacyImport, Operation::LegacyOpenTwice] {
                results.cells.push(cell(kind, op, Attempt::not_run("cuIpcGetMemHandle failed"), None));
            }
            return;
        }
    };
    results.cells.push(cell(kind, Operation::LegacyExport, Attempt::works(), None));
    let bytes: Vec<Vec<u8>> = handles.iter().map(|h| h.0.to_vec()).collect();
    let mut runner = Runner { ctx, kind, importer };
    let runs = runner.both(
        regions,
        |patterns, _| ImportRequest::Legacy { handles: bytes.clone(), patterns: patterns.to_vec(), open_twice: true },
        Vec::new,
    );
    let n = regions.len();
    results.cells.push(cell(
        kind,
        Operation::LegacyImport,
        judge_every_region(&runs.0, n),
        Some(judge_every_region(&runs.1, n)),
    ));
    results.cells.push(import_cells(kind, Operation::LegacyOpenTwice, &runs, n, None));
    if kind == AllocationKind::MemAllocSmallPair {
        let block = &mut results.shared_block;
        block.handles_equal = handles.get(1).map(|h| handles[0] == *h);
        block.ranges = regions
            .iter()
            .map(|r| address_range(r.ptr).ok().map(|(base, len)| (r.ptr.raw() - base.raw(), len)))
            .collect();
        let bases: Vec<Option<u64>> = regions.iter().map(|r| address_range(r.ptr).ok().map(|(b, _)| b.raw())).collect();
        block.same_block = match (bases.first(), bases.get(1)) {
            (Some(Some(a)), Some(Some(b))) => Some(a == b),
            _ => None,
        };
        if let Ok(steps) = &runs.0.steps {
            block.open_codes = steps.iter().take(n).map(|s| s.code.clone()).collect();
            block.data_ok = steps.iter().take(n).map(|s| s.read_ok).collect();
        }
    }
}

fn vmm_cells(ctx: &Context, kind: AllocationKind, owned: &Owned, importer: &mut Importer, results: &mut Results) {
    let regions = owned.regions();
    let region = [regions[0]];
    let Region { ptr, size, .. } = region[0];
    // Memory not made with cuMemCreate has no allocation handle unless the driver retains one by address.
    let retained;
    let allocation: &VmmAllocation = match owned {
        Owned::Vmm(mapping) => mapping.allocation(),
        _ => match VmmAllocation::retain(ctx, ptr, size) {
            Ok(a) => {
                retained = a;
                &retained
            }
            Err(e) => {
                let code = result_code(&e);
                for op in [Operation::FdExport, Operation::FabricExport] {
                    results.cells.push(cell(kind, op, Attempt::fails(&code, "cuMemRetainAllocationHandle"), None));
                }
                for op in [Operation::FdImport, Operation::FdImportTwice, Operation::FabricImport] {
                    results.cells.push(cell(kind, op, Attempt::not_run("no allocation handle to export"), None));
                }
                return;
            }
        },
    };
    match allocation.export_fd() {
        Err(e) => {
            results.cells.push(cell(kind, Operation::FdExport, Attempt::fails(&result_code(&e), e.to_string()), None));
            for op in [Operation::FdImport, Operation::FdImportTwice] {
                results.cells.push(cell(kind, op, Attempt::not_run("the fd export failed"), None));
            }
        }
        Ok(first) => {
            results.cells.push(cell(kind, Operation::FdExport, Attempt::works(), None));
            let spare = std::cell::RefCell::new(Some(first));
            let mut runner = Runner { ctx, kind, importer };
            let runs = runner.both(
                &region,
                |patterns, _| ImportRequest::PosixFd { size, pattern: patterns[0] },
                || spare.borrow_mut().take().or_else(|| allocation.export_fd().ok()).into_iter().collect(),
            );
            results.cells.push(import_cells(kind, Operation::FdImport, &runs, 0, Some(0)));
            results.cells.push(import_cells(kind, Operation::FdImportTwice, &runs, 1, None));
        }
    }
    match allocation.export_fabric() {
        Err(e) => {
            results.cells.push(cell(
                kind,
                Operation::FabricExport,
                Attempt::fails(&result_code(&e), e.to_string()),
                None,
            ));
            results.cells.push(cell(kind, Operation::FabricImport, Attempt::not_run("the fabric export failed"), None));
        }
        Ok(handle) => {
            results.cells.push(cell(kind, Operation::FabricExport, Attempt::works(), None));
            let mut runner = Runner { ctx, kind, importer };
            let runs = runner.both(
                &region,
                |patterns, _| ImportRequest::Fabric { handle: handle.to_vec(), size, pattern: patterns[0] },
                Vec::new,
            );
            results.cells.push(import_cells(kind, Operation::FabricImport, &runs, 0, Some(0)));
        }
    }
}

fn pool_cells(ctx: &Context, kind: AllocationKind, owned: &Owned, importer: &mut Importer, results: &mut Results) {
    let Owned::Pool(allocation, pool) = owned else {
        for op in [Operation::PoolExport, Operation::PoolExportPointer, Operation::PoolImport] {
            results.cells.push(cell(kind, op, Attempt::not_applicable("not a pool allocation"), None));
        }
        return;
    };
    let fd = pool.export_fd();
    let pointer = allocation.export_pointer();
    let export_cell = |r: Result<(), &DriverError>| match r {
        Ok(()) => Attempt::works(),
        Err(e) => Attempt::fails(&result_code(e), e.to_string()),
    };
    results.cells.push(cell(kind, Operation::PoolExport, export_cell(fd.as_ref().map(|_| ())), None));
    results.cells.push(cell(kind, Operation::PoolExportPointer, export_cell(pointer.as_ref().map(|_| ())), None));
    let (Ok(fd), Ok(pointer)) = (fd, pointer) else {
        results.cells.push(cell(kind, Operation::PoolImport, Attempt::not_run("a pool export failed"), None));
        return;
    };
    let region = [Region::device(allocation.span())];
    let spare = std::cell::RefCell::new(Some(fd));
    let mut runner = Runner { ctx, kind, importer };
    let runs = runner.both(
        &region,
        |patterns, control| ImportRequest::Pool {
            pointer: pointer.0.to_vec(),
            pattern: patterns[0],
            // Only the control, in this process, could be handed back the exporter's own address.
            exporter_ptr: control.then_some(allocation.ptr().raw()),
        },
        || spare.borrow_mut().take().or_else(|| pool.export_fd().ok()).into_iter().collect(),
    );
    results.cells.push(import_cells(kind, Operation::PoolImport, &runs, 0, Some(0)));
}

fn event_cell(ctx: &Context, kind: AllocationKind, importer: &mut Importer, results: &mut Results) {
    let made = Event::new(ctx, EventFlags::INTERPROCESS).and_then(|event| {
        let stream = Stream::new(ctx)?;
        event.record(&stream)?;
        stream.synchronize()?;
        let handle = event.ipc_handle()?;
        Ok((event, handle))
    });
    let (_event, handle) = match made {
        Ok(made) => made,
        Err(e) => {
            results.cells.push(cell(kind, Operation::IpcEvent, Attempt::fails(&result_code(&e), e.to_string()), None));
            return;
        }
    };
    let request = ImportRequest::Event { handle: handle.0.to_vec() };
    let cross = importer.ask(&request, Vec::new()).map(|r| r.steps);
    let control = Ok(serve(ctx, &request, Vec::new()).steps);
    let runs = (Run::without_data(cross), Run::without_data(control));
    results.cells.push(import_cells(kind, Operation::IpcEvent, &runs, 0, None));
}

/// Runs the whole matrix on `ctx`'s device. With `cross_process` false no child is started (the import cells
/// are then `NOT_RUN`, and only the same-process control runs): the in-process GPU test.
pub fn run_matrix(ctx: &Context, device: i32, progress: &Progress, cross_process: bool) -> Results {
    let mut results = Results { device, attributes: device_attributes(ctx), ..Results::default() };
    progress.stage("allocations", AllocationKind::ALL.len() as u64 + 1);
    for kind in AllocationKind::ALL {
        let mut importer = Importer { device, enabled: cross_process, child: None };
        run_kind(ctx, kind, &mut importer, &mut results);
        importer.finish();
        progress.step(kind.label());
    }
    #[cfg(feature = "vmm")]
    {
        use gpu_ipc::core::backend::Backend;
        use gpu_ipc::vmm::Vmm;
        let vmm = Vmm::check_support(ctx)
            .and_then(|()| Vmm::allocate(ctx, LARGE))
            .and_then(|region| Vmm::export(&region).map(|_| ()));
        results.backend_checks.push(BackendCheck {
            backend: BackendKind::Vmm,
            allocation: AllocationKind::VmmPosixFd,
            accepted: vmm.is_ok(),
            error: vmm.err().map(|e| e.to_string()).unwrap_or_default(),
        });
    }
    progress.step("backends");
    results
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
