//! The model checks' random steps: a xorshift generator, seeded, so a failing seed replays the same steps.

/// A generator of numbers below a bound, from `seed` (not zero): `random(n)` is in `0..n`.
pub(crate) fn below(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed;
    move |bound: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    }
}
