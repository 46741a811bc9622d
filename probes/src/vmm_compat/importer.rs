//! The importing side: the requests the exporter sends, and the code that serves them, in the child process
//! (`vmm-compat-importer`) and, as the same-process control, in the exporter itself.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use gpu_ipc::driver::{
    Context, DeviceMemory, DeviceSpan, DriverError, Event, ImportedPoolPointer, IpcEventHandle, IpcMapping,
    IpcMemHandle, MemoryPool, PoolPointerExport, VmmAllocation, VmmMapping,
};
use serde::{Deserialize, Serialize};

use super::model::SUCCESS;
use harness::MeasurementError;
use harness::child::ChildFailure;
use harness::child::{Channel, ChildTask};

/// How long an importer waits for its next request (the exporter's work between two is short).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an importer polls an imported event for completion.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Code of an event still not complete at [`EVENT_TIMEOUT`].
pub const EVENT_NOT_COMPLETE: &str = "EVENT_NOT_COMPLETE";
/// Code of a request whose handle bytes have the wrong length, or that lacks its fd.
pub const MALFORMED_REQUEST: &str = "MALFORMED_REQUEST";

/// The words checked in each direction: word `i` is `base + i`, so an offset error shows as a mismatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pattern {
    /// What the exporter wrote, which the importer must read.
    pub expect: u32,
    /// What the importer writes, which the exporter reads back.
    pub write: u32,
    /// How many 32-bit words.
    pub words: u32,
}

/// The words of a pattern starting at `base`.
pub fn pattern_words(base: u32, words: u32) -> Vec<u32> {
    (0..words).map(|i| base.wrapping_add(i)).collect()
}

/// One import the exporter asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "kebab-case")]
pub enum ImportRequest {
    /// Open each legacy handle (all kept open together), then, if asked, the first one a second time.
    Legacy {
        /// The 64-byte handles.
        handles: Vec<Vec<u8>>,
        /// One pattern per handle.
        patterns: Vec<Pattern>,
        /// Open the first handle again while it is open.
        open_twice: bool,
    },
    /// Import the attached fd and map it; then import and map it a second time.
    PosixFd {
        /// The allocation's size.
        size: u64,
        /// The data check.
        pattern: Pattern,
    },
    /// Import a fabric handle and map it.
    Fabric {
        /// The 64-byte `CUmemFabricHandle`.
        handle: Vec<u8>,
        /// The allocation's size.
        size: u64,
        /// The data check.
        pattern: Pattern,
    },
    /// Import the attached pool fd, then the pointer.
    Pool {
        /// The 64-byte `CUmemPoolPtrExportData`.
        pointer: Vec<u8>,
        /// The data check.
        pattern: Pattern,
        /// The exporter's own address, set only for the same-process control: an import that returns it is
        /// never freed (that would free the exporter's allocation).
        #[serde(default)]
        exporter_ptr: Option<u64>,
    },
    /// Open an interprocess event and wait (bounded) for it to complete.
    Event {
        /// The 64-byte `CUipcEventHandle`.
        handle: Vec<u8>,
    },
    /// No more requests: exit.
    Done,
}

/// The outcome of one step of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// The CUDA result name of the first failing call, or `CUDA_SUCCESS`.
    pub code: String,
    /// The call that produced `code` (empty on success).
    pub call: String,
    /// Whether the importer read the expected pattern (`None` when it did not get that far).
    pub read_ok: Option<bool>,
    /// The address the import got, in the importer.
    pub address: Option<u64>,
}

impl Step {
    fn failed(call: &str, e: &DriverError) -> Self {
        Self { code: result_code(e), call: call.to_owned(), read_ok: None, address: None }
    }

    fn code(code: &str, call: &str) -> Self {
        Self { code: code.to_owned(), call: call.to_owned(), read_ok: None, address: None }
    }

    /// True when the calls succeeded and the data was read as expected.
    #[cfg(test)]
    pub fn works(&self) -> bool {
        self.code == SUCCESS && self.read_ok != Some(false)
    }
}

/// The importer's answer: one step per import, in the order the request lists them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportReply {
    /// The steps.
    pub steps: Vec<Step>,
}

/// What a child may send back: a reply, or the failure `child_main` reports when the role itself failed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ChildMessage {
    /// A served request.
    Reply(ImportReply),
    /// The role failed (e.g. no context).
    Failure(ChildFailure),
}

