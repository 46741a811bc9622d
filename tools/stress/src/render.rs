//! The stress report as Markdown tables (for docs/results.md) and as a short text summary.

use std::fmt::Write;

use super::StressReport;
use super::outcome::Status;
use super::users::{USERS_FRAMES, UsersReport};

/// Table-safe text: no pipes, no line breaks.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn gap(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

/// The whole report as Markdown.
pub fn markdown(r: &StressReport) -> String {
    let mut md = String::new();
    let failed = r.checks.iter().filter(|c| c.status == Status::Failed).count();
    let findings = r.checks.iter().filter(|c| c.status == Status::Finding).count();
    let not_run = r.checks.iter().filter(|c| c.status == Status::NotRun).count();
    let _ = writeln!(md, "# gpu-ipc stress\n");
    let _ = writeln!(
        md,
        "Seed {} ({}), {}x{} RGB frames, {:.0} s. **{}**: {} checks, {failed} failed, {findings} findings, {not_run} not run.\n",
        r.seed,
        if r.quick { "--quick" } else { "full" },
        r.frame[0],
        r.frame[1],
        r.seconds,
        if r.passed { "Passed" } else { "FAILED" },
        r.checks.len()
    );
    if !r.kill_passes.is_empty() {
        let _ = writeln!(
            md,
            "## Random-kill matrix\n\nSIGKILL of the producer or of one of two consumers at a random frame of a {}-frame run \
             (first half), {} kills per cell. Producer killed: every consumer must exit with ProducerGone within the bound, and \
             one that checks frames behind their stamp (GPU-side strategies) with 0 mismatched words. Consumer killed: the producer serves the other to the end with 0 mismatched words.\n",
            r.sizes.kill_frames, r.sizes.kills_per_cell
        );
        md.push_str("| MPS | backend | sync | victim | kills | passed | hangs | failed | MPS faults | frames never published (flagged) | frames skipped (stamp) | lost frames | mismatched words | ProducerGone median / max (s) |\n");
        md.push_str("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for pass in &r.kill_passes {
            let mode = if pass.mps { "yes" } else { "no" };
            if pass.status == Status::NotRun {
                let _ = writeln!(md, "| {mode} | not run: {} |||||||||||||", cell(&pass.note));
            }
            for c in &pass.cells {
                let gone = match (c.gone_median_s, c.gone_max_s) {
                    (Some(m), Some(x)) => format!("{m:.3} / {x:.3}"),
                    _ => "-".to_owned(),
                };
                let _ = writeln!(
                    md,
                    "| {mode} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {gone} |",
                    c.cell.backend,
                    c.cell.sync,
                    c.cell.victim.name(),
                    c.kills,
                    c.passed,
                    c.hangs,
                    c.failed,
                    c.mps_faults,
                    c.never_published,
                    c.skipped,
                    c.lost_frames,
                    c.mismatched_words
                );
            }
        }
        for pass in r.kill_passes.iter().filter(|p| p.mps && p.status != Status::NotRun) {
            let _ = writeln!(
                md,
                "\nUnder MPS: {:.0} s, the daemon was started again {} times. {}",
                pass.seconds,
                pass.mps_restarts,
                cell(&pass.note)
            );
        }
        md.push('\n');
    }
    checks_table(&mut md, r, "hostile", "Hostile clients against a streaming producer");
    if !r.front_door.is_empty() {
        md.push_str("| backend | sync | frames | producer longest gap (ms) | consumers' longest gaps (ms) | producer fds before / after |\n");
        md.push_str("|---|---|---:|---:|---|---|\n");
        for f in &r.front_door {
            let consumers = f.consumer_max_gap_ms.iter().map(|g| gap(*g)).collect::<Vec<_>>().join(", ");
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {consumers} | {} / {} |",
                f.backend,
                f.sync,
                opt(f.frames),
                gap(f.producer_max_gap_ms),
                opt(f.producer_fds_before),
                opt(f.producer_fds_after)
            );
        }
        md.push('\n');
    }
    if !r.namespace.is_empty() {
        md.push_str("## A consumer in another PID namespace\n\n| backend | attached | frames verified | result | detail |\n|---|---|---:|---|---|\n");
        for n in &r.namespace {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                n.backend,
                if n.attached { "yes" } else { "no" },
                n.frames,
                n.status.word(),
                cell(&n.detail)
            );
        }
        md.push('\n');
    }
    if let Some(u) = &r.users {
        users_table(&mut md, u);
    }
    if !r.cycles.is_empty() {
        md.push_str("## Attach/detach cycles\n\n| backend | sync | cycles | frames | consumer fd delta | device bytes lost | producer fd delta | seconds | result |\n");
        md.push_str("|---|---|---:|---:|---:|---:|---:|---:|---|\n");
        for c in &r.cycles {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {} |",
                c.backend,
                c.sync,
                c.cycles,
                c.frames,
                opt(c.consumer_fd_delta),
                opt(c.device_bytes_lost),
                opt(c.producer_fd_delta),
                c.seconds,
                c.status.word()
            );
        }
        md.push('\n');
    }
    checks_table(&mut md, r, "evict", "Eviction of a stuck consumer");
    containers_table(&mut md, r);
    mps_kills_table(&mut md, r);
    soak_table(&mut md, r);
    let notable: Vec<_> = r.checks.iter().filter(|c| c.status != Status::Passed).collect();
    if !notable.is_empty() {
        md.push_str("## Failures, findings, not run\n\n");
        for c in notable {
            let _ = writeln!(md, "- **{}** ({}): {}: {}", c.status.word(), c.part, c.name, c.detail.replace('\n', " "));
        }
    }
    md
}

