//! Tests of `matrix.rs` (kept apart so that the module reads in one screenful more).

use super::*;
use crate::vmm_compat::importer::{Step, pattern_words};
use crate::vmm_compat::judge::*;
use crate::vmm_compat::model::{Outcome, SUCCESS};

/// The exporter's memory as vectors, with a log of every access in order.
struct FakeMemory {
    regions: Vec<Vec<u32>>,
    log: Vec<String>,
    fail_write: bool,
}

impl FakeMemory {
    fn new(regions: usize, words: usize) -> Self {
        Self { regions: vec![vec![0; words]; regions], log: Vec::new(), fail_write: false }
    }
}

impl ExporterMemory for FakeMemory {
    fn write(&mut self, region: usize, base: u32, words: u32) -> Result<(), Attempt> {
        self.log.push(format!("exporter writes {region}"));
        if self.fail_write {
            return Err(Attempt::fails("CUDA_ERROR_ILLEGAL_ADDRESS", "writing the pattern in the exporter"));
        }
        self.regions[region] = pattern_words(base, words);
        Ok(())
    }

    fn read(&mut self, region: usize, words: u32) -> ReadBack {
        self.log.push(format!("exporter reads {region}"));
        Ok(self.regions[region][..words as usize].to_vec())
    }
}

fn patterns(which: u32, regions: usize) -> Vec<Pattern> {
    (0..regions)
        .map(|slot| Pattern {
            expect: base(AllocationKind::MemAlloc, 0, slot as u32),
            write: base(AllocationKind::MemAlloc, which, slot as u32),
            words: 16,
        })
        .collect()
}

/// A well-behaved importer: reads the exporter's pattern through each region, writes its own (complete
/// before it "replies", as `check_data` synchronises), and answers one step per region.
fn importer(who: &'static str) -> impl FnOnce(&mut FakeMemory, &[Pattern]) -> Steps {
    move |memory, patterns| {
        let steps = patterns
            .iter()
            .enumerate()
            .map(|(region, p)| {
                let read_ok = memory.regions[region] == pattern_words(p.expect, p.words);
                memory.regions[region] = pattern_words(p.write, p.words);
                memory.log.push(format!("{who} imports {region}"));
                Step { code: SUCCESS.to_owned(), call: String::new(), read_ok: Some(read_ok), address: Some(0) }
            })
            .collect();
        Ok(steps)
    }
}

#[test]
fn each_run_is_read_back_before_the_next_rewrites_the_memory() {
    let mut memory = FakeMemory::new(2, 16);
    let (cross, control) =
        run_both(&mut memory, (patterns(1, 2), importer("child")), (patterns(2, 2), importer("control")));
    assert_eq!(
        memory.log,
        [
            "exporter writes 0",
            "exporter writes 1",
            "child imports 0",
            "child imports 1",
            "exporter reads 0",
            "exporter reads 1",
            "exporter writes 0",
            "exporter writes 1",
            "control imports 0",
            "control imports 1",
            "exporter reads 0",
            "exporter reads 1",
        ]
    );
    // Both runs carry their own importer's words, so both work.
    assert_eq!(cross.read_back[1], Ok(pattern_words(cross.patterns[1].write, 16)));
    assert_eq!(judge_every_region(&cross, 2), Attempt::works());
    assert_eq!(judge_every_region(&control, 2), Attempt::works());
    assert_eq!(judge(&cross, 0, Some(0)), Attempt::works());
}

/// The bug of the first GPU run: the cross-process run was judged against memory read after the control
/// had rewritten it, so every working import read `DATA_MISMATCH`.
#[test]
fn a_read_back_taken_after_the_control_would_be_a_spurious_mismatch() {
    let mut memory = FakeMemory::new(1, 16);
    let (mut cross, _control) =
        run_both(&mut memory, (patterns(1, 1), importer("child")), (patterns(2, 1), importer("control")));
    cross.read_back = vec![memory.read(0, 16)];
    let late = judge(&cross, 0, Some(0));
    assert_eq!((late.code.as_str(), late.outcome), (DATA_MISMATCH, Outcome::Fails));
    assert!(late.detail.contains("did not read back the importer's pattern"), "{late:?}");
}

#[test]
fn an_importer_whose_write_did_not_land_is_a_mismatch() {
    let mut memory = FakeMemory::new(1, 16);
    let lazy = |_: &mut FakeMemory, _: &[Pattern]| {
        Ok(vec![Step { code: SUCCESS.to_owned(), call: String::new(), read_ok: Some(true), address: None }])
    };
    let run = run_import(&mut memory, patterns(1, 1), lazy);
    let a = judge(&run, 0, Some(0));
    assert_eq!(a.code, DATA_MISMATCH);
    assert!(a.detail.contains("read back its own pattern"), "{a:?}");
}

#[test]
fn an_importer_writing_at_the_wrong_offset_is_a_mismatch() {
    let mut memory = FakeMemory::new(1, 16);
    let shifted = |m: &mut FakeMemory, p: &[Pattern]| {
        m.regions[0] = pattern_words(p[0].write.wrapping_add(1), p[0].words);
        Ok(vec![Step { code: SUCCESS.to_owned(), call: String::new(), read_ok: Some(true), address: None }])
    };
    let run = run_import(&mut memory, patterns(1, 1), shifted);
    let a = judge(&run, 0, Some(0));
    assert_eq!(a.code, DATA_MISMATCH);
    assert!(a.detail.contains("first word"), "{a:?}");
    // A step that writes nothing (the second fd import, the second legacy open) is judged on its calls.
    assert_eq!(judge(&run, 0, None), Attempt::works());
    // A step the importer never sent is a failure, not a success.
    assert_eq!(judge(&run, 1, None).code, DATA_MISMATCH);
}

#[test]
fn a_failed_preparation_or_import_is_the_cell_and_nothing_is_read_back() {
    let mut memory = FakeMemory::new(1, 16);
    memory.fail_write = true;
    let run = run_import(&mut memory, patterns(1, 1), importer("child"));
    assert!(run.read_back.is_empty());
    assert_eq!(judge(&run, 0, Some(0)).code, "CUDA_ERROR_ILLEGAL_ADDRESS");
    assert!(!memory.log.iter().any(|l| l.contains("imports")), "{:?}", memory.log);

    let mut memory = FakeMemory::new(1, 16);
    let died = |_: &mut FakeMemory, _: &[Pattern]| Err(Attempt::fails(CHILD_DIED, "killed"));
    let run = run_import(&mut memory, patterns(1, 1), died);
    assert!(run.read_back.is_empty());
    assert_eq!(judge(&run, 0, Some(0)).code, CHILD_DIED);
    // An importer that read the wrong data fails even though its write came back.
    let mut memory = FakeMemory::new(1, 16);
    let run = run_import(&mut memory, patterns(1, 1), |m: &mut FakeMemory, p: &[Pattern]| {
        m.regions[0] = pattern_words(p[0].write, p[0].words);
        Ok(vec![Step { code: SUCCESS.to_owned(), call: String::new(), read_ok: Some(false), address: None }])
    });
    assert!(judge(&run, 0, Some(0)).detail.contains("did not read the exporter's pattern"));
}
