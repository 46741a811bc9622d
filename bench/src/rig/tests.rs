//! Tests of `rig.rs` (kept apart so that the module reads in one screenful more).

use super::*;

fn cfg() -> RunConfig {
    RunConfig {
        device: 0,
        shape: [3840, 2160, 3],
        frames: 100,
        warmup: 10,
        frame_timeout: Duration::from_secs(1),
        row_timeout: Duration::from_secs(1),
    }
}

fn report(measured_frames: u64, missing_stamps: u64) -> ConsumerReport {
    ConsumerReport {
        frames: measured_frames + 10,
        measured_frames,
        cpu_ns: 2_000_000,
        mismatches: 0,
        latencies_ns: vec![40_000; (measured_frames - missing_stamps) as usize],
        missing_stamps,
        gpu_done_ns: Vec::new(),
    }
}

#[test]
fn a_row_measurement_from_the_producer_window_and_the_reports() {
    let c = cfg();
    assert_eq!(c.frame_bytes(), 24_883_200);
    let m = measurement(&c, 0.01, 500_000, &[report(100, 0), report(100, 0)], Vec::new()).unwrap();
    assert_eq!(m.fps, 10_000.0);
    assert_eq!(m.producer_cpu_us_per_frame, 5.0);
    assert_eq!(m.consumer_cpu_us_per_frame, vec![20.0, 20.0]);
    assert_eq!(m.latency.as_ref().unwrap().count, 200);
    assert_eq!(m.note, None);
    let m = measurement(&c, 0.01, 0, &[report(99, 3)], vec!["why".into()]).unwrap();
    assert_eq!(m.note.as_deref(), Some("why; 3 frames had no publish time; consumer 0 measured 99 frames, not 100"));
}

#[test]
fn a_row_past_its_limit_says_where_it_stopped() {
    let c = cfg();
    assert!(check_deadline(Instant::now() + Duration::from_secs(5), &c, 3).is_ok());
    let err = check_deadline(Instant::now(), &c, 42).unwrap_err().to_string();
    assert!(err.contains("stopped at frame 42 of 110"), "{err}");
}
