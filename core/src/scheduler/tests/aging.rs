//! The age bound of the reordering policies (see `order.rs`): a request that the policy keeps
//! putting behind newer ones starts once it has waited a quarter of the queue timeout.

use super::*;

/// The test's clock advances this much per scheduler step.
const STEP: Duration = Duration::from_millis(50);

/// A stream of requests sharing a cached prefix (and asking for more tokens than the lone
/// one, for `lof`) keeps two of them waiting at every step, while one older request without
/// that prefix waits too; two run at a time. Returns when, on the test's clock, the lone
/// request started (`None`: still waiting at `give_up`). Every request's tokens are checked.
fn lone_request_start(
    policy: SchedulePolicy,
    queue_timeout: Option<Duration>,
    give_up: Duration,
) -> Option<Duration> {
    let mut h = Setup {
        policy,
        max_running_requests: 2,
        queue_timeout,
        ..Setup::default()
    }
    .build();
    let shared = prompt(40, 1);
    let mut warm = h.submit(shared.clone(), greedy(1));
    h.run_to_idle();
    assert_eq!(warm.output(), reference(&shared, 1, h.vocab));

    let lone_prompt = prompt(20, 2);
    let mut lone = h.submit(lone_prompt.clone(), greedy(3));
    let mut stream: Vec<(Client, Vec<u32>)> = Vec::new();
    let mut salt = 3;
    let mut waited = Duration::ZERO;
    let mut started = None;
    while waited <= give_up {
        while h.waiting_ids().iter().filter(|&&id| id != lone.id).count() < 2 {
            let mut p = shared.clone();
            p.extend(prompt(5, salt));
            salt += 1;
            stream.push((h.submit(p.clone(), greedy(6)), p));
        }
        h.step();
        if !h.waiting_ids().contains(&lone.id) {
            started = Some(waited);
            break;
        }
        h.let_time_pass(STEP);
        waited += STEP;
    }
    h.run_to_idle();
    assert_eq!(lone.output(), reference(&lone_prompt, 3, h.vocab));
    for (c, p) in &mut stream {
        assert_eq!(c.output(), reference(p, 6, h.vocab));
        assert!(
            c.usage().cached_tokens >= 40,
            "{policy:?}: the prefix was reused"
        );
    }
    h.assert_everything_released();
    started
}

/// Under `policy` with a 4 s queue timeout, the lone request starts within it: after the
/// policy's order held for the first quarter (it was fresh), before the timeout.
fn starts_within_the_queue_timeout(policy: SchedulePolicy) {
    let timeout = Duration::from_secs(4);
    let t = lone_request_start(policy, Some(timeout), 2 * timeout).unwrap_or_else(|| {
        panic!(
            "{policy:?}: the lone request still waited after {:?}",
            2 * timeout
        )
    });
    assert!(
        t >= timeout / 4 && t < timeout,
        "{policy:?}: started after {t:?}"
    );
}

#[test]
fn lpm_starts_a_request_without_the_cached_prefix_within_the_queue_timeout() {
    starts_within_the_queue_timeout(SchedulePolicy::Lpm);
}

#[test]
fn dfs_weight_starts_a_request_without_the_cached_prefix_within_the_queue_timeout() {
    starts_within_the_queue_timeout(SchedulePolicy::DfsWeight);
}

#[test]
fn lof_starts_a_request_with_fewer_new_tokens_within_the_queue_timeout() {
    starts_within_the_queue_timeout(SchedulePolicy::Lof);
}

#[test]
fn without_a_queue_timeout_the_age_bound_is_15_s() {
    let t = lone_request_start(SchedulePolicy::Lpm, None, Duration::from_secs(30))
        .expect("the lone request started");
    assert!(
        t >= Duration::from_secs(15) && t < Duration::from_secs(16),
        "started after {t:?}"
    );
}

#[test]
fn fcfs_starts_the_lone_request_in_arrival_order() {
    let t = lone_request_start(SchedulePolicy::Fcfs, None, Duration::from_secs(1))
        .expect("the lone request started");
    assert!(t < Duration::from_secs(1), "started after {t:?}");
}
