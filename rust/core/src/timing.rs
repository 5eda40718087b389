//! Per-function latency when asked (`fastpjit.timing`): the host time of a cache hit, split by
//! stage, kept as the latest samples of each stage, from which `stats()` reads percentiles.

/// The stages of a cache hit, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Reading the call and finding its cache entry: the signature and the lookup.
    Lookup,
    /// Turning the arguments into executable inputs.
    Inputs,
    /// `execute_sharded`: handing the executable its inputs.
    Execute,
    /// Building the outputs from the results.
    Outputs,
}

impl Stage {
    pub const ALL: [Stage; 4] = [Stage::Lookup, Stage::Inputs, Stage::Execute, Stage::Outputs];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Lookup => "lookup",
            Stage::Inputs => "inputs",
            Stage::Execute => "execute",
            Stage::Outputs => "outputs",
        }
    }
}

/// How many calls' samples are kept: percentiles describe the latest calls.
pub const SAMPLES: usize = 4096;

/// The stage times of the latest `SAMPLES` timed calls, in nanoseconds, and how many calls
/// were timed in all.
#[derive(Default, Debug)]
pub struct Latencies {
    calls: u64,
    /// One row per call: the four stages.
    rows: Vec<[u64; 4]>,
    next: usize,
}

/// The 50th and 99th percentile of some samples, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Percentiles {
    pub p50: u64,
    pub p99: u64,
}

impl Latencies {
    pub const fn new() -> Self {
        Self {
            calls: 0,
            rows: Vec::new(),
            next: 0,
        }
    }

    /// Records one call's stage times.
    pub fn record(&mut self, stages: [u64; 4]) {
        self.calls += 1;
        if self.rows.len() < SAMPLES {
            self.rows.push(stages);
        } else {
            self.rows[self.next] = stages;
        }
        self.next = (self.next + 1) % SAMPLES;
    }

    /// How many calls were timed (not only those whose samples are kept).
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// The percentiles of each stage, then of the whole call; None before any call.
    pub fn percentiles(&self) -> Option<([Percentiles; 4], Percentiles)> {
        if self.rows.is_empty() {
            return None;
        }
        let stage = |i: usize| percentiles(self.rows.iter().map(|row| row[i]).collect());
        let total = percentiles(self.rows.iter().map(|row| row.iter().sum()).collect());
        Some(([stage(0), stage(1), stage(2), stage(3)], total))
    }

    pub fn clear(&mut self) {
        *self = Self::new();
    }
}

/// The nearest-rank percentiles of `values` (not empty).
fn percentiles(mut values: Vec<u64>) -> Percentiles {
    values.sort_unstable();
    let rank = |p: usize| values[(values.len() * p).div_ceil(100).max(1) - 1];
    Percentiles {
        p50: rank(50),
        p99: rank(99),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank_per_stage_and_in_all() {
        let mut latencies = Latencies::default();
        assert_eq!(latencies.percentiles(), None);
        for i in 1..=100u64 {
            latencies.record([i, 2 * i, 0, 1]);
        }
        let (stages, total) = latencies.percentiles().unwrap();
        assert_eq!(stages[0], Percentiles { p50: 50, p99: 99 });
        assert_eq!(stages[1], Percentiles { p50: 100, p99: 198 });
        assert_eq!(stages[2], Percentiles { p50: 0, p99: 0 });
        assert_eq!(total, Percentiles { p50: 151, p99: 298 });
        assert_eq!(latencies.calls(), 100);
    }

    #[test]
    fn only_the_latest_calls_are_kept() {
        let mut latencies = Latencies::default();
        for _ in 0..SAMPLES {
            latencies.record([1_000, 0, 0, 0]);
        }
        for _ in 0..SAMPLES {
            latencies.record([7, 0, 0, 0]);
        }
        let (stages, _) = latencies.percentiles().unwrap();
        assert_eq!(stages[0], Percentiles { p50: 7, p99: 7 });
        assert_eq!(latencies.calls(), 2 * SAMPLES as u64);
        latencies.clear();
        assert_eq!((latencies.calls(), latencies.percentiles()), (0, None));
    }
}
