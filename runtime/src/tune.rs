//! Tunes, while decoding, how far ahead the packed K-quant decode kernels prefetch their
//! weights (`quant::kernels::set_decode_prefetch`). The best distance moved with the
//! memory's state on one host: on the 8B model 4 KiB ran 5% faster than 16 KiB while the
//! memory gave about 47 GB/s and 10% slower at 74 GB/s, and that state changed within
//! seconds. So every one-token product dispatch is timed: most run at the current
//! distance, and each period ends with a block of dispatches at a neighbouring candidate,
//! compared with the current distance's recent time per byte for a dispatch of the same
//! size (the same matrices). After a window the neighbour that was faster by more than
//! [`SWITCH_GAIN`] becomes current. Only speed depends on the choice: the kernels return
//! the same bits at any distance.
//!
//! `RLLAMA_DECODE_PREFETCH=<bytes>` fixes the distance and turns the tuning off (for
//! same-binary A/B measurements).

use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// The distances tried (bytes ahead of the super-block being multiplied).
pub const CANDIDATES: [usize; 3] = [4 << 10, 8 << 10, 16 << 10];
/// Dispatches per period: most run at the current distance, the last [`BLOCK`] at a
/// neighbouring candidate (each neighbour in turn, one per period). Trying a distance for
/// one dispatch among others measured it wrongly: on the 8B model 4 KiB looked 3-10%
/// faster dispatch by dispatch amid 8 KiB ones and ran 10% slower on its own (the hardware
/// prefetchers carry what they learned from one dispatch into the next), so a distance is
/// tried for a block of consecutive dispatches, and the first [`WARM`] of the block and
/// the first one after it are not counted.
pub const PERIOD: u32 = 112;
pub const BLOCK: u32 = 16;
pub const WARM: u32 = 4;
/// Dispatches per decision at most: one block per neighbour of the current distance
/// (only the neighbours are tried: a step at a time, half the trying at either end).
pub const WINDOW: u32 = 2 * PERIOD;
/// Least counted dispatches of a candidate before it may become current.
const MIN_SAMPLES: u32 = 8;
/// How much faster (geometric mean over its explorations) a candidate must have been.
pub const SWITCH_GAIN: f64 = 1.02;
/// Weight of a new sample in the current distance's running time per byte.
const EWMA: f64 = 0.25;
/// Dispatch sizes remembered (a model has a handful: QKV, O, gate/up, down).
const MAX_KEYS: usize = 16;

/// The tuning state (pure: the caller times the dispatches and applies the distance).
#[derive(Clone, Debug)]
pub struct PrefetchTuner {
    cur: usize,
    n: u32,
    /// (dispatch bytes, running ns per byte at the current distance).
    base: Vec<(u64, f64)>,
    /// Per candidate: sum of ln(current time / its time) over its explorations, count.
    gain: [(f64, u32); CANDIDATES.len()],
    switches: u32,
}

/// What [`PrefetchTuner::pick`] chose for one dispatch, handed back to
/// [`PrefetchTuner::record`] with its time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trial {
    /// Index into [`CANDIDATES`].
    pub candidate: usize,
    /// Whether its time counts (not the first of a block, nor the first after one).
    counted: bool,
}

impl Default for PrefetchTuner {
    fn default() -> Self {
        PrefetchTuner::new()
    }
}

impl PrefetchTuner {
    /// Starts at `quant`'s default distance.
    pub fn new() -> PrefetchTuner {
        let cur = CANDIDATES
            .iter()
            .position(|&c| c == quant::kernels::DECODE_PREFETCH_DEFAULT)
            .unwrap_or(0);
        PrefetchTuner {
            cur,
            n: 0,
            base: Vec::new(),
            gain: [(0.0, 0); CANDIDATES.len()],
            switches: 0,
        }
    }

    /// The current distance (bytes).
    pub fn current(&self) -> usize {
        CANDIDATES[self.cur]
    }

    /// How often the current distance changed.
    pub fn switches(&self) -> u32 {
        self.switches
    }

    /// The candidate the next dispatch runs at; closes a window first when one is
    /// complete.
    pub fn pick(&mut self) -> Trial {
        if self.n >= PERIOD * self.neighbours().count() as u32 {
            self.decide();
        }
        let (period, at) = (self.n / PERIOD, self.n % PERIOD);
        self.n += 1;
        let explore = PERIOD - BLOCK;
        if at < explore {
            return Trial {
                candidate: self.cur,
                counted: at > 0,
            };
        }
        Trial {
            candidate: self.neighbours().nth(period as usize).unwrap_or(self.cur),
            counted: at >= explore + WARM,
        }
    }

    /// The candidates next to the current one.
    fn neighbours(&self) -> impl Iterator<Item = usize> {
        let cur = self.cur;
        [cur.wrapping_sub(1), cur + 1]
            .into_iter()
            .filter(|&c| c < CANDIDATES.len())
    }

    /// A dispatch of `bytes` weight bytes ran as `trial` picked it, in `ns` nanoseconds.
    pub fn record(&mut self, trial: Trial, bytes: u64, ns: u64) {
        let used = trial.candidate;
        if !trial.counted || bytes == 0 || ns == 0 || used >= CANDIDATES.len() {
            return;
        }
        let per = ns as f64 / bytes as f64;
        let slot = self.base.iter().position(|&(k, _)| k == bytes);
        if used == self.cur {
            match slot {
                Some(i) => self.base[i].1 += EWMA * (per - self.base[i].1),
                None if self.base.len() < MAX_KEYS => self.base.push((bytes, per)),
                None => {}
            }
        } else if let Some(i) = slot {
            let g = &mut self.gain[used];
            g.0 += (self.base[i].1 / per).ln();
            g.1 += 1;
        }
    }

