//! The parts' runners: each part's cells in its MPS modes (a private daemon started and stopped around them), and
//! the checks their results become. `main` in the crate root picks the parts and writes the report.

use super::*;

/// A private MPS daemon and its clients' environment.
pub(crate) fn start_mps(control: &MpsControl) -> Result<(MpsDaemon, ChildEnv), String> {
    let daemon = MpsDaemon::start(control).map_err(|e| e.to_string())?;
    let env = client_env(&daemon);
    Ok((daemon, env))
}

/// Stops `daemon`, copying its logs into `--out`/`name` first.
pub(crate) fn stop_mps(mut daemon: MpsDaemon, args: &StressArgs, name: &str) {
    if let Some(out) = &args.out {
        daemon.copy_logs(&out.join(name));
    }
    if let Err(problem) = daemon.stop() {
        eprintln!("gpu-ipc-stress: {problem}");
    }
}

/// The check of a pass that needed MPS and could not start it: failed, unless `--allow-no-mps`.
pub(crate) fn no_mps_check(part: &str, what: &str, reason: &str, allow_no_mps: bool) -> Check {
    let status = if allow_no_mps { Status::NotRun } else { Status::Failed };
    Check::new(part, format!("{what}, MPS"), status, format!("no private MPS daemon: {reason}"))
}

/// The `containers` part: the isolation's check, then every cell without MPS, then the gpu-poll cells under MPS.
pub(crate) fn run_containers(ctx: &Ctx, backends: &[&'static str], args: &StressArgs, report: &mut StressReport) {
    eprintln!("gpu-ipc-stress: containers (own PID, IPC, network and mount namespaces, private /dev/shm)");
    let from = report.checks.len();
    let modes = args.mps_modes();
    let wanted_mps = modes.contains(&true) && !backends.contains(&"host");
    let cells = containers::cells(backends, wanted_mps);
    let iso = match containers::Isolation::find() {
        Ok((iso, proof)) => {
            report.checks.push(Check::new(
                "containers",
                "a container isolates pid, ipc, net, mnt and /dev/shm",
                Status::Passed,
                proof.clone(),
            ));
            print_checks(&report.checks[from..]);
            report.container_proof = Some(proof);
            iso
        }
        Err(why) => {
            for mut cell in cells {
                cell.detail = why.clone();
                report.checks.push(cell.check());
                report.containers.push(cell);
            }
            print_checks(&report.checks[from..]);
            return;
        }
    };
    let (plain, under_mps): (Vec<ContainerRun>, Vec<ContainerRun>) = cells.into_iter().partition(|c| !c.mps);
    for cell in plain {
        let cell = containers::run_cell(ctx, &iso, cell);
        let check = cell.check();
        print_checks(std::slice::from_ref(&check));
        report.checks.push(check);
        report.containers.push(cell);
    }
    if under_mps.is_empty() {
        return;
    }
    match start_mps(&MpsControl::from_path()) {
        Ok((daemon, env)) => {
            let mps_ctx = Ctx { env, mps: true, ..ctx.clone() };
            for cell in under_mps {
                let cell = containers::run_cell(&mps_ctx, &iso, cell);
                let check = cell.check();
                print_checks(std::slice::from_ref(&check));
                report.checks.push(check);
                report.containers.push(cell);
            }
            stop_mps(daemon, args, "mps-log-containers");
        }
        Err(reason) => {
            let check = no_mps_check("containers", "gpu-poll rings in containers", &reason, args.allow_no_mps);
            print_checks(std::slice::from_ref(&check));
            report.checks.push(check);
        }
    }
}

/// The `mps-kills` part, on each backend of `--backend` (legacy and vmm by default), in the MPS modes of `--mps`,
/// `--trials` trials per cell (each its own check), then one line per cell with its fault rate.
pub(crate) fn run_mps_kills(ctx: &Ctx, args: &StressArgs, report: &mut StressReport) {
    let trials = args.mps_kill_trials();
    let control = MpsControl::from_path();
    let first = report.mps_kills.len();
    for backend in args.backends() {
        for &mps in args.mps_modes() {
            let mode = if mps { "MPS" } else { "no MPS" };
            eprintln!(
                "gpu-ipc-stress: kills while a kernel waits ({backend}, {mode}), {trials} trials per cell, with a \
                 bystander pair"
            );
            let mut daemon = None;
            let mut cell_ctx = Ctx { mps, ..ctx.clone() };
            if mps {
                match start_mps(&control) {
                    Ok((d, env)) => {
                        cell_ctx.env = env;
                        daemon = Some(d);
                    }
                    Err(reason) => {
                        let check = no_mps_check("mps-kills", "kills while a kernel waits", &reason, args.allow_no_mps);
                        print_checks(std::slice::from_ref(&check));
                        report.checks.push(check);
                        continue;
                    }
                }
            }
            'cells: for cell in kernel_kills::cells(backend, mps, args.kernel_lease) {
                for n in 1..=trials {
                    let mut run = kernel_kills::trial(&cell_ctx, cell);
                    run.trial = n;
                    let not_run = run.status == Status::NotRun;
                    let name = if not_run { cell.name() } else { format!("{} trial {n}/{trials}", cell.name()) };
                    let check = Check::new("mps-kills", name, run.status, run.detail.clone());
                    print_checks(std::slice::from_ref(&check));
                    report.checks.push(check);
                    // After a fault (or anything wrong) under MPS, a fresh daemon, so that the next trial starts
                    // clean.
                    let spoiled = run.faulted > 0 || run.status == Status::Failed;
                    report.mps_kills.push(run);
                    if not_run {
                        continue 'cells;
                    }
                    if spoiled && let Some(d) = daemon.take() {
                        stop_mps(d, args, "mps-log-mps-kills-fault");
                        match start_mps(&control) {
                            Ok((d, env)) => {
                                cell_ctx.env = env;
                                daemon = Some(d);
                            }
                            Err(reason) => {
                                let check = no_mps_check("mps-kills", "restarting MPS after a fault", &reason, false);
                                print_checks(std::slice::from_ref(&check));
                                report.checks.push(check);
                                break 'cells;
                            }
                        }
                    }
                }
            }
            if let Some(d) = daemon {
                stop_mps(d, args, "mps-log-mps-kills");
            }
        }
    }
    for rate in kill_rates::rates(&report.mps_kills[first..]) {
        eprintln!("gpu-ipc-stress: mps-kills rate: {}: {}", rate.cell.name(), rate.summary());
    }
    report.mps_kill_rates = kill_rates::rates(&report.mps_kills);
}