/// The name the matrix records for a driver-layer error: the `CUresult` name of a failed call, or a name for
/// the layer's own refusals.
pub fn result_code(e: &DriverError) -> String {
    match e {
        DriverError::Call { name, .. } => (*name).to_owned(),
        DriverError::LibraryNotFound { .. } => "NO_DRIVER".to_owned(),
        DriverError::MissingEntryPoint { .. } => "MISSING_ENTRY_POINT".to_owned(),
        _ => "INVALID_ARGUMENT".to_owned(),
    }
}

/// Reads the first `words` 32-bit words of `span`.
///
/// # Errors
/// A span shorter than that, or a failing `cuMemcpyDtoH`.
pub fn read_words(span: DeviceSpan<'_>, words: u32) -> Result<Vec<u32>, DriverError> {
    let mut out = vec![0u32; words as usize];
    span.read(0, &mut out)?;
    Ok(out)
}

/// Writes the pattern starting at `base` at the start of `span` and waits until it has landed.
///
/// # Errors
/// A span shorter than the pattern, or a failing `cuMemcpyHtoD` or `cuCtxSynchronize`.
pub fn write_words(ctx: &Context, span: DeviceSpan<'_>, base: u32, words: u32) -> Result<(), DriverError> {
    span.write(0, &pattern_words(base, words))?;
    ctx.synchronize()
}

/// Reads the expected pattern through `span`, then writes this side's: the data check of every import.
fn check_data(ctx: &Context, span: DeviceSpan<'_>, pattern: Pattern, write: bool) -> Step {
    let ptr = span.ptr();
    let seen = match read_words(span, pattern.words) {
        Ok(seen) => seen,
        Err(e) => return Step::failed("cuMemcpyDtoH", &e),
    };
    let read_ok = seen == pattern_words(pattern.expect, pattern.words);
    if write && let Err(e) = write_words(ctx, span, pattern.write, pattern.words) {
        return Step { read_ok: Some(read_ok), address: Some(ptr.raw()), ..Step::failed("cuMemcpyHtoD", &e) };
    }
    Step { code: SUCCESS.to_owned(), call: String::new(), read_ok: Some(read_ok), address: Some(ptr.raw()) }
}

fn bytes64(bytes: &[u8]) -> Option<[u8; 64]> {
    bytes.try_into().ok()
}

/// Serves one request in this process. Everything imported is released before this returns, so the exporter
/// may free its memory once it has the reply.
pub fn serve(ctx: &Context, request: &ImportRequest, fds: Vec<OwnedFd>) -> ImportReply {
    let steps = match request {
        ImportRequest::Legacy { handles, patterns, open_twice } => serve_legacy(ctx, handles, patterns, *open_twice),
        ImportRequest::PosixFd { size, pattern } => match fds.first() {
            Some(fd) => serve_fd(ctx, fd, *size, *pattern),
            None => vec![Step::code(MALFORMED_REQUEST, "no fd attached")],
        },
        ImportRequest::Fabric { handle, size, pattern } => match bytes64(handle) {
            Some(handle) => vec![match VmmAllocation::import_fabric(ctx, &handle, *size) {
                Err(e) => Step::failed("cuMemImportFromShareableHandle", &e),
                Ok(allocation) => match VmmMapping::map(allocation) {
                    Err(e) => Step::failed("cuMemMap", &e),
                    Ok(mapping) => check_data(ctx, mapping.span(), *pattern, true),
                },
            }],
            None => vec![Step::code(MALFORMED_REQUEST, "fabric handle length")],
        },
        ImportRequest::Pool { pointer, pattern, exporter_ptr } => match (fds.first(), bytes64(pointer)) {
            (Some(fd), Some(pointer)) => vec![serve_pool(ctx, fd, pointer, *pattern, *exporter_ptr)],
            _ => vec![Step::code(MALFORMED_REQUEST, "pool fd or pointer data")],
        },
        ImportRequest::Event { handle } => match bytes64(handle) {
            Some(handle) => vec![serve_event(ctx, handle)],
            None => vec![Step::code(MALFORMED_REQUEST, "event handle length")],
        },
        ImportRequest::Done => Vec::new(),
    };
    ImportReply { steps }
}

