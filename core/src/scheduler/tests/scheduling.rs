use std::collections::HashSet;
use std::sync::atomic::Ordering;

use super::*;

#[test]
fn admission_stops_where_the_kv_pool_runs_out() {
    let mut h = Setup {
        capacity: 40,
        ..Setup::default()
    }
    .build();
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(10, i)).collect();
    let mut clients: Vec<Client> = prompts
        .iter()
        .map(|p| h.submit(p.clone(), greedy(10)))
        .collect();
    h.step();
    // 10 prompt tokens plus one slot for the next decode each: three fit in 40, the fourth
    // would have only 6 slots left and waits.
    assert_eq!(h.running_ids(), vec![1, 2, 3]);
    assert_eq!(h.waiting_ids(), vec![4]);
    h.run_to_idle();
    for (c, p) in clients.iter_mut().zip(&prompts) {
        assert_eq!(c.output(), reference(p, 10, h.vocab));
    }
    h.assert_everything_released();
}

#[test]
fn requests_that_can_never_fit_fail_with_a_reason() {
    let mut h = Setup {
        capacity: 40,
        context_length: 30,
        ..Setup::default()
    }
    .build();
    let mut long = h.submit(prompt(30, 0), greedy(1));
    let mut empty = h.submit(Vec::new(), greedy(1));
    let mut ok = h.submit(prompt(29, 1), greedy(1));
    long.poll();
    empty.poll();
    assert!(long.error.as_deref().unwrap().contains("context length"));
    assert!(empty.error.as_deref().unwrap().contains("empty"));
    let mut h2 = Setup {
        capacity: 40,
        ..Setup::default()
    }
    .build();
    let mut big = h2.submit(prompt(40, 0), greedy(1));
    big.poll();
    assert!(
        big.error
            .as_deref()
            .unwrap()
            .contains("KV cache holds only 40")
    );
    assert_eq!(h.waiting_ids(), vec![ok.id]);
    h.run_to_idle();
    assert_eq!(ok.output(), reference(&prompt(29, 1), 1, h.vocab));
}

#[test]
fn chunked_prefill_splits_the_prompt_and_keeps_the_tokens() {
    let p = prompt(50, 7);
    let mut outputs = Vec::new();
    for chunk in [Some(16), None] {
        let mut h = Setup {
            chunked_prefill_size: chunk,
            ..Setup::default()
        }
        .build();
        let mut c = h.submit(p.clone(), greedy(5));
        h.run_to_idle();
        let passes: Vec<(usize, usize, usize)> = h
            .passes()
            .iter()
            .map(|pass| {
                assert_eq!(pass.len(), 1);
                (pass[0].start_pos, pass[0].tokens, pass[0].num_logits)
            })
            .collect();
        let want: Vec<(usize, usize, usize)> = match chunk {
            // Only the last chunk asks for logits.
            Some(_) => vec![(0, 16, 0), (16, 16, 0), (32, 16, 0), (48, 2, 1)],
            None => vec![(0, 50, 1)],
        };
        let decodes = (50..54).map(|pos| (pos, 1, 1));
        assert_eq!(passes, want.into_iter().chain(decodes).collect::<Vec<_>>());
        outputs.push(c.output());
        assert_eq!(c.usage().prompt_tokens, 50);
        h.assert_everything_released();
    }
    assert_eq!(outputs[0], reference(&p, 5, 50));
    assert_eq!(outputs[0], outputs[1]);
}

/// Steps `h` to idle; returns whether a running request was ever sent back to the queue.
fn run_watching_retractions(h: &mut Harness) -> bool {
    let mut ran = HashSet::new();
    let mut retracted = false;
    while !h.idle() {
        assert!(h.steps < 10_000, "no progress");
        h.step();
        retracted |= h.waiting_ids().iter().any(|id| ran.contains(id));
        ran.extend(h.running_ids());
    }
    retracted
}