/// `soak`: under a private MPS daemon unless `--mps off`.
pub(crate) fn run_soak(ctx: &Ctx, args: &StressArgs, report: &mut StressReport) {
    let mps = args.mps != MpsMode::Off && args.backend.as_deref() != Some("host");
    let settings = SoakReport {
        backend: args.one_backend().to_owned(),
        sync: args.sync.clone(),
        graph: args.graph,
        mps,
        frame: [ctx.width, ctx.height],
        slots: soak::SOAK_SLOTS,
        frames_wanted: args.frames,
        max_seconds: args.max_seconds,
        ..SoakReport::default()
    };
    let name = format!(
        "{}/{}{}{}: {} frames of {}x{} rgb8 from one process to another, every word checked by the consumer{}, 0 \
         mismatched",
        settings.backend,
        settings.sync,
        if settings.graph { " (frame graphs)" } else { "" },
        if mps { ", MPS" } else { "" },
        settings.frames_wanted,
        ctx.width,
        ctx.height,
        if settings.backend == "host" { " (host backend: on the CPU)" } else { " (on the GPU)" }
    );
    eprintln!("gpu-ipc-stress: soak {name}");
    let (daemon, env) = if mps {
        match start_mps(&MpsControl::from_path()) {
            Ok((d, env)) => (Some(d), env),
            Err(reason) => {
                report.checks.push(no_mps_check("soak", &name, &reason, args.allow_no_mps));
                print_checks(&report.checks[report.checks.len() - 1..]);
                return;
            }
        }
    } else {
        (None, ctx.env.clone())
    };
    let run = soak::soak(&Ctx { env, mps, ..ctx.clone() }, settings);
    if let Some(d) = daemon {
        stop_mps(d, args, "mps-log-soak");
    }
    let check = Check::new("soak", name, run.status, run.detail.clone());
    print_checks(std::slice::from_ref(&check));
    report.checks.push(check);
    report.soak = Some(run);
}

pub(crate) fn print_checks(checks: &[Check]) {
    for c in checks {
        eprintln!("gpu-ipc-stress:   [{}] {}: {}", c.status.word(), c.name, c.detail);
    }
}

/// One check per consumer of another user.
pub(crate) fn users_checks(users: &UsersReport) -> Vec<Check> {
    users
        .runs
        .iter()
        .map(|r| {
            Check::new(
                "users",
                format!(
                    "{}/{}, socket {}: a consumer of uid {} imports the frames of a producer of uid {}",
                    r.backend,
                    r.sync,
                    r.door.name(),
                    users.consumer_uid,
                    users.producer_uid
                ),
                r.status,
                r.detail.clone(),
            )
        })
        .collect()
}

