//! Where the scheduler's time goes: its forward passes by kind, the time with no pass running,
//! and a coarse timeline, over a window that starts with the engine or when a reader restarts
//! it ([`crate::engine::EngineHandle::take_pass_stats`]), read through
//! [`crate::engine::EngineHandle::pass_stats`].
//!
//! A pass is one of three kinds, by what its batch holds: decode tokens only, prompt tokens
//! only (prefills and chunks of chunked prefills), or both (the scheduler puts the chunks of
//! a step next to its running requests' decodes). Each pass is recorded once, when its output
//! is processed, at a fixed cost: a few sums, one histogram bucket and one timeline bucket,
//! with no allocation but the timeline's, which grows by one bucket a second at most and
//! stays under [`MAX_BUCKETS`] by doubling its bucket width.
//!
//! The window's wall time splits into three disjoint parts: pass time (the sum of every
//! pass's time, see [`PassStats::busy_secs`]), idle time (the loop blocked waiting for a
//! request, with none waiting or running) and the rest, the gap: the host's work between
//! passes while none runs (planning, sampling on the host, streaming, the radix cache), which
//! the overlap schedule hides behind the next pass.

use std::time::{Duration, Instant};

use serde::Serialize;

/// Histogram buckets per doubling of the pass time: percentiles are within about 2.2 %.
const HIST_PER_OCTAVE: f64 = 16.0;
/// The shortest pass time the histogram tells apart; shorter ones share its first bucket.
const HIST_MIN_SECS: f64 = 1e-6;
/// 30 doublings above 1 µs: up to about 18 minutes.
const HIST_BUCKETS: usize = 30 * HIST_PER_OCTAVE as usize;

/// The timeline's first bucket width; readers merge buckets into wider rows.
const BUCKET: Duration = Duration::from_secs(1);
/// Most timeline buckets kept: past this, pairs of buckets merge and the width doubles (a
/// day-long window ends with 64 s buckets).
const MAX_BUCKETS: usize = 4096;

/// What a pass's batch held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Decode,
    Prefill,
    Mixed,
}

/// One processed pass, as [`PassRecorder::record`] takes it.
pub(super) struct PassRecord {
    /// When the pass was launched (for a synchronous step, when its forward call began).
    pub launched: Instant,
    /// When its output was back on the host: the forward call returned, or the tokens of an
    /// overlapped pass were collected.
    pub completed: Instant,
    /// Launched before the previous pass was processed (the overlap schedule).
    pub overlapped: bool,
    /// Sequences that ran one decode token.
    pub decode_seqs: u64,
    /// Prompt tokens computed, and the sequences they belong to.
    pub prefill_tokens: u64,
    pub prefill_seqs: u64,
    /// Tokens sampled and handed to their requests.
    pub sampled_tokens: u64,
    /// Requests running and waiting when the pass was processed.
    pub running: u64,
    pub queued: u64,
}

impl PassRecord {
    fn kind(&self) -> Kind {
        match (self.decode_seqs > 0, self.prefill_tokens > 0) {
            (true, true) => Kind::Mixed,
            (false, true) => Kind::Prefill,
            _ => Kind::Decode,
        }
    }
}

/// Sums and the time histogram of one kind of pass.
#[derive(Clone)]
struct KindAcc {
    passes: u64,
    overlapped: u64,
    secs: f64,
    min_secs: f64,
    max_secs: f64,
    decode_seqs: u64,
    prefill_tokens: u64,
    prefill_seqs: u64,
    sampled_tokens: u64,
    hist: Box<[u64; HIST_BUCKETS]>,
}

impl Default for KindAcc {
    fn default() -> Self {
        KindAcc {
            passes: 0,
            overlapped: 0,
            secs: 0.0,
            min_secs: f64::INFINITY,
            max_secs: 0.0,
            decode_seqs: 0,
            prefill_tokens: 0,
            prefill_seqs: 0,
            sampled_tokens: 0,
            hist: Box::new([0; HIST_BUCKETS]),
        }
    }
}

fn hist_bucket(secs: f64) -> usize {
    let i = ((secs / HIST_MIN_SECS).log2() * HIST_PER_OCTAVE).floor();
    // NaN and negative values land in the first bucket; the cast saturates.
    (i.max(0.0) as usize).min(HIST_BUCKETS - 1)
}

/// The geometric middle of histogram bucket `i`.
fn hist_value(i: usize) -> f64 {
    HIST_MIN_SECS * ((i as f64 + 0.5) / HIST_PER_OCTAVE).exp2()
}

