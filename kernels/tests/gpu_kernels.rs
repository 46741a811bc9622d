//! The embedded kernels on a real GPU: the cubin of the device's architecture and the PTX path (forced), checked
//! against the host reference of the pattern. Ignored without a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpu_ipc_driver::{Context, DeviceBuffer, DeviceMemory, DriverError, KernelArg, LaunchConfig, Module, Stream};
use gpu_ipc_kernels::image::{ComputeCapability, ImageKind};
use gpu_ipc_kernels::launch::PatternKernels;
use gpu_ipc_kernels::pattern::{count_mismatches_host, fill_pattern_host, xor_sequence};
use gpu_ipc_kernels::{FILL_PATTERN, image};

/// A 4K RGB frame: 3840 x 2160 x 3 bytes.
const FRAME_4K: u64 = 3840 * 2160 * 3;

fn check_pattern_kernels(kernels: &PatternKernels, ctx: &Context) {
    let stream = Stream::new(ctx).unwrap();
    let frame = DeviceBuffer::alloc(ctx, FRAME_4K).unwrap();
    kernels.fill(&stream, frame.span(), 41).unwrap();
    assert_eq!(kernels.count_mismatches(&stream, frame.span(), 41).unwrap(), 0);
    // Every word differs from the pattern of another sequence number.
    assert_eq!(kernels.count_mismatches(&stream, frame.span(), 42).unwrap(), FRAME_4K / 4);

    // The device pattern is the host reference, bit for bit.
    let mut on_device = vec![0u32; (FRAME_4K / 4) as usize];
    frame.read(0, &mut on_device).unwrap();
    assert_eq!(count_mismatches_host(&on_device, 41), 0);
    let mut reference = vec![0u32; on_device.len()];
    fill_pattern_host(&mut reference, 41);
    assert_eq!(on_device, reference);

    // One corrupted word, anywhere, is counted once.
    frame.write(4 * 1_234_567, &[0xdead_beefu32]).unwrap();
    assert_eq!(kernels.count_mismatches(&stream, frame.span(), 41).unwrap(), 1);

    // Sizes that are not a multiple of the vector width take the scalar tail.
    let part = frame.span().slice(0, 4 * 1001).unwrap();
    kernels.fill(&stream, part, 7).unwrap();
    assert_eq!(kernels.count_mismatches(&stream, part, 7).unwrap(), 0);
    assert!(kernels.fill(&stream, frame.span().slice(0, 4 * 1001 + 2).unwrap(), 7).is_err());
    // A counter span too short for the 64-bit count is refused before the launch.
    assert!(kernels.verify(&stream, part, 7, frame.span().slice(0, 4).unwrap()).is_err());
    check_xor(kernels, ctx, &stream);
}

/// The pipeline example's transform: a 4K frame XORed into another buffer is the pattern frame of `xor_sequence`,
/// word for word as on the host; buffers aligned differently take the scalar path; sizes must match.
fn check_xor(kernels: &PatternKernels, ctx: &Context, stream: &Stream) {
    let src = DeviceBuffer::alloc(ctx, FRAME_4K).unwrap();
    let dst = DeviceBuffer::alloc(ctx, FRAME_4K + 16).unwrap();
    kernels.fill(stream, src.span(), 9).unwrap();
    let out = dst.span().slice(0, FRAME_4K).unwrap();
    kernels.xor_words(stream, out, src.span(), u32::MAX).unwrap();
    assert_eq!(kernels.count_mismatches(stream, out, xor_sequence(9, u32::MAX)).unwrap(), 0);
    // Not transformed, or transformed with another mask: every word is wrong.
    assert_eq!(kernels.count_mismatches(stream, src.span(), xor_sequence(9, u32::MAX)).unwrap(), FRAME_4K / 4);
    kernels.xor_words(stream, out, src.span(), 0x0F0F_0F0F).unwrap();
    assert_eq!(kernels.count_mismatches(stream, out, xor_sequence(9, u32::MAX)).unwrap(), FRAME_4K / 4);
    // A destination 4 bytes off the source's 16-byte alignment: the word-by-word path, same result.
    let bytes = 4 * 1003;
    let shifted = dst.span().slice(4, bytes).unwrap();
    let part = src.span().slice(0, bytes).unwrap();
    kernels.xor_words(stream, shifted, part, 0xDEAD_BEEF).unwrap();
    assert_eq!(kernels.count_mismatches(stream, shifted, xor_sequence(9, 0xDEAD_BEEF)).unwrap(), 0);
    let err = kernels.xor_words(stream, out, part, 1).unwrap_err();
    assert!(err.to_string().contains("same size"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cubin_for_the_device_architecture_runs() {
    let ctx = Context::for_ordinal(0).unwrap();
    let (major, minor) = ctx.device().compute_capability().unwrap();
    let kernels = PatternKernels::load_image(&ctx, false).unwrap();
    let chosen = kernels.image();
    assert_eq!(chosen.kind, ImageKind::Cubin, "sm_{major}{minor} got {chosen}");
    if (major, minor) == (9, 0) {
        assert_eq!(chosen.arch, ComputeCapability::new(9, 0), "the H100 must run the sm_90 cubin, got {chosen}");
    }
    check_pattern_kernels(&kernels, &ctx);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn forced_ptx_path_is_jit_compiled_and_runs() {
    let ctx = Context::for_ordinal(0).unwrap();
    let kernels = PatternKernels::load_image(&ctx, true).unwrap();
    assert_eq!(kernels.image().kind, ImageKind::Ptx);
    check_pattern_kernels(&kernels, &ctx);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn launch_with_wrong_arguments_is_refused_before_the_driver() {
    let ctx = Context::for_ordinal(0).unwrap();
    let (major, minor) = ctx.device().compute_capability().unwrap();
    let img = image::select_image(ComputeCapability::new(major, minor), false).unwrap();
    let module = Module::load(&ctx, img.bytes).unwrap();
    let fill = module.function(FILL_PATTERN).unwrap();
    assert_eq!(fill.param_sizes(), Some(&[8usize, 8, 8][..]));
    let stream = Stream::new(&ctx).unwrap();
    let err = fill.launch_typed(&stream, LaunchConfig::linear(1, 32), &[KernelArg::U32(1)]).unwrap_err();
    assert!(matches!(err, DriverError::KernelSignature { .. }), "{err}");
    let err = module.function("no_such_kernel").unwrap_err();
    assert!(err.to_string().contains("cuModuleGetFunction"), "{err}");
}
