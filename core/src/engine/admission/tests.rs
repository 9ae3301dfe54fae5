//! [`Admission`] on a simulated clock: an engine of `slots` running slots that serves each
//! request in a (jittered) service time, fed by Poisson arrivals far above its rate, whose
//! speed falls by 4x in the middle of the run (other processes taking its CPU). Requests
//! start in arrival order when a slot frees; a waiting request is refused at its deadline if
//! it has not started by then. Everything is driven by seeded random numbers and instants
//! computed from one anchor, so each run is the same.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::*;

/// xorshift64*: uniform numbers for the arrivals and the service times.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with mean 1 / rate.
    fn exponential(&mut self, rate: f64) -> f64 {
        -(1.0 - self.uniform()).ln() / rate
    }
}

struct Scenario {
    /// `--max-running-requests`.
    slots: usize,
    /// Seconds one request runs at full speed (uniformly 0.5x to 1.5x of it).
    service: f64,
    /// How many times slower than full speed the engine is at a time.
    slowdown: fn(f64) -> f64,
    /// Poisson arrivals per second, until `arrive_until` seconds.
    arrivals: f64,
    arrive_until: f64,
    deadline: f64,
    max_requests: usize,
}

const DEADLINE: f64 = 60.0;
/// Full speed: 32 slots, 3.2 s per request, 10 starts/s; arrivals at 5x that. The count bound
/// (512, as for the CPU model's 128 slots) is above the 450 requests that ¾ of the deadline
/// holds at full speed, so the estimate is what refuses.
const FIVE_X: Scenario = Scenario {
    slots: 32,
    service: 3.2,
    slowdown: |_| 1.0,
    arrivals: 50.0,
    arrive_until: 300.0,
    deadline: DEADLINE,
    max_requests: 512,
};
/// When the engine slows down in [`sudden_fall`].
const FALL_AT: f64 = 120.0;

/// 4x slower from [`FALL_AT`] on.
fn sudden_fall(t: f64) -> f64 {
    if t < FALL_AT { 1.0 } else { 4.0 }
}

/// Slows down over a minute from [`FALL_AT`] to 4x, stays there, and recovers at 240 s.
fn slow_fall_and_recovery(t: f64) -> f64 {
    if !(FALL_AT..240.0).contains(&t) {
        1.0
    } else {
        (1.0 + 3.0 * (t - FALL_AT) / 60.0).min(4.0)
    }
}

/// What happened to the requests of one run.
#[derive(Default)]
struct Outcome {
    sent: usize,
    /// Refused on arrival (429 or 503).
    refused_at_once: usize,
    admitted: usize,
    /// Started before their deadline.
    served: usize,
    /// Admitted, then waited out the deadline: (admitted at, s).
    late: Vec<f64>,
    /// Admitted, then refused while waiting: (admitted at, waited s).
    shed: Vec<(f64, f64)>,
    /// Slots that freed while arrivals came and nothing admitted was waiting (after the
    /// first 10 s): the engine idling because too much was refused.
    idle_slots: usize,
}

impl Outcome {
    /// Admitted at or after `t` and not served: late or shed.
    fn lost_admitted_after(&self, t: f64) -> usize {
        self.late.iter().filter(|&&a| a >= t).count()
            + self.shed.iter().filter(|(a, _)| *a >= t).count()
    }

    /// The counts, for assertion messages.
    fn summary(&self) -> String {
        format!(
            "{} sent, {} refused at once, {} admitted: {} served, {} late, {} refused while \
             waiting; {} slots idle",
            self.sent,
            self.refused_at_once,
            self.admitted,
            self.served,
            self.late.len(),
            self.shed.len(),
            self.idle_slots
        )
    }
}

/// A waiting request of the simulation.
struct Waiter {
    seq: u64,
    since: f64,
    shed: Arc<Shed>,
}