impl KindAcc {
    fn add(&mut self, p: &PassRecord, secs: f64) {
        self.passes += 1;
        self.overlapped += u64::from(p.overlapped);
        self.secs += secs;
        self.min_secs = self.min_secs.min(secs);
        self.max_secs = self.max_secs.max(secs);
        self.decode_seqs += p.decode_seqs;
        self.prefill_tokens += p.prefill_tokens;
        self.prefill_seqs += p.prefill_seqs;
        self.sampled_tokens += p.sampled_tokens;
        self.hist[hist_bucket(secs)] += 1;
    }

    /// The pass time below which a fraction `q` of the passes took, from the histogram,
    /// clamped to the shortest and longest passes.
    fn quantile(&self, q: f64) -> f64 {
        if self.passes == 0 {
            return 0.0;
        }
        let rank = ((q * self.passes as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.hist.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return hist_value(i).clamp(self.min_secs, self.max_secs);
            }
        }
        self.max_secs
    }

    fn report(&self) -> PassKindStats {
        let mean = if self.passes > 0 {
            self.secs / self.passes as f64
        } else {
            0.0
        };
        PassKindStats {
            passes: self.passes,
            overlapped: self.overlapped,
            secs: self.secs,
            decode_seqs: self.decode_seqs,
            mean_decode_seqs: self.decode_seqs as f64 / self.passes.max(1) as f64,
            prefill_tokens: self.prefill_tokens,
            prefill_seqs: self.prefill_seqs,
            sampled_tokens: self.sampled_tokens,
            mean_ms: mean * 1e3,
            p50_ms: self.quantile(0.5) * 1e3,
            p90_ms: self.quantile(0.9) * 1e3,
            max_ms: self.max_secs * 1e3,
        }
    }
}

/// Sums over the passes completed in one stretch of the window.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    passes: u64,
    /// Passes with at least one decode token.
    decode_passes: u64,
    busy_secs: f64,
    decode_seqs: u64,
    prefill_tokens: u64,
    sampled_tokens: u64,
    running_sum: u64,
    queued_sum: u64,
}

impl Bucket {
    fn merge(&mut self, o: &Bucket) {
        self.passes += o.passes;
        self.decode_passes += o.decode_passes;
        self.busy_secs += o.busy_secs;
        self.decode_seqs += o.decode_seqs;
        self.prefill_tokens += o.prefill_tokens;
        self.sampled_tokens += o.sampled_tokens;
        self.running_sum += o.running_sum;
        self.queued_sum += o.queued_sum;
    }
}

/// The scheduler's running account of its passes (see the module docs).
pub(super) struct PassRecorder {
    since: Instant,
    /// The end of the last pass or idle stretch, or the window's start: a pass's time starts
    /// no earlier.
    mark: Instant,
    idle: Duration,
    kinds: [KindAcc; 3],
    bucket: Duration,
    timeline: Vec<Bucket>,
}

impl PassRecorder {
    pub fn new(now: Instant) -> Self {
        PassRecorder {
            since: now,
            mark: now,
            idle: Duration::ZERO,
            kinds: Default::default(),
            bucket: BUCKET,
            timeline: Vec::new(),
        }
    }

    /// Start a new window at `now`.
    pub fn reset(&mut self, now: Instant) {
        *self = PassRecorder::new(now);
    }

    /// The loop waited for a request from `from` to `to` with no work.
    pub fn idle(&mut self, from: Instant, to: Instant) {
        let from = from.max(self.mark);
        self.idle += to.saturating_duration_since(from);
        self.mark = self.mark.max(to);
    }

    pub fn record(&mut self, p: &PassRecord) {
        let start = p.launched.max(self.mark);
        let secs = p.completed.saturating_duration_since(start).as_secs_f64();
        self.mark = self.mark.max(p.completed);
        let kind = p.kind();
        self.kinds[kind as usize].add(p, secs);
        let b = self.bucket_at(p.completed);
        b.passes += 1;
        b.decode_passes += u64::from(p.decode_seqs > 0);
        b.busy_secs += secs;
        b.decode_seqs += p.decode_seqs;
        b.prefill_tokens += p.prefill_tokens;
        b.sampled_tokens += p.sampled_tokens;
        b.running_sum += p.running;
        b.queued_sum += p.queued;
    }

    /// The timeline bucket of instant `t`, widening the buckets when there are too many.
    fn bucket_at(&mut self, t: Instant) -> &mut Bucket {
        let offset = t.saturating_duration_since(self.since);
        let mut i = (offset.as_nanos() / self.bucket.as_nanos()) as usize;
        while i >= MAX_BUCKETS {
            self.timeline = self
                .timeline
                .chunks(2)
                .map(|pair| {
                    let mut b = pair[0];
                    if let Some(o) = pair.get(1) {
                        b.merge(o);
                    }
                    b
                })
                .collect();
            self.bucket *= 2;
            i /= 2;
        }
        if self.timeline.len() <= i {
            self.timeline.resize(i + 1, Bucket::default());
        }
        &mut self.timeline[i]
    }