/// The `users` part: one row per backend x strategy x socket door, the answer in words.
fn users_table(md: &mut String, u: &UsersReport) {
    let _ = writeln!(
        md,
        "## Consumers of another user\n\nA producer of uid {} serves a consumer running as uid {} gid {} (the consumer \
         program, `--producer-uid {}`, {USERS_FRAMES} frames): does the CUDA import work across users? /dev/nvidia*: {}.\n",
        u.producer_uid,
        u.consumer_uid,
        u.consumer_gid,
        u.producer_uid,
        cell(&u.devices_note)
    );
    md.push_str(
        "| backend | sync | socket | attached | frames verified | mismatched words | answer | consumer | result |\n",
    );
    md.push_str("|---|---|---|---|---:|---:|---|---|---|\n");
    for run in &u.runs {
        let consumer = run.consumer_end.as_deref().unwrap_or("-");
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {consumer} | {} |",
            run.backend,
            run.sync,
            run.door.name(),
            if run.attached { "yes" } else { "no" },
            run.frames,
            run.mismatched_words,
            cell(&run.answer.words()),
            run.status.word()
        );
    }
    md.push('\n');
}

/// The `containers` part: one row per cell, with what it must do.
fn containers_table(md: &mut String, r: &StressReport) {
    if r.containers.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Clients in isolated containers\n\nEach client runs in its own PID, IPC, network and mount namespaces with a \
         private /dev/shm (`unshare`, root); the producer or owner runs outside, the socket is a path both see. {}\n",
        cell(r.container_proof.as_deref().unwrap_or("The container could not be made."))
    );
    md.push_str(
        "| cell | must | verified | mismatched | seconds | result | detail |\n|---|---|---:|---:|---:|---|---|\n",
    );
    for c in &r.containers {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.1} | {} | {} |",
            cell(&c.name()),
            cell(&c.expectation),
            c.verified,
            c.mismatched_words,
            c.seconds,
            c.status.word(),
            cell(&c.detail)
        );
    }
    md.push('\n');
}