#[test]
fn a_full_pool_retracts_the_newest_request_which_resumes_with_the_same_tokens() {
    for mode in [Mode::Plain, Mode::Overlap] {
        let mut h = Setup {
            capacity: 30,
            mode,
            ..Setup::default()
        }
        .build();
        let prompts = [prompt(8, 1), prompt(8, 2)];
        let mut clients: Vec<Client> = prompts
            .iter()
            .map(|p| h.submit(p.clone(), greedy(15)))
            .collect();
        h.step();
        assert_eq!(h.running_ids(), vec![1, 2], "{mode:?}");
        // 2 × (8 + 15) tokens do not fit in 30 slots.
        assert!(
            run_watching_retractions(&mut h),
            "{mode:?}: nothing was retracted"
        );
        for (c, p) in clients.iter_mut().zip(&prompts) {
            assert_eq!(c.output(), reference(p, 15, h.vocab), "{mode:?}");
        }
        h.assert_everything_released();
    }
}

#[test]
fn admission_keeps_room_for_the_running_requests_output() {
    // Six prompts of 10 tokens, 20 new tokens each, in 100 slots: taking every prompt that
    // fits (conservativeness 0) retracts requests as they grow (above). The estimate keeps
    // room for their output instead: at the start ratio 0.7 each asks 10 + 14 slots, so four
    // start; with conservativeness 1.5 the ratio is 1 (each asks 10 + 20), three start and
    // nothing is ever retracted.
    for mode in [Mode::Plain, Mode::Overlap] {
        for (conservativeness, first, may_retract) in [(1.0, 4, true), (1.5, 3, false)] {
            let mut h = Setup {
                capacity: 100,
                mode,
                schedule_conservativeness: conservativeness,
                ..Setup::default()
            }
            .build();
            let prompts: Vec<_> = (0..6u32).map(|i| prompt(10, i + 1)).collect();
            let mut clients: Vec<Client> = prompts
                .iter()
                .map(|p| h.submit(p.clone(), greedy(20)))
                .collect();
            h.step();
            let case = format!("{mode:?}, conservativeness {conservativeness}");
            assert_eq!(h.running_ids().len(), first, "{case}");
            let retracted = run_watching_retractions(&mut h);
            assert!(may_retract || !retracted, "{case}: a request was retracted");
            for (c, p) in clients.iter_mut().zip(&prompts) {
                assert_eq!(c.output(), reference(p, 20, h.vocab), "{case}");
            }
            h.assert_everything_released();
        }
    }
}

#[test]
fn lpm_admits_the_longest_cached_prefix_first_and_fcfs_the_oldest() {
    for policy in [SchedulePolicy::Lpm, SchedulePolicy::Fcfs] {
        let mut h = Setup {
            policy,
            max_running_requests: 1,
            ..Setup::default()
        }
        .build();
        let a = prompt(40, 1);
        let mut first = h.submit(a.clone(), greedy(1));
        h.run_to_idle();
        first.output();
        let b = prompt(20, 2);
        let mut c_prompt = a[..30].to_vec();
        c_prompt.extend(prompt(10, 3));
        let mut b_client = h.submit(b.clone(), greedy(3));
        let mut c_client = h.submit(c_prompt.clone(), greedy(3));
        h.step();
        let expect = match policy {
            SchedulePolicy::Lpm => c_client.id,
            _ => b_client.id,
        };
        assert_eq!(h.running_ids(), vec![expect], "{policy:?}");
        h.run_to_idle();
        assert_eq!(b_client.output(), reference(&b, 3, h.vocab));
        assert_eq!(c_client.output(), reference(&c_prompt, 3, h.vocab));
        assert_eq!(c_client.usage().cached_tokens, 30);
        h.assert_everything_released();
    }
}

#[test]
fn schedule_policy_flag_values_are_sglangs() {
    use clap::ValueEnum;
    let names: Vec<String> = SchedulePolicy::value_variants()
        .iter()
        .filter_map(|v| v.to_possible_value())
        .map(|v| v.get_name().to_owned())
        .collect();
    assert_eq!(names, ["lpm", "fcfs", "random", "lof", "dfs-weight"]);
    assert_eq!(
        SchedulePolicy::from_str("dfs-weight", false),
        Ok(SchedulePolicy::DfsWeight)
    );
}