/// The checks of a kill pass: one per cell, or the pass's own when it did not run.
pub(crate) fn pass_checks(pass: &KillPass, allow_no_mps: bool) -> Vec<Check> {
    let mode = if pass.mps { "MPS" } else { "no MPS" };
    if pass.status == Status::NotRun {
        let status = if pass.mps && !allow_no_mps { Status::Failed } else { Status::NotRun };
        return vec![Check::new("kills", format!("kill matrix, {mode}"), status, pass.note.clone())];
    }
    pass.cells
        .iter()
        .map(|c| {
            Check::new(
                "kills",
                format!("{mode}: {}", c.cell.name()),
                c.status(),
                format!(
                    "{} kills: {} passed, {} hangs, {} failed, {} MPS faults; {} lost frames, {} mismatched words{}",
                    c.kills,
                    c.passed,
                    c.hangs,
                    c.failed,
                    c.mps_faults,
                    c.lost_frames,
                    c.mismatched_words,
                    c.gone_max_s.map(|g| format!("; ProducerGone within {g:.3} s")).unwrap_or_default()
                ),
            )
        })
        .collect()
}

/// The kill matrix in one MPS mode.
pub(crate) fn kill_pass(base: &Ctx, backends: &[&'static str], mps: bool, args: &StressArgs) -> KillPass {
    let started = Instant::now();
    let mut pass = KillPass {
        mps,
        status: Status::Passed,
        note: String::new(),
        mps_restarts: 0,
        seconds: 0.0,
        cells: Vec::new(),
        trials: Vec::new(),
    };
    let control = MpsControl::from_path();
    let mut daemon = None;
    let mut ctx = base.clone();
    ctx.mps = mps;
    if mps {
        match MpsDaemon::start(&control) {
            Ok(d) => {
                ctx.env = client_env(&d);
                daemon = Some(d);
            }
            Err(reason) => {
                pass.status = Status::NotRun;
                pass.note = format!("no private MPS daemon: {reason}");
                eprintln!("gpu-ipc-stress: kill matrix under MPS not run: {reason}");
                return pass;
            }
        }
    }
    let cells = schedule::cells(backends, mps);
    let total = cells.len() as u32 * ctx.sizes.kills_per_cell;
    let mut rng = SplitMix::new(ctx.seed ^ u64::from(mps));
    let mode = if mps { "MPS" } else { "no MPS" };
    let mut n = 0;
    'cells: for cell in cells {
        let points =
            schedule::kill_points(&mut rng, ctx.sizes.kills_per_cell, ctx.sizes.kill_frames, ctx.sizes.progress_every);
        for (i, point) in points.into_iter().enumerate() {
            n += 1;
            let trial = run::kill_trial(&ctx, cell, i as u32, point);
            eprintln!(
                "gpu-ipc-stress: kills [{mode}] {n}/{total} {} #{i} at frame {}: {}",
                cell.name(),
                point.after_frames,
                describe_outcome(&trial)
            );
            let bad = trial.outcome != TrialOutcome::Passed;
            pass.trials.push(trial);
            if mps
                && bad
                && let (Some(program), Some(d)) = (control.program.as_deref(), daemon.as_mut())
                && !run::mps_answers(program, &ctx.env)
            {
                eprintln!("gpu-ipc-stress: the MPS daemon stopped answering; starting it again");
                let _ = d.stop();
                match MpsDaemon::start(&control) {
                    Ok(fresh) => {
                        ctx.env = client_env(&fresh);
                        *d = fresh;
                        pass.mps_restarts += 1;
                    }
                    Err(reason) => {
                        pass.note = format!(
                            "the MPS daemon died and could not be started again ({reason}); the matrix stopped there"
                        );
                        pass.status = Status::Failed;
                        break 'cells;
                    }
                }
            }
        }
    }
    pass.cells = CellCounts::all(&pass.trials);
    if pass.status == Status::Passed && pass.cells.iter().any(|c| c.status() == Status::Failed) {
        pass.status = Status::Failed;
    }
    if let Some(mut d) = daemon {
        if let Some(out) = &args.out {
            d.copy_logs(&out.join(if pass.mps_restarts > 0 { "mps-log-last" } else { "mps-log" }));
        }
        if let Err(problem) = d.stop() {
            eprintln!("gpu-ipc-stress: {problem}");
        }
    }
    pass.seconds = started.elapsed().as_secs_f64();
    pass
}

pub(crate) fn client_env(daemon: &MpsDaemon) -> ChildEnv {
    daemon.client_env().into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect()
}

pub(crate) fn describe_outcome(t: &Trial) -> String {
    match &t.outcome {
        TrialOutcome::Passed if !t.gone_s.is_empty() => {
            format!(
                "passed (ProducerGone after {})",
                t.gone_s.iter().map(|g| format!("{g:.3} s")).collect::<Vec<_>>().join(", ")
            )
        }
        TrialOutcome::Passed => "passed".to_owned(),
        TrialOutcome::Hang { who } => format!("HANG: {who}"),
        TrialOutcome::MpsFault { detail } => format!("MPS fault (finding): {detail}"),
        TrialOutcome::Failed { reason } => format!("FAILED: {reason}"),
    }
}