fn serve_legacy(ctx: &Context, handles: &[Vec<u8>], patterns: &[Pattern], open_twice: bool) -> Vec<Step> {
    let mut steps = Vec::new();
    // Every mapping stays open until the end, so the second of two handles is opened beside the first.
    let mut mappings = Vec::new();
    for (handle, pattern) in handles.iter().zip(patterns) {
        let Some(bytes) = bytes64(handle) else {
            steps.push(Step::code(MALFORMED_REQUEST, "legacy handle length"));
            continue;
        };
        match IpcMapping::open(ctx, IpcMemHandle(bytes)) {
            Err(e) => steps.push(Step::failed("cuIpcOpenMemHandle", &e)),
            Ok(mapping) => {
                steps.push(check_data(ctx, mapping.span(), *pattern, true));
                mappings.push(mapping);
            }
        }
    }
    if open_twice && let (Some(handle), Some(pattern)) = (handles.first().and_then(|h| bytes64(h)), patterns.first()) {
        // The importer's own write is what the first mapping now holds.
        let pattern = Pattern { expect: pattern.write, ..*pattern };
        steps.push(match IpcMapping::open(ctx, IpcMemHandle(handle)) {
            Err(e) => Step::failed("cuIpcOpenMemHandle (second)", &e),
            Ok(mapping) => {
                let step = check_data(ctx, mapping.span(), pattern, false);
                if mappings.iter().any(|m| m.ptr() == mapping.ptr()) {
                    // The driver handed out the same mapping again; whether it counts references is not
                    // documented, so it is closed once only.
                    std::mem::forget(mapping);
                } else {
                    mappings.push(mapping);
                }
                step
            }
        });
    }
    steps
}

fn serve_fd(ctx: &Context, fd: &OwnedFd, size: u64, pattern: Pattern) -> Vec<Step> {
    let import = |write: bool, expect: u32| match VmmAllocation::import_fd(ctx, fd.as_fd(), size) {
        Err(e) => (Step::failed("cuMemImportFromShareableHandle", &e), None),
        Ok(allocation) => match VmmMapping::map(allocation) {
            Err(e) => (Step::failed("cuMemMap", &e), None),
            Ok(mapping) => (check_data(ctx, mapping.span(), Pattern { expect, ..pattern }, write), Some(mapping)),
        },
    };
    let (first, _first_mapping) = import(true, pattern.expect);
    // The second import sees what the first wrote.
    let (second, _second_mapping) = import(false, pattern.write);
    vec![first, second]
}

fn serve_pool(ctx: &Context, fd: &OwnedFd, pointer: [u8; 64], pattern: Pattern, exporter_ptr: Option<u64>) -> Step {
    let pool = match MemoryPool::import_fd(ctx, fd.as_fd()) {
        Ok(pool) => pool,
        Err(e) => return Step::failed("cuMemPoolImportFromShareableHandle", &e),
    };
    let imported = match ImportedPoolPointer::import(&pool, PoolPointerExport(pointer)) {
        Ok(imported) => imported,
        Err(e) => return Step::failed("cuMemPoolImportPointer", &e),
    };
    let step = match imported.span() {
        Ok(span) => check_data(ctx, span, pattern, true),
        Err(e) => Step::failed("cuMemGetAddressRange", &e),
    };
    if exporter_ptr == Some(imported.ptr().raw()) {
        // Freeing this would free the exporter's own allocation: leak the reference instead (control only).
        std::mem::forget(imported);
    }
    step
}

fn serve_event(ctx: &Context, handle: [u8; 64]) -> Step {
    let event = match Event::open_ipc(ctx, IpcEventHandle(handle)) {
        Ok(event) => event,
        Err(e) => return Step::failed("cuIpcOpenEventHandle", &e),
    };
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        match event.is_complete() {
            Ok(true) => return Step::code(SUCCESS, ""),
            Ok(false) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Ok(false) => return Step::code(EVENT_NOT_COMPLETE, "cuEventQuery"),
            Err(e) => return Step::failed("cuEventQuery", &e),
        }
    }
}

/// What a vmm-compat helper is asked to do (the envelope is [`ChildTask`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(tag = "role", content = "params")]
pub enum CompatTask {
    /// Imports what it is sent, on `device`, until `Done`.
    #[serde(rename = "vmm-compat-importer")]
    Importer {
        /// The device to import on.
        device: i32,
    },
}

/// The child process's side: serve requests until `Done`.
///
/// # Errors
/// Malformed parameters, no context, or a channel failure.
pub fn child(task: ChildTask, channel: &Channel) -> Result<(), MeasurementError> {
    let CompatTask::Importer { device } =
        task.decode().map_err(|source| MeasurementError::Malformed { what: "vmm-compat task".to_owned(), source })?;
    let ctx = Context::for_ordinal(device)?;
    loop {
        let (request, fds): (ImportRequest, _) = channel.recv(REQUEST_TIMEOUT)?;
        if request == ImportRequest::Done {
            return Ok(());
        }
        let reply = serve(&ctx, &request, fds);
        channel.send(&ChildMessage::Reply(reply), Vec::new())?;
    }
}