/// Submits `params` (one short distinct prompt each) to a fresh scheduler under `policy` and
/// runs one step, in which every request is admitted in the order the policy gave the queue
/// (each asks for 2 tokens or more, so none finishes in that step). Returns that order and checks that each request then runs to its reference output.
fn admission_order(policy: SchedulePolicy, random_seed: u64, params: &[usize]) -> Vec<u64> {
    let mut h = Setup {
        policy,
        random_seed,
        ..Setup::default()
    }
    .build();
    let prompts: Vec<Vec<u32>> = (0..params.len() as u32).map(|i| prompt(5, i)).collect();
    let mut clients: Vec<Client> = prompts
        .iter()
        .zip(params)
        .map(|(p, &n)| h.submit(p.clone(), greedy(n)))
        .collect();
    assert!(params.iter().all(|&n| n >= 2));
    h.step();
    assert!(h.waiting_ids().is_empty(), "{policy:?}: not all admitted");
    let order = h.running_ids();
    h.run_to_idle();
    for ((c, p), &n) in clients.iter_mut().zip(&prompts).zip(params) {
        assert_eq!(c.output(), reference(p, n, h.vocab), "{policy:?}");
    }
    h.assert_everything_released();
    order
}

#[test]
fn random_admits_a_permutation_that_follows_the_seed() {
    let params = [2; 8];
    let arrival: Vec<u64> = (1..=8).collect();
    let first = admission_order(SchedulePolicy::Random, 1, &params);
    let mut sorted = first.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, arrival, "not a permutation: {first:?}");
    assert_ne!(first, arrival, "arrival order");
    assert_eq!(
        admission_order(SchedulePolicy::Random, 1, &params),
        first,
        "the same seed gave another order"
    );
    assert_ne!(
        admission_order(SchedulePolicy::Random, 2, &params),
        first,
        "another seed gave the same order"
    );
    assert_eq!(admission_order(SchedulePolicy::Fcfs, 1, &params), arrival);
}

#[test]
fn lof_admits_the_longest_output_first_ties_in_arrival_order() {
    let params = [3, 9, 5, 9, 2];
    assert_eq!(
        admission_order(SchedulePolicy::Lof, 1, &params),
        vec![2, 4, 3, 1, 5]
    );
    assert_eq!(
        admission_order(SchedulePolicy::Fcfs, 1, &params),
        vec![1, 2, 3, 4, 5]
    );
}

#[test]
fn dfs_weight_runs_the_largest_shared_prefix_group_first_and_keeps_groups_together() {
    for policy in [
        SchedulePolicy::DfsWeight,
        SchedulePolicy::Lpm,
        SchedulePolicy::Fcfs,
    ] {
        let mut h = Setup {
            policy,
            ..Setup::default()
        }
        .build();
        // Two cached prompts, A and B.
        let a = prompt(40, 1);
        let b = prompt(40, 2);
        let mut warm: Vec<Client> = [&a, &b]
            .iter()
            .map(|p| h.submit(p.to_vec(), greedy(1)))
            .collect();
        h.run_to_idle();
        for c in &mut warm {
            c.output();
        }
        let with = |base: &[u32], keep: usize, salt: u32| {
            let mut p = base[..keep].to_vec();
            p.extend(prompt(5, salt));
            p
        };
        // Arrival order: a1, b1, x (nothing cached), b2, b3 (a shorter part of B), a2.
        let prompts = [
            with(&a, 30, 10),
            with(&b, 30, 11),
            prompt(20, 3),
            with(&b, 30, 12),
            with(&b, 20, 13),
            with(&a, 30, 14),
        ];
        let cached = [30, 30, 0, 30, 20, 30];
        let mut clients: Vec<Client> = prompts
            .iter()
            .map(|p| h.submit(p.clone(), greedy(2)))
            .collect();
        let [a1, b1, x, b2, b3, a2] = [0, 1, 2, 3, 4, 5].map(|i| clients[i].id);
        h.step();
        assert!(h.waiting_ids().is_empty(), "{policy:?}: not all admitted");
        let expect = match policy {
            // B's three first (the two that share 30 of its tokens, then the one that shares
            // 20), then A's two, then the request with nothing cached.
            SchedulePolicy::DfsWeight => vec![b1, b2, b3, a1, a2, x],
            SchedulePolicy::Lpm => vec![a1, b1, b2, a2, b3, x],
            _ => vec![a1, b1, x, b2, b3, a2],
        };
        assert_eq!(h.running_ids(), expect, "{policy:?}");
        h.run_to_idle();
        for ((c, p), &n) in clients.iter_mut().zip(&prompts).zip(&cached) {
            assert_eq!(c.output(), reference(p, 2, h.vocab), "{policy:?}");
            assert_eq!(c.usage().cached_tokens, n, "{policy:?}");
        }
        h.assert_everything_released();
    }
}

