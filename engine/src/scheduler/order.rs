//! The `dfs-weight` order of the waiting queue.
//!
//! The cached prefixes of the waiting requests form a tree (the part of the radix tree they
//! reach). Each node weighs as many waiting requests as end at it or below it. The walk goes
//! depth first, into the heavier child first, and puts the requests ending at a node after
//! those below it (as SGLang does): requests sharing a cached prefix run one after another,
//! the largest such group first, and requests with nothing cached come last.

use std::cmp::Reverse;
use std::collections::HashMap;

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
    use super::dfs_weight_order;

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
}