/// Runs `s` to the end (arrivals stop, the queue drains); the outcome and the admission time
/// of every admitted request.
fn simulate(s: &Scenario, seed: u64) -> (Outcome, Vec<f64>) {
    let anchor = Instant::now();
    let at = |t: f64| anchor + Duration::from_secs_f64(t);
    let metrics = Arc::new(Metrics::new("sim").unwrap());
    let adm = Admission::with_bounds(
        s.max_requests,
        usize::MAX,
        Some(Duration::from_secs_f64(s.deadline)),
        s.slots,
        metrics,
        at(0.0),
    );
    let mut rng = Rng(seed);
    let mut out = Outcome::default();
    let mut admitted_at = Vec::new();
    let mut queue: VecDeque<Waiter> = VecDeque::new();
    // Completion times of the running requests, in ns.
    let mut running: BinaryHeap<Reverse<u64>> = BinaryHeap::new();
    let mut next_arrival = rng.exponential(s.arrivals);

    // Drops the requests the admission refused while they waited.
    let sweep = |queue: &mut VecDeque<Waiter>, t: f64, out: &mut Outcome| {
        queue.retain(|w| {
            let shed = w.shed.refusal.get().is_some();
            if shed {
                out.shed.push((w.since, t - w.since));
            }
            !shed
        });
    };

    loop {
        let done = running.peek().map(|r| r.0 as f64 * 1e-9);
        let expiry = queue.front().map(|w| w.since + s.deadline);
        let arrival = (next_arrival < s.arrive_until).then_some(next_arrival);
        let Some(t) = [done, expiry, arrival]
            .into_iter()
            .flatten()
            .reduce(f64::min)
        else {
            break;
        };
        if Some(t) == done {
            running.pop();
            if queue.is_empty() && t > 10.0 && t < s.arrive_until {
                out.idle_slots += 1;
            }
        } else if Some(t) == expiry {
            let w = queue.pop_front().unwrap();
            let full = running.len() >= s.slots || !queue.is_empty();
            adm.leave(at(t), w.seq, false, full);
            out.late.push(w.since);
            sweep(&mut queue, t, &mut out);
        } else {
            out.sent += 1;
            let full = running.len() >= s.slots || !queue.is_empty();
            match adm.enter(at(t), 64, full) {
                Ok(ticket) => {
                    out.admitted += 1;
                    admitted_at.push(t);
                    queue.push_back(Waiter {
                        seq: ticket.seq,
                        since: t,
                        shed: ticket.shed,
                    });
                }
                Err(_) => out.refused_at_once += 1,
            }
            sweep(&mut queue, t, &mut out);
            next_arrival = t + rng.exponential(s.arrivals);
        }
        // Free slots take the oldest waiting requests.
        while running.len() < s.slots
            && let Some(w) = queue.pop_front()
        {
            let service = s.service * (s.slowdown)(t) * (0.5 + rng.uniform());
            running.push(Reverse(((t + service) * 1e9) as u64));
            let full = running.len() >= s.slots || !queue.is_empty();
            adm.leave(at(t), w.seq, true, full);
            out.served += 1;
            sweep(&mut queue, t, &mut out);
        }
    }
    (out, admitted_at)
}

fn report(name: &str, out: &Outcome) {
    let mut waited: Vec<f64> = out.shed.iter().map(|s| s.1).collect();
    waited.sort_by(f64::total_cmp);
    let pct = |p: usize| {
        waited
            .get(waited.len() * p / 100)
            .copied()
            .unwrap_or(f64::NAN)
    };
    println!(
        "{name}: {} sent, {} refused at once, {} admitted: {} served, {} waited out the \
         deadline, {} refused while waiting (after p50 {:.1} s, max {:.1} s); {} slots idle",
        out.sent,
        out.refused_at_once,
        out.admitted,
        out.served,
        out.late.len(),
        out.shed.len(),
        pct(50),
        waited.last().copied().unwrap_or(f64::NAN),
        out.idle_slots,
    );
}

/// The engine falls to a quarter of its speed at 120 s under 5x its full-speed load.
///
/// Before the fall the queue holds ¾ of the deadline at full speed: 45 s of waiting, which
/// the slowed engine needs 180 s to start. What was admitted before the fall cannot all be
/// served, whatever the admission does; the bounds: at most 2% of the admitted requests wait
/// out the deadline (the rate is an estimate), the ones that cannot start in time get their
/// 503 as soon as the rate shows it, nothing is refused while waiting before the fall, what
/// is admitted from 10 s after the fall on is served (at most 2% lost), and the engine never
/// idles. With the 20 s average alone and no refusal of waiting requests (the admission
/// before this test), 297 of 2,063 admitted (14%, seed 1) waited out the deadline; now 11
/// (at most 1.0% over seeds 1 to 6), and 290 get their 503 while waiting, half of them
/// within 40 s of their admission.
#[test]
fn a_sudden_fall_in_speed_refuses_early_what_it_cannot_serve() {
    let s = Scenario {
        slowdown: sudden_fall,
        ..FIVE_X
    };
    for seed in [1, 2, 3, 4, 5, 6] {
        let (out, admitted_at) = simulate(&s, seed);
        report(&format!("sudden 4x fall, seed {seed}"), &out);
        check_slowdown(&out, &admitted_at, FALL_AT + 10.0);
    }
}