#[test]
fn a_request_sharing_a_prompt_being_prefilled_waits_and_reuses_it() {
    let mut h = Setup {
        policy: SchedulePolicy::Lpm,
        chunked_prefill_size: Some(64),
        capacity: 400,
        ..Setup::default()
    }
    .build();
    let p1 = prompt(100, 4);
    let mut p2 = p1.clone();
    p2.extend(prompt(8, 5));
    let mut c1 = h.submit(p1.clone(), greedy(3));
    let mut c2 = h.submit(p2.clone(), greedy(3));
    h.step();
    assert_eq!(
        h.running_ids(),
        vec![c1.id],
        "the first chunk takes the budget"
    );
    h.step();
    // The first request finishes its prompt this step; 28 tokens of budget are left, but the
    // second would compute 36 of the same tokens again: it waits.
    assert_eq!(h.running_ids(), vec![c1.id]);
    assert_eq!(h.waiting_ids(), vec![c2.id]);
    h.run_to_idle();
    assert_eq!(c1.output(), reference(&p1, 3, h.vocab));
    assert_eq!(c2.output(), reference(&p2, 3, h.vocab));
    assert_eq!(c2.usage().cached_tokens, 100);
    h.assert_everything_released();
}

/// Requests of several shapes: short and chunked prompts, one token and many, a shared
/// prefix, a stop token.
fn mixed_workload(h: &mut Harness) -> Vec<(Client, Vec<u32>)> {
    let mut reqs = vec![
        (prompt(5, 1), greedy(1)),
        (prompt(12, 2), greedy(9)),
        (prompt(40, 3), greedy(20)),
        (prompt(3, 4), greedy(2)),
    ];
    let mut shared = prompt(40, 3);
    shared.extend(prompt(4, 6));
    reqs.push((shared, greedy(6)));
    let stop_prompt = prompt(9, 5);
    let stop_at = reference(&stop_prompt, 20, h.vocab)[4];
    reqs.push((
        stop_prompt,
        SamplingParams {
            stop_token_ids: vec![stop_at],
            ..greedy(20)
        },
    ));
    reqs.into_iter()
        .map(|(p, s)| (h.submit(p.clone(), s), p))
        .collect()
}

#[test]
fn overlapped_passes_resolve_their_placeholders_and_match_synchronous_steps() {
    let mut results = Vec::new();
    for mode in [Mode::Plain, Mode::DeviceSampling, Mode::Overlap] {
        let mut h = Setup {
            mode,
            capacity: 90,
            chunked_prefill_size: Some(16),
            ..Setup::default()
        }
        .build();
        let mut clients = mixed_workload(&mut h);
        let mut overlapped = 0;
        let mut placeholders = 0;
        while !h.idle() {
            assert!(h.steps < 10_000, "no progress");
            h.step();
            overlapped += usize::from(h.sched.flight.is_some());
            placeholders += h
                .sched
                .running
                .iter()
                .filter(|r| r.inflight.is_some())
                .count();
        }
        if mode == Mode::Overlap {
            assert!(
                overlapped > 10 && placeholders > 10,
                "{overlapped} {placeholders}"
            );
        } else {
            assert_eq!((overlapped, placeholders), (0, 0));
        }
        let mut outputs = Vec::new();
        for (c, p) in clients.iter_mut() {
            let out = c.output();
            let n = c.usage().completion_tokens;
            assert_eq!(out.len(), n);
            assert_eq!(out, reference(p, n, h.vocab), "{mode:?}");
            outputs.push((out, c.reason()));
        }
        // The stop token ends its request at its first occurrence (index 4 or before).
        let (stopped, reason) = outputs.last().unwrap();
        assert!(stopped.len() <= 5);
        assert!(matches!(reason, FinishReason::Stop { .. }));
        h.assert_everything_released();
        results.push(outputs);
    }
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0], results[2]);
}