    pub fn snapshot(&self, now: Instant) -> PassStats {
        let wall = now.saturating_duration_since(self.since).as_secs_f64();
        let [decode, prefill, mixed] = self.kinds.each_ref().map(KindAcc::report);
        let busy = decode.secs + prefill.secs + mixed.secs;
        let idle = self.idle.as_secs_f64();
        PassStats {
            wall_secs: wall,
            busy_secs: busy,
            idle_secs: idle,
            gap_secs: (wall - busy - idle).max(0.0),
            decode,
            prefill,
            mixed,
            bucket_secs: self.bucket.as_secs_f64(),
            buckets: self.timeline.clone(),
        }
    }
}

/// The forward passes of one kind over a window.
#[derive(Debug, Clone, Serialize)]
pub struct PassKindStats {
    pub passes: u64,
    /// Passes launched under the overlap schedule (before the previous one was processed).
    pub overlapped: u64,
    /// Total pass time (see [`PassStats::busy_secs`]).
    pub secs: f64,
    /// Sequences that ran a decode token, in all and per pass.
    pub decode_seqs: u64,
    pub mean_decode_seqs: f64,
    /// Prompt tokens computed, and prompt pieces (whole prompts or chunks) they came in.
    pub prefill_tokens: u64,
    pub prefill_seqs: u64,
    /// Tokens sampled and handed to requests: one per decode, plus one per prompt that
    /// completed in the pass (fewer when requests left while their pass was in flight).
    pub sampled_tokens: u64,
    /// Pass time: mean, median, 90th percentile (from a histogram: within about 2 %), longest.
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub max_ms: f64,
}

/// Where the scheduler's time went over a window (see the module docs): its forward passes by
/// kind and the time with no pass running, read through
/// [`crate::engine::EngineHandle::pass_stats`].
#[derive(Debug, Clone, Serialize)]
pub struct PassStats {
    /// Length of the window.
    pub wall_secs: f64,
    /// The sum of the passes' times. A pass's time runs from the later of its launch and the
    /// previous pass's completion (or the end of an idle stretch) to its own completion, the
    /// moment its output is back on the host. Synchronous passes: the forward call. Under the
    /// overlap schedule, where the next pass is launched before the previous one completes,
    /// it is the time between successive pass completions, which on a GPU that always has
    /// the next pass queued is the pass's device time. The CPU backend's overlap schedule
    /// (`--enable-overlap-schedule`) runs each pass at its launch, before it collects the
    /// previous one, so there a pass's time holds the next pass's forward: the totals hold,
    /// the split by kind is one pass late.
    pub busy_secs: f64,
    /// Time the loop waited for a request with none waiting or running.
    pub idle_secs: f64,
    /// The rest of the window: host work between passes while none ran.
    pub gap_secs: f64,
    pub decode: PassKindStats,
    pub prefill: PassKindStats,
    pub mixed: PassKindStats,
    #[serde(skip)]
    bucket_secs: f64,
    #[serde(skip)]
    buckets: Vec<Bucket>,
}

/// One row of [`PassStats::timeline`]: the passes completed from `start_secs` into the window,
/// for `secs`. A pass counts in the row where it completed, all of its time too.
#[derive(Debug, Clone, Serialize)]
pub struct TimelineRow {
    pub start_secs: f64,
    pub secs: f64,
    pub passes: u64,
    /// Share of the row's time in passes (at most 1: a pass that began in the row before
    /// counts here whole).
    pub busy: f64,
    /// Requests running and waiting, averaged over the row's passes.
    pub mean_running: f64,
    pub mean_queued: f64,
    /// Decode tokens per pass, over the passes that decoded.
    pub mean_decode_batch: f64,
    pub prefill_tok_s: f64,
    pub output_tok_s: f64,
}

impl PassStats {
    /// Every kind together.
    pub fn passes(&self) -> u64 {
        self.decode.passes + self.prefill.passes + self.mixed.passes
    }

    pub fn decode_seqs(&self) -> u64 {
        self.decode.decode_seqs + self.prefill.decode_seqs + self.mixed.decode_seqs
    }

    pub fn prefill_tokens(&self) -> u64 {
        self.decode.prefill_tokens + self.prefill.prefill_tokens + self.mixed.prefill_tokens
    }

    pub fn sampled_tokens(&self) -> u64 {
        self.decode.sampled_tokens + self.prefill.sampled_tokens + self.mixed.sampled_tokens
    }