/// The engine slows down over a minute to a quarter of its speed, then recovers at 240 s:
/// the same bounds as for [`a_sudden_fall_in_speed_refuses_early_what_it_cannot_serve`],
/// the lost ones counted from 10 s after the slowing down ends (while it goes on, the rate
/// measured lags behind the speed that a request admitted then will meet). Before this
/// admission, 195 of 2,805 admitted (7%, seed 1) waited out the deadline; now 11.
#[test]
fn a_gradual_fall_in_speed_refuses_early_what_it_cannot_serve() {
    let s = Scenario {
        slowdown: slow_fall_and_recovery,
        ..FIVE_X
    };
    for seed in [1, 2, 3, 4, 5, 6] {
        let (out, admitted_at) = simulate(&s, seed);
        report(&format!("gradual 4x fall, seed {seed}"), &out);
        check_slowdown(&out, &admitted_at, FALL_AT + 70.0);
    }
}

fn check_slowdown(out: &Outcome, admitted_at: &[f64], settled: f64) {
    assert_eq!(out.sent, out.refused_at_once + out.admitted);
    assert_eq!(out.admitted, out.served + out.late.len() + out.shed.len());
    // Nothing admitted is refused while the speed holds: the waiting-time estimate's noise
    // does not reach the deadline.
    let shed_before = out.shed.iter().filter(|(a, w)| a + w < FALL_AT).count();
    assert_eq!(
        shed_before,
        0,
        "refused while waiting before the fall: {}",
        out.summary()
    );
    // Hardly any admitted request waits out the deadline.
    assert!(
        out.late.len() * 50 <= out.admitted,
        "{} of {} admitted waited out the deadline",
        out.late.len(),
        out.admitted
    );
    // Once the fall is measured, what is admitted is served.
    let lost = out.lost_admitted_after(settled);
    let after = admitted_at.iter().filter(|&&a| a >= settled).count();
    assert!(
        lost * 50 <= after,
        "{lost} of {after} admitted from {settled} s on were not served"
    );
    // The refusals keep the engine busy: a slot that frees finds a request waiting.
    assert_eq!(
        out.idle_slots,
        0,
        "slots idle under 5x load: {}",
        out.summary()
    );
}

/// Steady 5x load at full speed: the estimate holds the queue near ¾ of the deadline, nothing
/// admitted is refused while waiting or waits out the deadline, the engine never idles.
#[test]
fn steady_overload_serves_everything_it_admits() {
    let (out, _) = simulate(&FIVE_X, 7);
    report("steady 5x", &out);
    assert!(
        out.late.is_empty() && out.shed.is_empty(),
        "{}",
        out.summary()
    );
    assert_eq!(out.idle_slots, 0, "{}", out.summary());
    // Served: 10/s for 300 s plus the queue it drains, within the jitter.
    assert!(out.served > 3000, "{}", out.summary());
}

/// A long stretch of slow starts (long requests), then an idle engine: a burst as large as
/// the batch is admitted whole, however slow the measured rate, and none of it is refused
/// while waiting.
#[test]
fn a_burst_into_an_idle_engine_is_admitted_after_slow_starts() {
    let anchor = Instant::now();
    let at = |t: f64| anchor + Duration::from_secs_f64(t);
    let slots = 8;
    let metrics = Arc::new(Metrics::new("sim").unwrap());
    let adm = Admission::with_bounds(
        512,
        usize::MAX,
        Some(Duration::from_secs(60)),
        slots,
        metrics,
        at(0.0),
    );
    // A full engine that starts one request every 20 s (its batch holds long requests), with
    // 2 more waiting behind each.
    let mut t = 0.0;
    for _ in 0..8 {
        let a = adm.enter(at(t), 16, true).unwrap();
        let b = adm.enter(at(t), 16, true).unwrap();
        t += 20.0;
        adm.leave(at(t), a.seq, true, true);
        adm.leave(at(t), b.seq, false, true);
    }
    let rate = adm.queue.lock().rate.per_sec().unwrap();
    assert!(rate < 0.1, "measured {rate}/s");
    // Idle for a minute, then a burst of `slots` at once into the free batch.
    t += 60.0;
    let burst: Vec<_> = (0..slots)
        .map(|_| adm.enter(at(t), 16, false))
        .collect::<Result<_>>()
        .unwrap_or_else(|e| panic!("refused: {e}"));
    // They start one by one as the scheduler takes them, the batch filling up.
    for (i, ticket) in burst.iter().enumerate() {
        assert!(ticket.shed.refusal.get().is_none(), "request {i} refused");
        adm.leave(at(t + 0.1), ticket.seq, true, i + 1 == slots);
    }
}
