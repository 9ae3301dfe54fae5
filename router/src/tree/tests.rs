use std::sync::Arc;
use std::thread;

use proptest::prelude::*;

use super::PrefixTree;

const ALL: &[&str] = &["w1", "w2", "w3"];

fn names(m: &super::PrefixMatch) -> Vec<String> {
    let mut v: Vec<String> = m.tenants.iter().map(|t| t.to_string()).collect();
    v.sort();
    v
}

#[test]
fn empty_tree_matches_nothing() {
    let tree = PrefixTree::new();
    let m = tree.match_prefix("hello", ALL);
    assert_eq!(m.matched_chars, 0);
    assert_eq!(m.total_chars, 5);
    assert!(m.tenants.is_empty());
    assert_eq!(m.rate(), 0.0);
}

#[test]
fn full_and_partial_matches_count_characters() {
    let tree = PrefixTree::new();
    tree.insert("hello world", "w1");
    let m = tree.match_prefix("hello world", ALL);
    assert_eq!((m.matched_chars, m.total_chars), (11, 11));
    assert_eq!(names(&m), ["w1"]);

    let m = tree.match_prefix("hello there", ALL);
    assert_eq!(m.matched_chars, 6, "\"hello \" is shared");
    assert_eq!(names(&m), ["w1"]);

    let m = tree.match_prefix("hello world, and more", ALL);
    assert_eq!(m.matched_chars, 11);
    assert!((m.rate() - 11.0 / 21.0).abs() < 1e-9);
    tree.check_invariants().unwrap();
}

#[test]
fn split_keeps_per_tenant_totals() {
    let tree = PrefixTree::new();
    tree.insert("abcdef", "w1");
    assert_eq!(tree.tenant_chars("w1"), 6);
    tree.insert("abcxyz", "w2");
    // w1 still holds "abc" + "def"; w2 holds "abc" + "xyz".
    assert_eq!(tree.tenant_chars("w1"), 6);
    assert_eq!(tree.tenant_chars("w2"), 6);
    tree.insert("abcxyz", "w1");
    assert_eq!(tree.tenant_chars("w1"), 9);
    assert_eq!(tree.node_count(), 4, "root, abc, def, xyz");

    let m = tree.match_prefix("abcdefg", ALL);
    assert_eq!((m.matched_chars, names(&m)), (6, vec!["w1".to_string()]));
    let m = tree.match_prefix("abcxyz", ALL);
    assert_eq!(names(&m), ["w1", "w2"]);
    let m = tree.match_prefix("abq", ALL);
    assert_eq!(m.matched_chars, 2);
    assert_eq!(names(&m), ["w1", "w2"]);
    tree.check_invariants().unwrap();
}

#[test]
fn multibyte_text_splits_on_character_boundaries() {
    let tree = PrefixTree::new();
    // 'é' (c3 a9) and 'ê' (c3 aa) share their first byte.
    tree.insert("caf\u{e9} au lait", "w1");
    tree.insert("caf\u{ea}", "w2");
    let m = tree.match_prefix("caf\u{ea}!", ALL);
    assert_eq!(m.matched_chars, 4);
    assert_eq!(names(&m), ["w2"]);
    let m = tree.match_prefix("caf\u{e9}", ALL);
    assert_eq!(m.matched_chars, 4);
    assert_eq!(names(&m), ["w1"]);
    let m = tree.match_prefix("cafe", ALL);
    assert_eq!(m.matched_chars, 3);
    assert_eq!(names(&m), ["w1", "w2"]);
    tree.insert("日本語のテキスト", "w3");
    let m = tree.match_prefix("日本語の文章", ALL);
    assert_eq!(m.matched_chars, 4);
    tree.check_invariants().unwrap();
}

#[test]
fn match_only_walks_through_candidates() {
    let tree = PrefixTree::new();
    tree.insert("shared system prompt: be brief. question one", "w1");
    tree.insert("shared system prompt", "w2");
    let m = tree.match_prefix("shared system prompt: be brief. question two", &["w2"]);
    assert_eq!(m.matched_chars, 20);
    assert_eq!(names(&m), ["w2"]);
    let m = tree.match_prefix(
        "shared system prompt: be brief. question two",
        &["w1", "w2"],
    );
    assert_eq!(
        m.matched_chars,
        "shared system prompt: be brief. question ".len()
    );
    assert_eq!(names(&m), ["w1"]);
    let m = tree.match_prefix("shared system prompt", &["w9"]);
    assert_eq!(m.matched_chars, 0);
    assert!(m.tenants.is_empty());
}

