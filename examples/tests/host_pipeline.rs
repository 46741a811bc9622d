//! The three-stage pipeline on the host backend, one process per stage: `generate` (A) -> `transform` (B, every
//! bit inverted) -> `verify` (C, every word of every frame checked end to end). The end of A's stream reaches C; a
//! wrong transform is caught; B SIGKILLed mid-run: C and A say so within a second, nothing hangs, and a new B on the
//! same sockets takes its place while C, attached again, verifies on; A or C SIGKILLed: the others say so within a
//! second and end. docs/pipelines.md states what each stage sees.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Proc, first_stage_killed, socket};

/// 64 x 32 RGB: 6,144 bytes, 1,536 words.
const SMALL: [&str; 4] = ["--width", "64", "--height", "32"];
const WORDS: u64 = 64 * 32 * 3 / 4;
const T: Duration = Duration::from_secs(60);

fn generate(a: &Path, sync: &str, extra: &[&str]) -> Proc {
    common::generate(a, "host", sync, &[&SMALL[..], extra].concat())
}

fn transform(name: &str, a: &Path, b: &Path, sync: &str, extra: &[&str]) -> Proc {
    common::transform(name, a, b, ("host", "host"), sync, &[&SMALL[..], extra].concat())
}

fn verify(b: &Path, extra: &[&str]) -> Proc {
    common::verify(b, "host", extra)
}

/// Waits for `needle` on `proc`'s stderr until `deadline`; returns how long after `since` it came.
fn line_within(proc: &Proc, needle: &str, since: Instant, deadline: Instant) -> Duration {
    proc.wait_for_line(needle, deadline.saturating_duration_since(Instant::now()));
    since.elapsed()
}

#[test]
fn three_stages_move_every_frame_verified_and_the_end_reaches_the_last() {
    for (sync_a, sync_b) in [("cpu-spin", "cpu-sleep"), ("cpu-sleep", "cpu-spin")] {
        let (a, b) = (socket(&format!("pipe-a-{sync_a}")), socket(&format!("pipe-b-{sync_a}")));
        let c = verify(&b, &["--first-upstream", "0"]);
        let t = transform("B transform", &a, &b, sync_b, &[]);
        let g = generate(&a, sync_a, &["--frames", "1500"]);
        let (gs, _, gj) = g.finish(T);
        let (ts, _, tj) = t.finish(Duration::from_secs(10));
        let (cs, _, cj) = c.finish(Duration::from_secs(10));
        assert!(gs.success(), "{sync_a}/{sync_b}: A {gs} {gj}");
        assert!(ts.success(), "{sync_a}/{sync_b}: B {ts} {tj}");
        assert_eq!(cs.code(), Some(0), "{sync_a}/{sync_b}: C {cj}");
        assert_eq!(gj["frames"], 1500, "{gj}");
        assert_eq!((tj["frames"].as_u64(), tj["first_upstream"].as_u64()), (Some(1500), Some(0)), "{tj}");
        assert_eq!(tj["upstream_published"], 1500, "{tj}");
        assert_eq!((tj["upstream_sync"].as_str(), tj["sync"].as_str()), (Some(sync_a), Some(sync_b)), "{tj}");
        assert_eq!(cj["frames"], 1500, "{cj}");
        assert_eq!(cj["mismatched_words"], 0, "{cj}");
        assert_eq!(cj["end_of_stream_after"], 1500, "{cj}");
        assert_eq!(cj["sync"], sync_b, "{cj}");
        let only = &cj["attachments"][0];
        assert_eq!((only["first_upstream"].as_u64(), only["last_upstream"].as_u64()), (Some(0), Some(1499)), "{cj}");
        assert_eq!(cj["attachments"].as_array().unwrap().len(), 1, "{cj}");
    }
}

#[test]
fn a_wrong_transform_is_caught_in_every_word_of_every_frame() {
    let (a, b) = (socket("pipe-wrong-a"), socket("pipe-wrong-b"));
    // C expects every bit inverted; B flips only some.
    let c = verify(&b, &["--first-upstream", "0"]);
    let t = transform("B transform", &a, &b, "cpu-spin", &["--xor", "0x0f0f0f0f"]);
    let g = generate(&a, "cpu-spin", &["--frames", "50"]);
    let (gs, _, _) = g.finish(T);
    let (ts, _, tj) = t.finish(Duration::from_secs(10));
    let (cs, _, cj) = c.finish(Duration::from_secs(10));
    assert!(gs.success() && ts.success(), "{tj}");
    assert_eq!(tj["xor"], "0x0f0f0f0f", "{tj}");
    assert_eq!(cs.code(), Some(1), "{cj}");
    assert_eq!(cj["frames"], 50, "{cj}");
    assert_eq!(cj["mismatched_words"], 50 * WORDS, "{cj}");
    // The same transform is right for a C told to expect it.
    let (a, b) = (socket("pipe-right-a"), socket("pipe-right-b"));
    let c = verify(&b, &["--first-upstream", "0", "--xor", "0x0f0f0f0f"]);
    let t = transform("B transform", &a, &b, "cpu-spin", &["--xor", "0x0f0f0f0f"]);
    let g = generate(&a, "cpu-spin", &["--frames", "50"]);
    assert!(g.finish(T).0.success() && t.finish(Duration::from_secs(10)).0.success());
    let (cs, _, cj) = c.finish(Duration::from_secs(10));
    assert_eq!((cs.code(), cj["mismatched_words"].as_u64()), (Some(0), Some(0)), "{cj}");
}

