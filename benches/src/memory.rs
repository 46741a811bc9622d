//! Host-side arithmetic of the memory benches (`benches/gpu_memory.rs`): the dependent-load chain the chase kernel
//! follows, and the conversion of kernel launches into criterion iterations.

use std::time::Duration;

/// Bytes per chain element: one u64 per 128-byte line, so every load touches a new line.
pub const LINE: u64 = 128;

/// Words (u64) per line.
const WORDS_PER_LINE: u64 = LINE / 8;

/// The chain `gpu_ipc_mem_chase` follows over `lines` lines (at least 2): word `16 * i` holds `16 * next(i)`,
/// indices in u64 words, with `next(i) = (i + step) mod lines` and `step` the odd number nearest `0.618 * lines`
/// that is coprime with `lines`. One cycle through every line, and consecutive loads land far apart (no stride a
/// cache line or page prefetch would follow). Deterministic, so every memory kind chases the same chain.
pub fn stride_chain(lines: u64) -> Vec<u64> {
    let lines = lines.max(2);
    let step = chain_step(lines);
    let mut chain = vec![0u64; (lines * WORDS_PER_LINE) as usize];
    for i in 0..lines {
        chain[(i * WORDS_PER_LINE) as usize] = ((i + step) % lines) * WORDS_PER_LINE;
    }
    chain
}

/// The step of [`stride_chain`]: near the golden section of `lines`, coprime with it.
fn chain_step(lines: u64) -> u64 {
    let mut step = ((lines as f64 * 0.618_033_988_75) as u64).clamp(1, lines - 1) | 1;
    while gcd(step, lines) != 1 {
        step += 2;
        if step >= lines {
            step = 1;
        }
    }
    step
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Kernel launches of `per_launch` operations each needed to cover `iters` criterion iterations of one operation.
pub fn launches_for(iters: u64, per_launch: u64) -> u64 {
    iters.div_ceil(per_launch.max(1)).max(1)
}

/// The time criterion is told `iters` operations took, when `done` operations (a whole number of launches, at
/// least `iters`) took `elapsed`: the same time per operation.
pub fn scale_to_iters(elapsed: Duration, done: u64, iters: u64) -> Duration {
    if done == 0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(elapsed.as_secs_f64() * iters as f64 / done as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(chain: &[u64], lines: u64) -> (Vec<bool>, u64) {
        let mut seen = vec![false; lines as usize];
        let mut j = 0u64;
        for _ in 0..lines {
            let line = (j / WORDS_PER_LINE) as usize;
            assert!(!seen[line], "line {line} visited twice");
            seen[line] = true;
            j = chain[j as usize];
        }
        (seen, j)
    }

    #[test]
    fn the_chain_is_one_cycle_through_every_line() {
        for lines in [2u64, 3, 10, 1000, 32_768, 100_003] {
            let chain = stride_chain(lines);
            assert_eq!(chain.len() as u64, lines * WORDS_PER_LINE);
            let (seen, end) = walk(&chain, lines);
            assert!(seen.iter().all(|&s| s), "{lines} lines");
            assert_eq!(end, 0, "{lines} lines: back at the start after every line");
        }
    }

    #[test]
    fn consecutive_loads_land_far_apart() {
        let lines = 32_768u64;
        let chain = stride_chain(lines);
        let step = chain[0] / WORDS_PER_LINE;
        assert!(step > lines / 2 && step < lines * 2 / 3, "step {step}");
        assert_eq!(step % 2, 1);
    }

    #[test]
    fn launches_cover_the_iterations_and_time_scales_back() {
        assert_eq!(launches_for(1, 16_384), 1);
        assert_eq!(launches_for(16_384, 16_384), 1);
        assert_eq!(launches_for(16_385, 16_384), 2);
        assert_eq!(launches_for(0, 16_384), 1);
        // Two launches of 16,384 loads in 32.768 ms: 1 us per load, so 20,000 loads "took" 20 ms.
        let t = scale_to_iters(Duration::from_micros(32_768), 32_768, 20_000);
        assert_eq!(t, Duration::from_millis(20));
        assert_eq!(scale_to_iters(Duration::from_secs(1), 0, 5), Duration::ZERO);
    }
}