#[test]
fn eviction_removes_least_recently_used_leaves_first() {
    let tree = PrefixTree::new();
    tree.insert("aaaa1111", "w1"); // oldest
    tree.insert("bbbb2222", "w1");
    tree.insert("cccc3333", "w1");
    tree.insert("aaaa1111", "w1"); // refreshed: now newest
    assert_eq!(tree.tenant_chars("w1"), 24);
    let evicted = tree.evict(16);
    assert_eq!(evicted, 8);
    assert_eq!(tree.tenant_chars("w1"), 16);
    assert_eq!(
        tree.match_prefix("bbbb2222", ALL).matched_chars,
        0,
        "oldest is gone"
    );
    assert_eq!(tree.match_prefix("aaaa1111", ALL).matched_chars, 8);
    assert_eq!(tree.match_prefix("cccc3333", ALL).matched_chars, 8);
    tree.check_invariants().unwrap();
}

#[test]
fn eviction_is_per_tenant_and_walks_up_from_leaves() {
    let tree = PrefixTree::new();
    tree.insert("prefix-A-suffix-1", "w1");
    tree.insert("prefix-A-suffix-2", "w1");
    tree.insert("prefix-A", "w2");
    // w1 holds "prefix-A" + "-suffix-" + "1" + "2" = 18; w2 holds "prefix-A" = 8.
    assert_eq!(tree.tenant_chars("w1"), 18);
    assert_eq!(tree.tenant_chars("w2"), 8);
    assert_eq!(
        tree.evict(10),
        10,
        "w1 loses both leaves, then the edge above them"
    );
    assert_eq!(tree.tenant_chars("w1"), 8);
    assert_eq!(tree.tenant_chars("w2"), 8, "w2 is under the limit");
    let m = tree.match_prefix("prefix-A-suffix-1", ALL);
    assert_eq!(m.matched_chars, 8);
    assert_eq!(names(&m), ["w1", "w2"]);
    assert_eq!(tree.node_count(), 2, "root and \"prefix-A\"");
    tree.check_invariants().unwrap();
}

#[test]
fn remove_tenant_drops_its_entries_and_orphaned_nodes() {
    let tree = PrefixTree::new();
    tree.insert("common prefix, then w1", "w1");
    tree.insert("common prefix, then w2", "w2");
    tree.insert("only w1 here", "w1");
    tree.remove_tenant("w1");
    assert_eq!(tree.tenant_chars("w1"), 0);
    assert_eq!(tree.match_prefix("only w1 here", ALL).matched_chars, 0);
    let m = tree.match_prefix("common prefix, then w1", ALL);
    assert_eq!(m.matched_chars, 21);
    assert_eq!(names(&m), ["w2"]);
    assert_eq!(tree.node_count(), 3, "root, the shared edge and w2's leaf");
    tree.check_invariants().unwrap();
    assert!(tree.tenant_sizes().iter().all(|(t, _)| &**t != "w1"));
    // The tenant can come back.
    tree.insert("only w1 here", "w1");
    assert_eq!(tree.tenant_chars("w1"), 12);
    tree.check_invariants().unwrap();
}

