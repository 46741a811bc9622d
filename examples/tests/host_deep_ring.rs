//! A ring of 256 slots (control-block layout 2) on the host backend, as separate processes, with each CPU
//! strategy: consumers that read from the start and one that joins late see every frame intact; a consumer that
//! stops releasing holds the producer back once it is 256 frames ahead, until the producer evicts it; a consumer
//! killed with SIGKILL stalls nobody.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{consumer_with, producer_on, socket};

/// Small frames (64x32 rgb8, 6 KiB), 256 of them in the ring.
const SMALL: [&str; 4] = ["--width", "64", "--height", "32"];
/// How long a frame may be held before the producer evicts its consumer.
const EVICT_MS: u64 = 1500;
/// Frames the stalling consumer reads before it stops releasing.
const STALL_AFTER: u64 = 300;

#[test]
fn a_256_slot_ring_holds_back_serves_late_joiners_and_survives_a_killed_consumer() {
    for sync in ["cpu-spin", "cpu-sleep"] {
        let sock = socket(&format!("deep-{sync}"));
        let evict = EVICT_MS.to_string();
        let options = [&SMALL[..], &["--until-stdin-closes", "--evict-after-ms", &evict]].concat();
        let mut p = producer_on("host", sync, &sock, 0, 2, 256, &options);
        let a = consumer_with("first", "host", &sock, 0, &[]);
        let stall = STALL_AFTER.to_string();
        let stalled = consumer_with("stalled", "host", &sock, 0, &["--stall-after", &stall, "--stall-timeout", "20"]);
        // The stalled consumer holds frame 300: the producer may publish up to frame 300 + 255 and then must wait
        // for it, until it evicts it.
        let (ss, _, sj) = stalled.finish(Duration::from_secs(60));
        assert!(!ss.success(), "{sync}: an evicted consumer says so in its status: {ss} {sj}");
        assert!(sj["stall_outcome"].as_str().unwrap().starts_with("evicted"), "{sync}: {sj}");
        assert_eq!(sj["frames"], STALL_AFTER, "{sync}: {sj}");
        assert_eq!(sj["mismatched_words"], 0, "{sync}: {sj}");

        a.wait_for_line("frame 5000", Duration::from_secs(60));
        let late = consumer_with("late", "host", &sock, 0, &[]);
        let mut victim = consumer_with("victim", "host", &sock, 0, &[]);
        victim.wait_for_line("frame 1000", Duration::from_secs(60));
        victim.kill9();
        let (vs, _, _) = victim.finish(Duration::from_secs(10));
        assert!(!vs.success(), "{sync}: the victim was killed");
        late.wait_for_line("frame 3000", Duration::from_secs(60));
        p.close_stdin();
        let (ps, _, pj) = p.finish(Duration::from_secs(60));
        let (as_, _, aj) = a.finish(Duration::from_secs(20));
        let (ls, _, lj) = late.finish(Duration::from_secs(20));
        assert!(ps.success(), "{sync}: producer {ps} {pj}");
        assert_eq!(pj["slots"], 256, "{pj}");
        assert_eq!(pj["consumers_lost"], 1, "{sync}: the killed consumer: {pj}");
        // The producer waited for the stalled consumer's release (or its eviction) once 256 frames ahead of it.
        let gap = pj["max_publish_gap_ms"].as_f64().unwrap();
        assert!(gap >= EVICT_MS as f64 * 0.9, "{sync}: the longest wait between publishes was {gap} ms: {pj}");
        let total = pj["frames"].as_u64().unwrap();
        for (status, json) in [(as_, &aj), (ls, &lj)] {
            assert_eq!(status.code(), Some(0), "{sync}: {json}");
            assert_eq!(json["protocol_version"], gpu_ipc::core::wire::PROTOCOL_VERSION, "{sync}: {json}");
            assert_eq!(json["mismatched_words"], 0, "{sync}: {json}");
            assert_eq!(json["end_of_stream_after"], total, "{sync}: {json}");
            let first = json["first_seq"].as_u64().unwrap();
            assert_eq!(json["frames"].as_u64().unwrap(), total - first, "{sync}: every frame from its join: {json}");
        }
        assert_eq!(aj["first_seq"], 0, "{aj}");
        assert!(lj["first_seq"].as_u64().unwrap() >= 5000, "{sync}: the late consumer joined late: {lj}");
    }
}
