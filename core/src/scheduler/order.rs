//! Orders of the waiting queue: the `dfs-weight` walk, and the age bound every reordering
//! policy works under.
//!
//! `dfs-weight`: the cached prefixes of the waiting requests form a tree (the part of the
//! radix tree they reach). Each node weighs as many waiting requests as end at it or below it.
//! The walk goes depth first, into the heavier child first, and puts the requests ending at a
//! node after those below it (as SGLang does): requests sharing a cached prefix run one after
//! another, the largest such group first, and requests with nothing cached come last.
//!
//! The age bound: under every policy but `fcfs`, a request that has waited a quarter of
//! `--queue-timeout-secs` (15 s when there is no timeout) goes ahead of the policy's order,
//! such requests oldest first ([`aged_first`]). Without it `lpm` and `dfs-weight` keep serving
//! a steady stream of requests that share a cached prefix ahead of an older request that
//! shares none, which then never starts (and `lof`, `random` can do the same). Admission
//! accepts a request while its estimated wait in arrival order is under ¾ of the timeout;
//! once it has waited the other ¼ it is behind only older requests, i.e. in arrival order,
//! so the reordering adds at most that ¼ and its wait stays within the timeout. Fresh
//! requests keep the policy's order, which is where its benefit lies.

use std::cmp::Reverse;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// The age bound without a queue timeout: a quarter of the default one (60 s).
const AGE_WITHOUT_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a request waits in the policy's order before it goes ahead of it: a quarter of
/// the queue timeout, or [`AGE_WITHOUT_TIMEOUT`] without one.
pub(super) fn age_limit(queue_timeout: Option<Duration>) -> Duration {
    queue_timeout.map_or(AGE_WITHOUT_TIMEOUT, |t| t / 4)
}

/// Move the entries of `queue` that arrived `limit` or longer before `now` to its front,
/// oldest first; the others keep their order behind them.
pub(super) fn aged_first<T>(
    queue: &mut VecDeque<T>,
    arrival: impl Fn(&T) -> Instant,
    now: Instant,
    limit: Duration,
) {
    let is_aged = |r: &T| now.saturating_duration_since(arrival(r)) >= limit;
    if !queue.iter().any(is_aged) {
        return;
    }
    let (mut aged, fresh): (Vec<T>, Vec<T>) = queue.drain(..).partition(|r| is_aged(r));
    aged.sort_by_key(|r| arrival(r));
    queue.extend(aged);
    queue.extend(fresh);
}

/// Indices of `prefixes` (the requests' cached prefixes, in arrival order) in `dfs-weight`
/// order. Children of equal weight keep the order of their earliest request.
pub(super) fn dfs_weight_order(prefixes: &[&[u32]]) -> Vec<usize> {
    let mut out = Vec::with_capacity(prefixes.len());
    walk(prefixes, (0..prefixes.len()).collect(), 0, &mut out);
    out
}