#[test]
fn the_middle_stage_killed_is_reported_within_a_second_and_a_new_one_takes_its_place() {
    let (a, b) = (socket("pipe-kill-b-a"), socket("pipe-kill-b-b"));
    let c = verify(&b, &["--first-upstream", "0", "--reattach", "--progress-every", "200"]);
    let mut t1 = transform("B1 transform", &a, &b, "cpu-spin", &[]);
    // About 1.5 s of frames at 0.5 ms each, so the kill and the replacement happen mid-run.
    let g = generate(&a, "cpu-spin", &["--frames", "3000", "--interval-us", "500"]);
    c.wait_for_line("frame 400", T);
    t1.kill9();
    let killed = Instant::now();
    let within = killed + Duration::from_secs(1);
    let c_after = line_within(&c, "is gone", killed, within);
    let a_after = line_within(&g, "no consumer attached any more", killed, within);
    assert!(c_after < Duration::from_secs(1) && a_after < Duration::from_secs(1), "C {c_after:?}, A {a_after:?}");
    let (t1s, _, _) = t1.finish(Duration::from_secs(5));
    assert_eq!(t1s.code(), None, "B1 was killed by a signal");
    // A new B on the same sockets: C attaches to it, A goes on with it.
    let t2 = transform("B2 transform", &a, &b, "cpu-spin", &[]);
    c.wait_for_line("attachment 2", T);
    g.wait_for_line("a consumer attached; going on", T);
    let (gs, _, gj) = g.finish(T);
    let (t2s, _, tj) = t2.finish(Duration::from_secs(10));
    let (cs, _, cj) = c.finish(Duration::from_secs(10));
    assert!(gs.success(), "A {gj}");
    assert!(t2s.success(), "B2 {tj}");
    assert_eq!(cs.code(), Some(0), "C {cj}");
    assert_eq!((gj["frames"].as_u64(), gj["consumers_lost"].as_u64()), (Some(3000), Some(1)), "{gj}");
    assert_eq!(gj["consumer_waits"], 1, "{gj}");
    let attachments = cj["attachments"].as_array().unwrap();
    assert_eq!(attachments.len(), 2, "{cj}");
    let (first, second) = (&attachments[0], &attachments[1]);
    assert!(first["ended"].as_str().unwrap().contains("is gone"), "{cj}");
    assert_eq!(first["first_upstream"], 0, "{cj}");
    // B2 joined A where A was; C's second attachment starts there, after everything it saw before.
    let joined = tj["first_upstream"].as_u64().unwrap();
    assert_eq!(second["first_upstream"].as_u64(), Some(joined), "{cj} {tj}");
    assert!(joined > first["last_upstream"].as_u64().unwrap(), "{cj}");
    assert_eq!(second["last_upstream"], 2999, "{cj}");
    assert_eq!(tj["upstream_published"], 3000, "{tj}");
    assert_eq!(cj["end_of_stream_after"], tj["frames"], "{cj} {tj}");
    assert_eq!((cj["mismatched_words"].as_u64(), cj["out_of_order"].as_u64()), (Some(0), Some(0)), "{cj}");
    assert!(cj["frames"].as_u64().unwrap() >= 400 + (3000 - joined), "{cj}");
}

#[test]
fn the_first_stage_killed_ends_the_others_with_producer_gone_within_a_second() {
    let seen = first_stage_killed("pipe-kill-a", "host", "cpu-spin", &SMALL, 400);
    assert!(seen["frames"].as_u64().unwrap() >= 400, "{seen}");
}

#[test]
fn the_last_stage_killed_stops_the_middle_one_and_the_first_waits_then_gives_up() {
    let (a, b) = (socket("pipe-kill-c-a"), socket("pipe-kill-c-b"));
    let mut c = verify(&b, &["--progress-every", "200"]);
    let t = transform("B transform", &a, &b, "cpu-spin", &[]);
    let g = generate(&a, "cpu-spin", &["--frames", "0", "--attach-timeout", "2"]);
    c.wait_for_line("frame 400", T);
    c.kill9();
    let killed = Instant::now();
    let a_after = line_within(&g, "no consumer attached any more", killed, killed + Duration::from_secs(1));
    let (ts, _, _) = t.finish(Duration::from_secs(5));
    let t_after = killed.elapsed();
    assert_eq!(ts.code(), Some(6), "B: no consumer left");
    assert!(t_after < Duration::from_secs(1) && a_after < Duration::from_secs(1), "B {t_after:?}, A {a_after:?}");
    // A waits --attach-timeout for a consumer, then says so and exits 1.
    let (gs, g_after, _) = g.finish(Duration::from_secs(10));
    assert_eq!(gs.code(), Some(1));
    assert!(g_after < Duration::from_secs(5), "{g_after:?}");
    let _ = c.finish(Duration::from_secs(5));
}