#[test]
fn aborts_and_disconnects_free_every_slot() {
    for mode in [Mode::Plain, Mode::Overlap] {
        let mut h = Setup {
            mode,
            chunked_prefill_size: Some(16),
            max_running_requests: 3,
            ..Setup::default()
        }
        .build();
        let prompts: Vec<Vec<u32>> = (0..5).map(|i| prompt(20, i)).collect();
        let mut clients: Vec<Client> = prompts
            .iter()
            .map(|p| h.submit(p.clone(), greedy(30)))
            .collect();
        for _ in 0..4 {
            h.step();
        }
        assert_eq!(h.running_ids(), vec![1, 2, 3], "{mode:?}");
        assert_eq!(h.waiting_ids(), vec![4, 5]);
        if mode == Mode::Overlap {
            assert!(h.sched.flight.is_some());
            assert!(h.sched.running[0].inflight.is_some());
        }
        // A running request aborted, one whose client went away, one aborted while waiting.
        h.abort(1);
        let gone = clients.remove(1);
        drop(gone);
        h.abort(4);
        h.step();
        assert_eq!(h.running_ids(), vec![3, 5], "{mode:?}");
        h.run_to_idle();
        for i in [0, 2] {
            assert!(matches!(clients[i].reason(), FinishReason::Abort { .. }));
        }
        assert_eq!(clients[1].output(), reference(&prompts[2], 30, h.vocab));
        assert_eq!(clients[3].output(), reference(&prompts[4], 30, h.vocab));
        h.assert_everything_released();
    }
}

#[test]
fn samples_of_one_prompt_share_one_prefill() {
    let mut h = Setup::default().build();
    let p = prompt(60, 9);
    // What the API does for `n` > 1: the prompt once without sampling, then the samples.
    let mut prefill = h.submit(p.clone(), greedy(0));
    h.run_to_idle();
    assert!(prefill.output().is_empty());
    assert_eq!(prefill.reason(), FinishReason::Length { length: 0 });
    let mut samples: Vec<Client> = (0..3).map(|_| h.submit(p.clone(), greedy(4))).collect();
    h.run_to_idle();
    for c in samples.iter_mut() {
        assert_eq!(c.output(), reference(&p, 4, h.vocab));
        assert_eq!(c.usage().cached_tokens, 59);
    }
    // The prompt ran once; each sample computed only its last prompt token.
    let prompt_work: Vec<(usize, usize)> = h
        .passes()
        .iter()
        .flatten()
        .filter(|s| s.start_pos < 60)
        .map(|s| (s.start_pos, s.tokens))
        .collect();
    assert_eq!(prompt_work, vec![(0, 60), (59, 1), (59, 1), (59, 1)]);
    h.assert_everything_released();
}

/// A prompt run cold, then again with all but its last token in the radix cache, continues
/// the same way in every mode, on a model whose stored KV depends on the pass's shape (as a
/// GPU's does). The second run recomputes the prompt's last token into a slot of its own; once
/// that pass lands, the radix cache's copy (from the first run's prefill) replaces it. With
/// the overlap schedule, the first decode is launched before that pass lands: it must read
/// the copy that every later decode reads, as a synchronous step's does, not the recomputed
/// one.
#[test]
fn a_cached_prompt_continues_as_it_did_cold_with_passes_overlapped() {
    // Chunks change the stored KV (the pass shapes), so each chunk size is compared apart.
    for chunked_prefill_size in [None, Some(64)] {
        let mut synchronous = None;
        for mode in [Mode::Plain, Mode::DeviceSampling, Mode::Overlap] {
            let mut h = Setup {
                mode,
                capacity: 1000,
                context_length: 600,
                chunked_prefill_size,
                shape_dependent_kv: true,
                ..Setup::default()
            }
            .build();
            let p = prompt(200, 7);
            let mut cold = h.submit(p.clone(), greedy(40));
            h.run_to_idle();
            let mut cached = h.submit(p.clone(), greedy(40));
            h.run_to_idle();
            assert_eq!(cached.usage().cached_tokens, 199);
            let (cold, cached) = (cold.output(), cached.output());
            assert_eq!(cold.len(), 40);
            assert_eq!(
                cold, cached,
                "{mode:?}, chunks {chunked_prefill_size:?}: the cached run differs from the cold one"
            );
            h.assert_everything_released();
            let reference = synchronous.get_or_insert_with(|| cold.clone());
            assert_eq!(
                &cold, reference,
                "{mode:?}, chunks {chunked_prefill_size:?}: differs from synchronous steps"
            );
        }
    }
}