/// The `mps-kills` part: one row per trial, the fault count first.
fn mps_kills_table(md: &mut String, r: &StressReport) {
    if r.mps_kills.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Kills while a kernel waits on shared memory\n\nThe side running the kernel is SIGKILLed once the other has \
         reported {} frames; an unrelated cpu-spin ring pair streams beside them. Expectation: {}. The kernel lease \
         (the library's default: a kernel whose process is gone leaves by itself) is on unless the row says off \
         (`GPU_IPC_KERNEL_LEASE_MS=0`, under MPS, for the comparison).\n",
        super::kernel_kills::KILL_AFTER,
        super::kernel_kills::EXPECTATION
    );
    md.push_str("| MPS | kernel lease | backend | kernel | victim | trials run | with a fault | clients faulted | slowest survivor end (s) | failed |\n|---|---|---|---|---|---:|---:|---:|---:|---:|\n");
    for k in &r.mps_kill_rates {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {}/{} | {} | {} |",
            if k.cell.mps { "yes" } else { "no" },
            if k.cell.lease { "on" } else { "off" },
            k.cell.backend,
            k.cell.kind.name(),
            k.cell.victim.name(),
            k.trials,
            k.trials_with_fault,
            k.clients_faulted,
            k.clients,
            k.survivor_end_max_s.map_or_else(|| "-".to_owned(), |s| format!("{s:.3}")),
            k.failed
        );
    }
    md.push_str("\nEvery trial:\n\n| MPS | kernel lease | backend | kernel | victim | trial | clients faulted | survivor ended after (s) | result | detail |\n|---|---|---|---|---|---:|---:|---:|---|---|\n");
    for k in &r.mps_kills {
        let faulted = if k.status == Status::NotRun { "-".to_owned() } else { format!("{}/{}", k.faulted, k.clients) };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {faulted} | {} | {} | {} |",
            if k.cell.mps { "yes" } else { "no" },
            if k.cell.lease { "on" } else { "off" },
            k.cell.backend,
            k.cell.kind.name(),
            k.cell.victim.name(),
            k.trial,
            k.survivor_end_s.map_or_else(|| "-".to_owned(), |s| format!("{s:.3}")),
            k.status.word(),
            cell(&k.detail)
        );
    }
    md.push('\n');
}

/// The soak: one row.
fn soak_table(md: &mut String, r: &StressReport) {
    let Some(s) = &r.soak else { return };
    md.push_str("## Soak\n\n| backend | sync | MPS | frame | frames | words checked | mismatched words | seconds | frames/s | GB/s | result |\n");
    md.push_str("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|\n");
    let _ = writeln!(
        md,
        "| {} | {}{} | {} | {}x{} rgb8 | {} | {} | {} | {:.1} | {:.0} | {:.1} | {} |\n",
        s.backend,
        s.sync,
        if s.graph { " (graphs)" } else { "" },
        if s.mps { "yes" } else { "no" },
        s.frame[0],
        s.frame[1],
        s.frames,
        s.words_checked,
        s.mismatched_words,
        s.seconds,
        s.fps,
        s.gb_per_s,
        s.status.word()
    );
    if s.status != Status::Passed {
        let _ = writeln!(md, "{}\n", cell(&s.detail));
    }
}

fn checks_table(md: &mut String, r: &StressReport, part: &str, title: &str) {
    let rows: Vec<_> = r.checks.iter().filter(|c| c.part == part).collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(md, "## {title}\n\n| check | result | detail |\n|---|---|---|");
    for c in rows {
        let _ = writeln!(md, "| {} | {} | {} |", cell(&c.name), c.status.word(), cell(&c.detail));
    }
    md.push('\n');
}