    /// The timeline in rows of about `row_secs` (a whole number of the recorded buckets, at
    /// least one: 1 s, doubled for every factor two the window is longer than about an hour),
    /// from the window's start to the last pass.
    pub fn timeline(&self, row_secs: f64) -> Vec<TimelineRow> {
        if self.bucket_secs <= 0.0 {
            return Vec::new();
        }
        let per_row = ((row_secs / self.bucket_secs).round() as usize).max(1);
        let width = per_row as f64 * self.bucket_secs;
        self.buckets
            .chunks(per_row)
            .enumerate()
            .map(|(i, chunk)| {
                let mut b = Bucket::default();
                for c in chunk {
                    b.merge(c);
                }
                let start = i as f64 * width;
                // The last row ends with the window.
                let secs = width.min(self.wall_secs - start).max(1e-9);
                let passes = b.passes.max(1) as f64;
                TimelineRow {
                    start_secs: start,
                    secs,
                    passes: b.passes,
                    busy: (b.busy_secs / secs).min(1.0),
                    mean_running: b.running_sum as f64 / passes,
                    mean_queued: b.queued_sum as f64 / passes,
                    mean_decode_batch: b.decode_seqs as f64 / b.decode_passes.max(1) as f64,
                    prefill_tok_s: b.prefill_tokens as f64 / secs,
                    output_tok_s: b.sampled_tokens as f64 / secs,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(launched: Instant, ms: u64, decode: u64, prefill: u64) -> PassRecord {
        PassRecord {
            launched,
            completed: launched + Duration::from_millis(ms),
            overlapped: false,
            decode_seqs: decode,
            prefill_tokens: prefill,
            prefill_seqs: u64::from(prefill > 0),
            sampled_tokens: decode,
            running: decode,
            queued: 0,
        }
    }

    #[test]
    fn passes_are_sorted_by_kind_and_their_times_do_not_overlap() {
        let t0 = Instant::now();
        let mut r = PassRecorder::new(t0);
        let ms = Duration::from_millis;
        r.record(&pass(t0, 10, 0, 100));
        // Launched before the first completed (overlap): its time starts at that completion.
        r.record(&pass(t0 + ms(5), 25, 4, 0));
        r.record(&pass(t0 + ms(40), 10, 4, 50));
        r.idle(t0 + ms(50), t0 + ms(80));
        let s = r.snapshot(t0 + ms(100));
        assert_eq!(
            (s.prefill.passes, s.decode.passes, s.mixed.passes),
            (1, 1, 1)
        );
        assert!((s.prefill.secs - 0.010).abs() < 1e-9);
        assert!((s.decode.secs - 0.020).abs() < 1e-9);
        assert!((s.mixed.secs - 0.010).abs() < 1e-9);
        assert!((s.idle_secs - 0.030).abs() < 1e-9);
        assert!((s.gap_secs - 0.030).abs() < 1e-9);
        assert_eq!(s.prefill_tokens(), 150);
        assert_eq!(s.decode_seqs(), 8);
        assert!((s.decode.p50_ms - 20.0).abs() < 20.0 * 0.025);
    }

    #[test]
    fn percentiles_come_from_the_histogram_within_its_resolution() {
        let t0 = Instant::now();
        let mut r = PassRecorder::new(t0);
        let mut at = t0;
        for ms in 1..=100 {
            r.record(&pass(at, ms, 1, 0));
            at += Duration::from_millis(ms);
        }
        let s = r.snapshot(at);
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.025;
        assert!(close(s.decode.p50_ms, 50.0), "{}", s.decode.p50_ms);
        assert!(close(s.decode.p90_ms, 90.0), "{}", s.decode.p90_ms);
        assert!(close(s.decode.mean_ms, 50.5));
        assert_eq!(s.decode.max_ms, 100.0);
    }

    #[test]
    fn a_long_window_widens_the_timeline_buckets_and_keeps_the_sums() {
        let t0 = Instant::now();
        let mut r = PassRecorder::new(t0);
        let secs = MAX_BUCKETS as u64 * 3;
        for s in 0..secs {
            r.record(&pass(t0 + Duration::from_secs(s), 1, 2, 0));
        }
        assert!(r.timeline.len() <= MAX_BUCKETS);
        assert_eq!(r.bucket, BUCKET * 4);
        let s = r.snapshot(t0 + Duration::from_secs(secs));
        let rows = s.timeline(60.0);
        assert_eq!(rows.iter().map(|r| r.passes).sum::<u64>(), secs);
        assert!((rows[0].secs - 60.0).abs() < 1e-9);
        assert!((rows[0].mean_decode_batch - 2.0).abs() < 1e-9);
        assert!((rows[0].output_tok_s - 2.0).abs() < 1e-9);
    }
}