/// Backends learn which tokens are a prompt's: a prompt whose every token but the last is in
/// the radix cache recomputes that one token as prompt work (the CUDA backend keeps it out of
/// the decode kernel under `--enable-deterministic-inference`, so it sums as a fresh prompt
/// does), while each generated token is decoded; with passes overlapped too.
#[test]
fn passes_mark_prompt_tokens_apart_from_decoded_ones() {
    for mode in [Mode::Plain, Mode::Overlap] {
        let mut h = Setup {
            mode,
            ..Setup::default()
        }
        .build();
        let p = prompt(40, 3);
        let mut cold = h.submit(p.clone(), greedy(4));
        h.run_to_idle();
        let mut cached = h.submit(p.clone(), greedy(4));
        h.run_to_idle();
        assert_eq!(cached.usage().cached_tokens, 39);
        assert_eq!((cold.output().len(), cached.output().len()), (4, 4));
        let seqs: Vec<SeqRecord> = h.passes().into_iter().flatten().collect();
        // Cold: the whole prompt, then three decodes; cached: the last prompt token, then
        // three decodes (the fourth token of each comes from its last pass).
        let got: Vec<(usize, usize, bool)> = seqs
            .iter()
            .map(|s| (s.start_pos, s.tokens, s.prompt))
            .collect();
        let want = [
            (0, 40, true),
            (40, 1, false),
            (41, 1, false),
            (42, 1, false),
            (39, 1, true),
            (40, 1, false),
            (41, 1, false),
            (42, 1, false),
        ];
        assert_eq!(got, want, "{mode:?}");
    }
}

/// The prompt and cached-token totals behind `/get_server_info` and the lifetime
/// `sglang:cache_hit_rate` gauge count each request once, at its first admission, as the
/// `sglang:prompt_tokens_total` / `sglang:cached_tokens_total` counters do: a request still
/// queued is in neither, and a retracted request's readmission adds nothing.
#[test]
fn prompt_and_cached_totals_count_each_request_once_at_admission() {
    fn totals(h: &Harness) -> (u64, u64, u64, u64, f64) {
        let (m, s) = (&h.sched.metrics, &h.sched.stats);
        let label = m.label();
        (
            s.total_prompt_tokens.load(Ordering::Relaxed),
            s.total_cached_tokens.load(Ordering::Relaxed),
            m.prompt_tokens_total.with_label_values(&label).get(),
            m.cached_tokens_total.with_label_values(&label).get(),
            m.cache_hit_rate.with_label_values(&label).get(),
        )
    }
    let mut h = Setup {
        max_running_requests: 1,
        ..Setup::default()
    }
    .build();
    let a = prompt(20, 1);
    let b: Vec<u32> = a[..16].iter().copied().chain(prompt(4, 9)).collect();
    let mut ca = h.submit(a.clone(), greedy(3));
    let mut cb = h.submit(b.clone(), greedy(3));
    h.step();
    assert_eq!(h.waiting_ids(), vec![2]);
    // only the admitted request: 20 prompt tokens, none cached
    assert_eq!(totals(&h), (20, 0, 20, 0, 0.0));
    h.run_to_idle();
    let (prompt_total, cached, prompt_counter, cached_counter, gauge) = totals(&h);
    assert_eq!((prompt_total, prompt_counter), (40, 40));
    // the second prompt found the first one's 16 shared tokens in the radix cache
    assert_eq!(cached_counter, cached);
    assert!((16..20).contains(&cached), "cached {cached}");
    assert_eq!(gauge, cached as f64 / 40.0);
    assert_eq!(ca.usage().prompt_tokens, 20);
    assert_eq!(cb.usage().cached_tokens as u64, cached);
    h.assert_everything_released();

    // a retracted and readmitted request counts once
    let mut h = Setup {
        capacity: 30,
        ..Setup::default()
    }
    .build();
    let prompts = [prompt(8, 1), prompt(8, 2)];
    let _clients: Vec<Client> = prompts
        .iter()
        .map(|p| h.submit(p.clone(), greedy(15)))
        .collect();
    assert!(run_watching_retractions(&mut h), "nothing was retracted");
    let (prompt_total, cached, prompt_counter, cached_counter, _) = totals(&h);
    assert_eq!((prompt_total, prompt_counter), (16, 16));
    assert_eq!(cached, cached_counter);
    h.assert_everything_released();
}