/// A few lines: the verdict, then every check that did not pass.
pub fn summary(r: &StressReport) -> String {
    let mut text = String::new();
    let count = |s: Status| r.checks.iter().filter(|c| c.status == s).count();
    let _ = writeln!(
        text,
        "gpu-ipc-stress: {} in {:.0} s (seed {}): {} passed, {} failed, {} findings, {} not run",
        if r.passed { "PASSED" } else { "FAILED" },
        r.seconds,
        r.seed,
        count(Status::Passed),
        count(Status::Failed),
        count(Status::Finding),
        count(Status::NotRun)
    );
    for c in r.checks.iter().filter(|c| c.status != Status::Passed) {
        let _ = writeln!(text, "  [{}] {}: {}", c.status.word(), c.name, c.detail);
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::outcome::{CellCounts, Check, Trial, TrialOutcome};
    use crate::run::{CyclesRun, FrontDoorRun, NamespaceRun};
    use crate::schedule::{Cell, KillPoint, Sizes, Victim};
    use crate::users::{CrossUserAnswer, SocketDoor, UsersRun};
    use crate::{KillPass, Part, SCHEMA_VERSION};

    fn users_run(backend: &str, door: SocketDoor, answer: CrossUserAnswer) -> UsersRun {
        let verified = answer == CrossUserAnswer::Verified;
        UsersRun {
            backend: backend.into(),
            sync: "cpu-spin".into(),
            door,
            attached: verified,
            frames: if verified { 50 } else { 0 },
            mismatched_words: 0,
            consumer_exit: match answer {
                CrossUserAnswer::Verified => Some(0),
                CrossUserAnswer::NotRun { .. } => None,
                _ => Some(1),
            },
            consumer_end: match answer {
                CrossUserAnswer::Verified => Some("exit 0".into()),
                CrossUserAnswer::NotRun { .. } => None,
                _ => Some("exit 1".into()),
            },
            consumer_last_lines: vec![],
            producer: "producer: exit 0".into(),
            status: answer.status(),
            detail: answer.words(),
            answer,
        }
    }

    fn report() -> StressReport {
        let cell = Cell { backend: "vmm", sync: "gpu-stream-ops", victim: Victim::Producer };
        let trials = vec![
            Trial {
                cell,
                trial: 0,
                kill: KillPoint { after_frames: 100, extra_delay_us: 5 },
                killed_at_ms: Some(400.0),
                outcome: TrialOutcome::Passed,
                gone_s: vec![0.2, 0.25],
                lost_frames: 0,
                mismatched_words: 0,
                frames_never_published: 0,
                frames_skipped: 3,
            },
            Trial {
                cell,
                trial: 1,
                kill: KillPoint { after_frames: 150, extra_delay_us: 5 },
                killed_at_ms: Some(420.0),
                outcome: TrialOutcome::MpsFault { detail: "700".into() },
                gone_s: vec![],
                lost_frames: 0,
                mismatched_words: 0,
                frames_never_published: 0,
                frames_skipped: 0,
            },
        ];
        let pass = KillPass {
            mps: true,
            status: Status::Passed,
            note: String::new(),
            mps_restarts: 1,
            seconds: 9.0,
            cells: CellCounts::all(&trials),
            trials,
        };
        let skipped = KillPass {
            mps: false,
            status: Status::NotRun,
            note: "skipped | reason".into(),
            mps_restarts: 0,
            seconds: 0.0,
            cells: vec![],
            trials: vec![],
        };
        StressReport {
            schema: SCHEMA_VERSION,
            quick: true,
            seed: 42,
            parts: vec![Part::Kills, Part::Hostile],
            sizes: Sizes::QUICK,
            frame: [1280, 720],
            started_unix: 0,
            seconds: 12.0,
            kill_passes: vec![skipped, pass],
            front_door: vec![FrontDoorRun {
                backend: "vmm".into(),
                sync: "cpu-spin".into(),
                producer_max_gap_ms: Some(3.25),
                consumer_max_gap_ms: vec![Some(4.0), None],
                frames: Some(9000),
                producer_fds_before: Some(40),
                producer_fds_after: Some(40),
            }],
            namespace: vec![NamespaceRun {
                backend: "legacy".into(),
                attached: false,
                frames: 0,
                mismatched_words: 0,
                status: Status::Finding,
                detail: "consumer pidns: exit 1: cuIpcOpenMemHandle failed".into(),
            }],
            users: Some(UsersReport {
                producer_uid: 0,
                consumer_uid: 65534,
                consumer_gid: 65534,
                devices: vec![],
                devices_note: "uid 65534 may open every /dev/nvidia* file read-write (/dev/nvidia0)".into(),
                runs: vec![
                    users_run(
                        "legacy",
                        SocketDoor::Uid,
                        CrossUserAnswer::Refused {
                            error:
                                "consumer: cuIpcOpenMemHandle failed: CUDA_ERROR_INVALID_VALUE (1): invalid | argument"
                                    .into(),
                        },
                    ),
                    users_run("vmm", SocketDoor::Group, CrossUserAnswer::Verified),
                    users_run("vmm", SocketDoor::Uid, CrossUserAnswer::NotRun { reason: "needs root".into() }),
                ],
            }),
            cycles: vec![CyclesRun {
                backend: "vmm".into(),
                sync: "cpu-spin".into(),
                cycles: 200,
                frames: 800,
                status: Status::Passed,
                consumer_fd_delta: Some(0),
                device_bytes_lost: Some(0),
                producer_fd_delta: Some(-1),
                ..CyclesRun::default()
            }],
            container_proof: Some("inside: pid 1".into()),
            containers: vec![],
            mps_kills: vec![],
            mps_kill_rates: vec![],
            soak: None,
            checks: vec![
                Check::new("hostile", "vmm: random bytes", Status::Passed, "6 clients"),
                Check::new("namespace", "legacy: pid ns", Status::Finding, "exit 1"),
                Check::new("evict", "vmm/cpu-spin: evict", Status::NotRun, "API missing"),
                Check::new("kills", "MPS: vmm/gpu-stream-ops/producer", Status::Failed, "1 hang"),
            ],
            passed: false,
        }
    }

    #[test]
    fn the_markdown_has_every_table_with_the_counts() {
        let md = markdown(&report());
        assert!(md.contains("**FAILED**: 4 checks, 1 failed, 1 findings, 1 not run"), "{md}");
        assert!(
            md.contains(
                "| yes | vmm | gpu-stream-ops | producer | 2 | 1 | 0 | 0 | 1 | 0 | 3 | 0 | 0 | 0.250 / 0.250 |"
            ),
            "{md}"
        );
        assert!(md.contains("| no | not run: skipped \\| reason |"), "{md}");
        assert!(md.contains("started again 1 times"));
        assert!(md.contains("| vmm: random bytes | passed | 6 clients |"));
        assert!(md.contains("| vmm | cpu-spin | 9000 | 3.2 | 4.0, - | 40 / 40 |"), "{md}");
        assert!(md.contains("| legacy | no | 0 | finding | consumer pidns: exit 1: cuIpcOpenMemHandle failed |"));
        assert!(md.contains("| vmm | cpu-spin | 200 | 800 | 0 | 0 | -1 | 0.0 | passed |"), "{md}");
        assert!(md.contains("## Eviction of a stuck consumer"));
        assert!(md.contains("A producer of uid 0 serves a consumer running as uid 65534 gid 65534"), "{md}");
        assert!(
            md.contains(
                "| legacy | cpu-spin | by uid (0666) | no | 0 | 0 | refused: consumer: cuIpcOpenMemHandle failed: \
                 CUDA_ERROR_INVALID_VALUE (1): invalid \\| argument | exit 1 | finding |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| vmm | cpu-spin | by group (0660) | yes | 50 | 0 | imported and verified 50 frames | exit 0 | passed |"),
            "{md}"
        );
        assert!(
            md.contains("| vmm | cpu-spin | by uid (0666) | no | 0 | 0 | not run: needs root | - | not run |"),
            "{md}"
        );
        assert!(md.contains("- **FAILED** (kills): MPS: vmm/gpu-stream-ops/producer: 1 hang"));
        // Every table row has as many cells as its header (escaped pipes are text).
        let pipes = |line: &str| line.replace("\\|", "").matches('|').count();
        for table in md.split("\n\n").filter(|t| t.starts_with('|')) {
            let header = pipes(table.lines().next().unwrap());
            assert!(table.lines().all(|l| pipes(l) == header), "{table}");
        }
    }

    #[test]
    fn the_summary_lists_what_did_not_pass() {
        let text = summary(&report());
        assert!(
            text.starts_with("gpu-ipc-stress: FAILED in 12 s (seed 42): 1 passed, 1 failed, 1 findings, 1 not run")
        );
        assert!(text.contains("[FAILED] MPS: vmm/gpu-stream-ops/producer: 1 hang"));
        assert!(!text.contains("random bytes"));
    }

    #[test]
    fn the_json_document_has_the_fields_a_reader_needs() {
        let json = serde_json::to_value(report()).unwrap();
        assert_eq!(json["schema"], 2);
        assert_eq!(json["kill_passes"][1]["cells"][0]["mps_faults"], 1);
        assert_eq!(json["kill_passes"][1]["trials"][1]["outcome"]["kind"], "mps-fault");
        assert_eq!(json["kill_passes"][1]["trials"][0]["cell"]["victim"], "producer");
        assert_eq!(json["checks"][1]["status"], "finding");
        assert_eq!(json["parts"][0], "kills");
        assert_eq!(json["sizes"]["kills_per_cell"], 3);
        let users = &json["users"];
        assert_eq!((users["producer_uid"].as_u64(), users["consumer_uid"].as_u64()), (Some(0), Some(65534)));
        assert_eq!(users["runs"][0]["answer"]["kind"], "refused");
        assert!(users["runs"][0]["answer"]["error"].as_str().unwrap().contains("CUDA_ERROR_INVALID_VALUE"));
        assert_eq!(users["runs"][0]["status"], "finding");
        assert_eq!(users["runs"][0]["door"], "uid");
        assert_eq!(users["runs"][1]["answer"]["kind"], "verified");
        assert_eq!(users["runs"][1]["door"], "group");
        assert_eq!(users["runs"][2]["answer"]["kind"], "not-run");
    }
}

#[cfg(test)]
mod new_parts_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::containers::{ContainerRun, cells};
    use crate::kernel_kills::{KernelCell, KernelKillRun, KernelKind};
    use crate::schedule::Victim;
    use crate::soak::SoakReport;

    fn with_new_parts() -> StressReport {
        let mut r = base();
        let mut event: ContainerRun =
            cells(&["vmm"], false).into_iter().find(|c| c.name() == "vmm/ipc-event ring").unwrap();
        event.status = Status::Failed;
        event.detail = "a raw CUDA error: consumer (container): exit 1: CUDA_ERROR_MAP_FAILED | x".into();
        r.containers = vec![event];
        r.container_proof = Some("inside: pid 1, ipc:[9]".into());
        let cell =
            KernelCell { backend: "vmm", kind: KernelKind::GpuPoll, victim: Victim::Producer, mps: true, lease: true };
        r.mps_kills = vec![KernelKillRun {
            cell,
            trial: 1,
            status: Status::Finding,
            detail: "mps clients faulted: 3/3 (survivor FAULTED: ...)".into(),
            clients: 3,
            faulted: 3,
            survivor_end_s: Some(0.012),
            killed_at_ms: Some(800.0),
            seconds: 4.0,
        }];
        r.mps_kill_rates = crate::kill_rates::rates(&r.mps_kills);
        r.soak = Some(SoakReport {
            backend: "vmm".into(),
            sync: "gpu-stream-ops".into(),
            mps: true,
            frame: [3840, 2160],
            slots: 4,
            frames_wanted: 10_000_000,
            frames: 10_000_000,
            producer_frames: 10_000_000,
            words_checked: 62_208_000_000_000,
            seconds: 200.0,
            fps: 50_000.0,
            gb_per_s: 1244.2,
            status: Status::Passed,
            ..SoakReport::default()
        });
        r
    }

    fn base() -> StressReport {
        StressReport {
            schema: crate::SCHEMA_VERSION,
            quick: false,
            seed: 1,
            parts: vec![crate::Part::Containers, crate::Part::MpsKills],
            sizes: crate::schedule::Sizes::FULL,
            frame: [1280, 720],
            started_unix: 0,
            seconds: 1.0,
            kill_passes: vec![],
            front_door: vec![],
            namespace: vec![],
            users: None,
            cycles: vec![],
            container_proof: None,
            containers: vec![],
            mps_kills: vec![],
            mps_kill_rates: vec![],
            soak: None,
            checks: vec![],
            passed: true,
        }
    }

    #[test]
    fn the_new_parts_have_their_tables_with_the_fault_count_and_the_soak_figures() {
        let r = with_new_parts();
        let md = markdown(&r);
        assert!(md.contains("## Clients in isolated containers"), "{md}");
        assert!(md.contains("inside: pid 1, ipc:[9]"), "{md}");
        assert!(md.contains("| vmm/ipc-event ring | a consumer in a container verifies all 200 frames"), "{md}");
        assert!(md.contains("| 0 | 0 | 0.0 | FAILED | a raw CUDA error"), "{md}");
        assert!(
            md.contains(
                "| yes | on | vmm | gpu-poll wait | producer | 1 | 3/3 | 0.012 | finding | mps clients faulted: 3/3"
            ),
            "{md}"
        );
        assert!(md.contains("| yes | on | vmm | gpu-poll wait | producer | 1 | 1 | 3/3 | 0.012 | 0 |"), "{md}");
        assert!(
            md.contains("| vmm | gpu-stream-ops | yes | 3840x2160 rgb8 | 10000000 | 62208000000000 | 0 | 200.0 | 50000 | 1244.2 | passed |"),
            "{md}"
        );
        let pipes = |line: &str| line.replace("\\|", "").matches('|').count();
        for table in md.split("\n\n").filter(|t| t.starts_with('|')) {
            let header = pipes(table.lines().next().unwrap());
            assert!(table.lines().all(|l| pipes(l) == header), "{table}");
        }
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["mps_kills"][0]["cell"]["kind"], "gpu-poll");
        assert_eq!(json["mps_kills"][0]["faulted"], 3);
        assert_eq!(json["mps_kill_rates"][0]["trials_with_fault"], 1);
        assert_eq!(json["containers"][0]["sync"], "ipc-event");
        assert_eq!(json["soak"]["mismatched_words"], 0);
        assert_eq!(json["soak"]["frames"], 10_000_000);
    }
}