#[test]
fn concurrent_insert_match_evict_keeps_the_tree_consistent() {
    let tree = Arc::new(PrefixTree::new());
    let mut handles = Vec::new();
    for t in 0..4 {
        let tree = tree.clone();
        handles.push(thread::spawn(move || {
            let me = format!("w{t}");
            for i in 0..2_000 {
                let text = format!("group {} shared prefix / request {} from {me}", i % 17, i);
                tree.insert(&text, &me);
                let m = tree.match_prefix(&text, &[me.as_str()]);
                // Eviction by another thread may trim this worker between the two calls,
                // but never below the match of text it just held.
                assert!(m.matched_chars <= m.total_chars);
            }
        }));
    }
    for _ in 0..2 {
        let tree = tree.clone();
        handles.push(thread::spawn(move || {
            for _ in 0..200 {
                tree.evict(2_000);
                let _ = tree.match_prefix("group 3 shared prefix / request", &["w0", "w1"]);
            }
        }));
    }
    {
        let tree = tree.clone();
        handles.push(thread::spawn(move || {
            for i in 0..300 {
                tree.insert(&format!("short-lived {i}"), "w9");
                if i % 50 == 0 {
                    tree.remove_tenant("w9");
                }
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    tree.check_invariants().unwrap();
    tree.evict(2_000);
    tree.check_invariants().unwrap();
    for (tenant, chars) in tree.tenant_sizes() {
        assert!(
            chars <= 2_000,
            "{tenant} holds {chars} characters after eviction"
        );
    }
}

/// Characters in the longest common prefix of `a` and `b`.
#[test]
fn forgetting_a_refused_insert_drops_only_what_it_added() {
    let tree = PrefixTree::new();
    tree.insert("shared system prompt: question one", "w1");
    let before = tree.tenant_chars("w1");
    // A huge refused prompt on the same worker: its text goes, the earlier entry stays.
    let huge = format!("shared system prompt: {}", "x".repeat(100_000));
    let receipt = tree.insert(&huge, "w1");
    assert!(tree.tenant_chars("w1") > 100_000);
    assert_eq!(tree.forget(&huge, "w1", receipt), 100_000);
    assert_eq!(tree.tenant_chars("w1"), before);
    assert_eq!(
        tree.match_prefix("shared system prompt: question one", &["w1"])
            .matched_chars,
        34
    );
    tree.check_invariants().unwrap();

    // A refused repeat of a text the worker holds takes nothing away.
    let receipt = tree.insert("shared system prompt: question one", "w1");
    assert_eq!(
        tree.forget("shared system prompt: question one", "w1", receipt),
        0
    );
    assert_eq!(tree.tenant_chars("w1"), before);

    // A later insert through the same nodes keeps them.
    let receipt = tree.insert("another prompt entirely", "w2");
    tree.insert("another prompt entirely, accepted", "w2");
    assert_eq!(tree.forget("another prompt entirely", "w2", receipt), 0);
    assert_eq!(tree.tenant_chars("w2"), 33);
    tree.check_invariants().unwrap();
    // Unknown tenants and texts are no-ops.
    assert_eq!(tree.forget("nothing", "w9", receipt), 0);
}

fn lcp_chars(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

proptest! {
    #[test]
    fn match_equals_best_common_prefix_over_inserted_texts(
        inserts in prop::collection::vec(("[ab\u{e9}c]{0,12}", 0usize..3), 1..40),
        queries in prop::collection::vec("[ab\u{e9}c]{0,14}", 1..10),
        candidate_mask in 1usize..8,
    ) {
        let tree = PrefixTree::new();
        for (text, w) in &inserts {
            tree.insert(text, ALL[*w]);
        }
        tree.check_invariants().map_err(TestCaseError::fail)?;
        let candidates: Vec<&str> =
            (0..3).filter(|i| candidate_mask & (1 << i) != 0).map(|i| ALL[i]).collect();
        for q in &queries {
            let expected = inserts
                .iter()
                .filter(|(_, w)| candidates.contains(&ALL[*w]))
                .map(|(text, _)| lcp_chars(text, q))
                .max()
                .unwrap_or(0);
            let m = tree.match_prefix(q, &candidates);
            prop_assert_eq!(m.matched_chars, expected);
            for t in &m.tenants {
                let holder_matches = inserts
                    .iter()
                    .any(|(text, w)| ALL[*w] == &**t && lcp_chars(text, q) >= expected);
                prop_assert!(holder_matches, "{} reported without holding the match", t);
            }
        }
    }

    #[test]
    fn refused_inserts_leave_the_tree_as_if_never_made(
        inserts in prop::collection::vec(("[ab]{1,8}", 0usize..3, any::<bool>()), 1..40),
        queries in prop::collection::vec("[ab]{0,9}", 1..10),
    ) {
        let with_refusals = PrefixTree::new();
        let accepted_only = PrefixTree::new();
        for (text, w, refused) in &inserts {
            let receipt = with_refusals.insert(text, ALL[*w]);
            if *refused {
                with_refusals.forget(text, ALL[*w], receipt);
            } else {
                accepted_only.insert(text, ALL[*w]);
            }
            with_refusals.check_invariants().map_err(TestCaseError::fail)?;
        }
        let sizes = |t: &PrefixTree| {
            t.tenant_sizes().into_iter().filter(|(_, n)| *n > 0).collect::<Vec<_>>()
        };
        prop_assert_eq!(sizes(&with_refusals), sizes(&accepted_only));
        for q in &queries {
            for w in ALL {
                let a = with_refusals.match_prefix(q, &[*w]);
                let b = accepted_only.match_prefix(q, &[*w]);
                prop_assert_eq!(a.matched_chars, b.matched_chars, "{} {}", q, w);
            }
        }
    }

    #[test]
    fn eviction_bounds_every_tenant(
        inserts in prop::collection::vec(("[abc]{1,10}", 0usize..3), 1..60),
        limit in 0usize..20,
    ) {
        let tree = PrefixTree::new();
        for (text, w) in &inserts {
            tree.insert(text, ALL[*w]);
        }
        tree.evict(limit);
        tree.check_invariants().map_err(TestCaseError::fail)?;
        for (t, chars) in tree.tenant_sizes() {
            prop_assert!(chars <= limit, "{} holds {} > {}", t, chars, limit);
        }
    }
}
