//! Where a measurement ran: device, driver, MPS, date, commit and command, recorded in every probe's and benchmark's
//! JSON so a number can always be traced to what produced it; and the "no CUDA" exit they share with the doctor.

use serde::{Deserialize, Serialize};

use crate::cuda::{self, DeviceReport};
use crate::exit::EXIT_NO_CUDA;
use crate::mps;

/// The facts a measurement's result is tied to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasurementEnv {
    /// Every visible device (name, UUID, compute capability, IPC attributes), as the doctor reports them.
    pub devices: Vec<DeviceReport>,
    /// The driver's CUDA version, e.g. `13.0`.
    pub driver: String,
    /// Whether an MPS daemon was running (or its control pipe existed) when the measurement started.
    pub mps: bool,
    /// UTC date and time the measurement started, `YYYY-MM-DDTHH:MM:SSZ`.
    pub date: String,
    /// The commit the binary was built from (`GPU_IPC_COMMIT`, set by the GPU suite from `stage/COMMIT`), or
    /// `unknown`.
    pub commit: String,
    /// The command line that ran the measurement.
    pub command: String,
    /// The host name.
    pub host: String,
}

impl MeasurementEnv {
    /// The device a measurement ran on, by ordinal.
    pub fn device(&self, ordinal: i32) -> Option<&DeviceReport> {
        self.devices.iter().find(|d| i64::from(d.ordinal) == i64::from(ordinal))
    }

    /// `NVIDIA H100 80GB HBM3 (driver 13.0, MPS)`: the one-line identity a report prints.
    pub fn headline(&self, ordinal: i32) -> String {
        let name = self.device(ordinal).map_or("unknown device", |d| d.name.as_str());
        let mps = if self.mps { "MPS on" } else { "no MPS" };
        format!("{name} (CUDA driver {}, {mps})", self.driver)
    }
}

/// Collects the environment, or returns the one-line explanation and exit status when CUDA cannot be used here
/// (no driver, no device): every subcommand stops there with the doctor's message in its own name, `command` (e.g.
/// `gpu-ipc probe overhead: no CUDA driver: ...`), and exit status 3.
pub fn collect(command: &str) -> Result<MeasurementEnv, (String, u8)> {
    let driver = cuda::driver_section();
    let devices = cuda::devices();
    if let Some(reason) = cuda::no_cuda_reason(&driver, &devices) {
        return Err((format!("{command}: {reason}"), EXIT_NO_CUDA));
    }
    let mps = mps::active_here();
    Ok(MeasurementEnv {
        devices,
        driver: driver.driver_version.map_or_else(|| "unknown".to_owned(), |v| format!("{}.{}", v.major, v.minor)),
        mps,
        date: utc_now(),
        commit: std::env::var("GPU_IPC_COMMIT").unwrap_or_else(|_| "unknown".to_owned()),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        host: rustix::system::uname().nodename().to_string_lossy().into_owned(),
    })
}

/// Now, as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format_utc(secs)
}

/// Seconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian calendar).
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_utc(1_795_405_199), "2026-11-23T03:39:59Z");
    }
}