/// Emit the requests of one tree node: `group` (in arrival order) holds every request whose
/// prefix runs through the node, i.e. shares its first `depth` tokens. Chains of nodes with a
/// single child and no request ending are skipped in one go, so the recursion is at most as
/// deep as the number of requests, however long the prefixes.
fn walk(prefixes: &[&[u32]], group: Vec<usize>, depth: usize, out: &mut Vec<usize>) {
    let mut here = Vec::new();
    let mut children: Vec<Vec<usize>> = Vec::new();
    let mut by_token: HashMap<u32, usize> = HashMap::new();
    for i in group {
        match prefixes[i].get(depth) {
            None => here.push(i),
            Some(&t) => {
                let k = *by_token.entry(t).or_insert_with(|| {
                    children.push(Vec::new());
                    children.len() - 1
                });
                children[k].push(i);
            }
        }
    }
    // Stable: equal weights stay in order of first appearance.
    children.sort_by_key(|c| Reverse(c.len()));
    for child in children {
        let first = prefixes[child[0]];
        // The child's node ends where its prefixes first part or one of them ends.
        let end = child
            .iter()
            .map(|&i| {
                depth
                    + first[depth..]
                        .iter()
                        .zip(&prefixes[i][depth..])
                        .take_while(|(a, b)| a == b)
                        .count()
            })
            .min()
            .unwrap_or(depth + 1);
        walk(prefixes, child, end, out);
    }
    out.extend(here);
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::{Duration, Instant};

    use super::{age_limit, aged_first, dfs_weight_order};

    fn order(prefixes: &[Vec<u32>]) -> Vec<usize> {
        let refs: Vec<&[u32]> = prefixes.iter().map(|p| p.as_slice()).collect();
        dfs_weight_order(&refs)
    }

    #[test]
    fn heavier_subtrees_first_and_node_requests_after_their_children() {
        // Tree: root ─ [1,2,3] ─┬ [4,5] (requests 1, 4, 6)
        //                       └ [9]   (request 3)
        //              [7,7]          (requests 2, 5)
        //        nothing cached        (request 0)
        // [1,2,3] weighs 5 (four below it, request 7 ending at it), [7,7] weighs 2.
        let prefixes = vec![
            vec![],
            vec![1, 2, 3, 4, 5],
            vec![7, 7],
            vec![1, 2, 3, 9],
            vec![1, 2, 3, 4, 5, 6],
            vec![7, 7],
            vec![1, 2, 3, 4, 5],
            vec![1, 2, 3],
        ];
        // Under [1,2,3,4,5]: request 4 (one token deeper) before 1 and 6 that end there.
        assert_eq!(order(&prefixes), vec![4, 1, 6, 3, 7, 2, 5, 0]);
    }

    #[test]
    fn equal_weights_keep_arrival_order_and_nothing_cached_keeps_it_too() {
        assert_eq!(
            order(&[vec![5, 1], vec![6], vec![5, 2], vec![6]]),
            vec![0, 2, 1, 3]
        );
        assert_eq!(order(&[vec![], vec![], vec![]]), vec![0, 1, 2]);
        assert!(order(&[]).is_empty());
    }

    #[test]
    fn long_prefixes_do_not_deepen_the_walk() {
        let long: Vec<u32> = (0..200_000).collect();
        let mut other = long.clone();
        other.push(1);
        assert_eq!(order(&[long.clone(), other, long]), vec![1, 0, 2]);
    }

    #[test]
    fn requests_past_the_age_limit_go_first_oldest_first_and_the_rest_keep_their_order() {
        let now = Instant::now();
        let ago = |ms: u64| {
            now.checked_sub(Duration::from_millis(ms))
                .expect("a clock past 3 s")
        };
        // (name, arrival), in the policy's order.
        let mut q: VecDeque<(&str, Instant)> = [
            ("fresh1", ago(100)),
            ("old", ago(1500)),
            ("fresh2", ago(900)),
            ("older", ago(3000)),
            ("at_limit", ago(1000)),
        ]
        .into_iter()
        .collect();
        aged_first(&mut q, |e| e.1, now, Duration::from_secs(1));
        let names: Vec<&str> = q.iter().map(|e| e.0).collect();
        assert_eq!(names, ["older", "old", "at_limit", "fresh1", "fresh2"]);

        let mut fresh: VecDeque<(&str, Instant)> =
            [("b", ago(20)), ("a", ago(50))].into_iter().collect();
        aged_first(&mut fresh, |e| e.1, now, Duration::from_secs(1));
        assert_eq!(fresh.iter().map(|e| e.0).collect::<Vec<_>>(), ["b", "a"]);
    }

    #[test]
    fn the_age_limit_is_a_quarter_of_the_queue_timeout_or_15_s() {
        assert_eq!(
            age_limit(Some(Duration::from_secs(4))),
            Duration::from_secs(1)
        );
        assert_eq!(
            age_limit(Some(Duration::from_secs(60))),
            Duration::from_secs(15)
        );
        assert_eq!(age_limit(None), Duration::from_secs(15));
    }
}
