//! SplitMix64 (Steele, Lea and Flood): a fast, well-mixed 64-bit function of a 64-bit input.
//!
//! Used where herald needs numbers that look random but need not be secret: an engine's epochs
//! (unpredictable between runs given a random seed) and the bench's seeded draws. One function
//! is less than a dependency on `rand`.

/// The mixed value of `x`: what the generator outputs when its state is `x` (it adds
/// [`GOLDEN`], then mixes; the next state is `x + GOLDEN`).
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(GOLDEN);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The generator's step: 2⁶⁴ divided by the golden ratio.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_sequence_from_seed_0() {
        // The reference implementation's first outputs for a state starting at 0
        // (Vigna's splitmix64.c): state += GOLDEN, then mix.
        let mut state = 0u64;
        let mut next = || {
            let out = splitmix64(state);
            state = state.wrapping_add(GOLDEN);
            out
        };
        assert_eq!(next(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(next(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(next(), 0x06C4_5D18_8009_454F);
    }
}