    fn decide(&mut self) {
        let best = self
            .neighbours()
            .filter(|&c| self.gain[c].1 >= MIN_SAMPLES)
            .map(|c| (c, self.gain[c].0 / self.gain[c].1 as f64))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((c, mean)) = best {
            if mean > SWITCH_GAIN.ln() {
                self.cur = c;
                self.switches += 1;
                // The running times were the old distance's.
                self.base.clear();
            }
        }
        self.gain = [(0.0, 0); CANDIDATES.len()];
        self.n = 0;
    }
}

fn fixed() -> Option<usize> {
    static FIXED: OnceLock<Option<usize>> = OnceLock::new();
    *FIXED.get_or_init(|| {
        let v = crate::options::Env::get().decode_prefetch.clone()?;
        match v.trim().parse::<usize>() {
            Ok(b) => Some(b),
            Err(_) => {
                eprintln!(
                    "rllama: RLLAMA_DECODE_PREFETCH={v:?} is not a byte count; tuning instead"
                );
                None
            }
        }
    })
}

static TUNER: Mutex<Option<PrefetchTuner>> = Mutex::new(None);

/// Runs `dispatch` (a product over `bytes` bytes of packed K-quant weights for one or two
/// tokens) at the distance the tuner picks, and tells it how long it took.
pub fn decode_dispatch(bytes: u64, dispatch: impl FnOnce()) {
    if let Some(b) = fixed() {
        quant::kernels::set_decode_prefetch(b);
        dispatch();
        return;
    }
    let trial = {
        let mut t = TUNER.lock().unwrap_or_else(|e| e.into_inner());
        let trial = t.get_or_insert_with(PrefetchTuner::new).pick();
        quant::kernels::set_decode_prefetch(CANDIDATES[trial.candidate]);
        trial
    };
    let t0 = Instant::now();
    dispatch();
    let ns = t0.elapsed().as_nanos() as u64;
    let mut t = TUNER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(t) = t.as_mut() {
        t.record(trial, bytes, ns);
    }
}

/// The distance decode prefetches at now and how often tuning changed it (for reports).
pub fn decode_prefetch_state() -> (usize, u32) {
    let t = TUNER.lock().unwrap_or_else(|e| e.into_inner());
    match (fixed(), t.as_ref()) {
        (Some(b), _) => (b, 0),
        (None, Some(t)) => (t.current(), t.switches()),
        (None, None) => (quant::kernels::decode_prefetch(), 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `tuner` dispatches of four sizes (a layer's products) for `n` rounds, each
    /// taking `speed(candidate)` ns per byte times a small size-dependent factor.
    fn feed(tuner: &mut PrefetchTuner, n: usize, speed: impl Fn(usize) -> f64) {
        let sizes = [14_000_000u64, 9_400_000, 66_000_000, 33_000_000];
        for i in 0..n {
            let bytes = sizes[i % 4];
            let trial = tuner.pick();
            let per = speed(trial.candidate) * (1.0 + (i % 4) as f64 * 0.03);
            tuner.record(trial, bytes, (per * bytes as f64) as u64);
        }
    }

    #[test]
    fn moves_to_a_faster_distance_and_stays_there() {
        let mut t = PrefetchTuner::new();
        assert_eq!(t.current(), quant::kernels::DECODE_PREFETCH_DEFAULT);
        // 4 KiB is 8% faster than the others.
        feed(
            &mut t,
            3 * WINDOW as usize,
            |c| if c == 0 { 1.0 } else { 1.08 },
        );
        assert_eq!(t.current(), CANDIDATES[0]);
        let s = t.switches();
        feed(&mut t, 10 * WINDOW as usize, |c| {
            if c == 0 {
                1.0
            } else {
                1.08
            }
        });
        assert_eq!((t.current(), t.switches()), (CANDIDATES[0], s));
        // The memory's state changes: now the farther the faster; two steps to 16 KiB.
        feed(&mut t, 6 * WINDOW as usize, |c| [1.1, 1.05, 1.0][c]);
        assert_eq!(t.current(), CANDIDATES[2]);
    }

    #[test]
    fn keeps_its_distance_when_the_others_are_no_faster() {
        let mut t = PrefetchTuner::new();
        // Within 1% of each other, the current distance slightly ahead.
        feed(&mut t, 20 * WINDOW as usize, |c| {
            1.0 + 0.005 * (c != 1) as u8 as f64
        });
        assert_eq!((t.current(), t.switches()), (CANDIDATES[1], 0));
    }

    #[test]
    fn tries_each_neighbour_for_a_block_per_period() {
        let mut t = PrefetchTuner::new();
        let cur = CANDIDATES.iter().position(|&c| c == t.current()).unwrap();
        assert_eq!(cur, 1, "starts in the middle");
        let picks: Vec<usize> = (0..WINDOW).map(|_| t.pick().candidate).collect();
        for (p, period) in picks.chunks(PERIOD as usize).enumerate() {
            let (main, block) = period.split_at((PERIOD - BLOCK) as usize);
            assert!(main.iter().all(|&c| c == cur));
            assert!(
                block.iter().all(|&c| c == [0, 2][p]),
                "period {p}: {block:?}"
            );
        }
        // At an end, only the one neighbour is tried, every period.
        feed(
            &mut t,
            3 * WINDOW as usize,
            |c| if c == 0 { 1.0 } else { 1.08 },
        );
        assert_eq!(t.current(), CANDIDATES[0]);
        let mut seen = [0; CANDIDATES.len()];
        for _ in 0..4 * PERIOD {
            seen[t.pick().candidate] += 1;
        }
        assert_eq!(seen, [4 * (PERIOD - BLOCK) as usize, 4 * BLOCK as usize, 0]);
    }
}
