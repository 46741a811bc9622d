//! What each coherency variant became: `cuobjdump -sass` on the loaded image, per kernel.

use std::collections::BTreeMap;

/// Runs `cuobjdump -sass` on the loaded image and keeps, per coherency kernel, its memory and fence instructions.
pub(super) fn disassemble(
    image: &gpu_ipc::kernels::image::KernelImage,
) -> (BTreeMap<String, Vec<String>>, Option<String>) {
    if image.kind != gpu_ipc::kernels::image::ImageKind::Cubin {
        return (BTreeMap::new(), Some(format!("the loaded image {} is PTX: no SASS to read", image.file)));
    }
    let path = std::env::temp_dir().join(format!("gpu-ipc-coherency-{}.cubin", std::process::id()));
    if let Err(e) = std::fs::write(&path, image.bytes) {
        return (BTreeMap::new(), Some(format!("could not write the cubin for cuobjdump: {e}")));
    }
    let output = std::process::Command::new("cuobjdump").arg("-sass").arg(&path).output();
    let _ = std::fs::remove_file(&path);
    match output {
        Ok(out) if out.status.success() => (parse_sass(&String::from_utf8_lossy(&out.stdout)), None),
        Ok(out) => {
            (BTreeMap::new(), Some(format!("cuobjdump failed: {}", String::from_utf8_lossy(&out.stderr).trim())))
        }
        Err(e) => (BTreeMap::new(), Some(format!("cuobjdump not run ({e}); install the CUDA toolkit to record SASS"))),
    }
}

/// From `cuobjdump -sass` output, per `gpu_ipc_coh_*` function: its global-memory loads and stores, fences,
/// barriers and cache controls, as `MNEMONIC xN` in order of first appearance.
pub fn parse_sass(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<(String, Vec<(String, usize)>)> = None;
    let mut flush = |current: &mut Option<(String, Vec<(String, usize)>)>| {
        if let Some((name, list)) = current.take()
            && name.starts_with("gpu_ipc_coh_")
        {
            out.insert(name, list.into_iter().map(|(m, n)| format!("{m} x{n}")).collect());
        }
    };
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix("Function : ") {
            flush(&mut current);
            current = Some((name.trim().to_owned(), Vec::new()));
            continue;
        }
        let Some((_, list)) = current.as_mut() else { continue };
        // "/*0080*/   @!P0 LDG.E.64.STRONG.SYS R4, desc[UR4][R2.64] ;   /* 0x... */"
        let Some(rest) = trimmed.strip_prefix("/*").and_then(|r| r.split_once("*/")).map(|(_, r)| r.trim()) else {
            continue;
        };
        let mut tokens = rest.split_whitespace();
        let Some(mut mnemonic) = tokens.next() else { continue };
        if mnemonic.starts_with('@') {
            let Some(next) = tokens.next() else { continue };
            mnemonic = next;
        }
        let mnemonic = mnemonic.trim_end_matches(';');
        let base = mnemonic.split('.').next().unwrap_or("");
        let relevant =
            matches!(base, "LDG" | "STG" | "LD" | "ST" | "MEMBAR" | "FENCE" | "CCTL" | "ERRBAR" | "ATOMG" | "REDG");
        if !relevant {
            continue;
        }
        match list.iter_mut().find(|(m, _)| m == mnemonic) {
            Some((_, n)) => *n += 1,
            None => list.push((mnemonic.to_owned(), 1)),
        }
    }
    flush(&mut current);
    out
}
