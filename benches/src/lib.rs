//! Shared helpers for the expiremap benchmarks (criterion targets live in
//! `benches/`). Not published.

/// SplitMix64: a tiny, fast, seeded generator so every library sees the same
/// inputs in the same run.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    #[inline]
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// The SplitMix64 finalizer: a bijection on `u64`, so `mix64(i)` for
/// distinct `i` gives distinct, well-spread keys without storing them.
#[inline]
pub fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The machine a bench ran on, for its first line: `(cores, CPU model)`,
/// from `available_parallelism` and `/proc/cpuinfo`'s first "model name"
/// ("unknown CPU" where there is none).
pub fn machine() -> (usize, String) {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("model name"))?;
            Some(line.split(':').nth(1)?.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    (cores, cpu)
}

/// Appends `row` to the file `name` in the folder `$BENCH_CSV_DIR`, when
/// that variable is set (writing `header` first into a new file): what
/// `src/bin/charts.rs` draws from. `benches/charts.sh run` sets it.
pub fn csv_row(name: &str, header: &str, row: &str) {
    use std::io::Write;
    let Some(dir) = std::env::var_os("BENCH_CSV_DIR") else {
        return;
    };
    let path = std::path::Path::new(&dir).join(name);
    let new = !path.exists();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if new {
        writeln!(f, "{header}").expect("write");
    }
    writeln!(f, "{row}").expect("write");
}
