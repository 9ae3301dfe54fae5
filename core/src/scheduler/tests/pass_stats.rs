//! The pass statistics agree with the passes the fake model ran and with what the requests
//! received, with and without the overlap schedule.

use super::*;
use crate::scheduler::PassStats;

fn read_stats(h: &mut Harness, reset: bool) -> PassStats {
    let (reply, mut rx) = tokio::sync::oneshot::channel();
    h.sched.handle(SchedulerMsg::PassStats { reset, reply });
    rx.try_recv().expect("the scheduler answers at once")
}

#[test]
fn pass_stats_count_every_pass_token_and_prompt_of_a_run() {
    for mode in [Mode::Plain, Mode::Overlap] {
        let mut h = Setup {
            mode,
            chunked_prefill_size: Some(16),
            ..Setup::default()
        }
        .build();
        let mut shared = prompt(40, 3);
        shared.extend(prompt(4, 6));
        let work = [
            (prompt(40, 3), 20),
            (prompt(12, 2), 9),
            (prompt(5, 1), 1),
            (prompt(3, 4), 2),
        ];
        let mut clients: Vec<Client> = work
            .iter()
            .map(|(p, n)| h.submit(p.clone(), greedy(*n)))
            .collect();
        h.run_to_idle();
        // Submitted once the first prompt is cached: its prefix is not computed again.
        clients.push(h.submit(shared, greedy(6)));
        h.run_to_idle();
        let s = read_stats(&mut h, true);

        let usage: Vec<Usage> = clients.iter_mut().map(|c| c.usage()).collect();
        let completion: usize = usage.iter().map(|u| u.completion_tokens).sum();
        let computed: usize = usage
            .iter()
            .map(|u| u.prompt_tokens - u.cached_tokens)
            .sum();
        assert!(usage.iter().any(|u| u.cached_tokens > 0), "{mode:?}");
        assert_eq!(s.sampled_tokens(), completion as u64, "{mode:?}");
        // Each request's first token comes from the pass that completes its prompt.
        assert_eq!(
            s.decode_seqs(),
            (completion - clients.len()) as u64,
            "{mode:?}"
        );
        assert_eq!(s.prefill_tokens(), computed as u64, "{mode:?}");

        // Kinds as the backend saw the passes.
        let passes = h.passes();
        let count = |decode: bool, prefill: bool| {
            passes
                .iter()
                .filter(|p| {
                    p.iter().any(|q| !q.prompt) == decode && p.iter().any(|q| q.prompt) == prefill
                })
                .count() as u64
        };
        assert_eq!(s.decode.passes, count(true, false), "{mode:?}");
        assert_eq!(s.prefill.passes, count(false, true), "{mode:?}");
        assert_eq!(s.mixed.passes, count(true, true), "{mode:?}");
        assert_eq!(s.passes(), passes.len() as u64);
        assert!(s.decode.passes > 0 && s.prefill.passes > 0 && s.mixed.passes > 0);
        let prompt_pieces = passes.iter().flatten().filter(|q| q.prompt).count() as u64;
        assert_eq!(s.prefill.prefill_seqs + s.mixed.prefill_seqs, prompt_pieces);
        let overlapped = s.decode.overlapped + s.prefill.overlapped + s.mixed.overlapped;
        if mode == Mode::Overlap {
            assert!(overlapped > 0);
        } else {
            assert_eq!(overlapped, 0);
        }

        // The window's time splits into passes, idle and gap; the timeline keeps every pass.
        assert!(s.busy_secs <= s.wall_secs + 1e-9);
        assert!((s.busy_secs + s.idle_secs + s.gap_secs - s.wall_secs).abs() < 1e-6);
        let rows = s.timeline(5.0);
        assert_eq!(rows.iter().map(|r| r.passes).sum::<u64>(), s.passes());
        let out: f64 = rows.iter().map(|r| r.output_tok_s * r.secs).sum();
        assert!((out - completion as f64).abs() < 1e-6);

        // A new window starts empty.
        let next = read_stats(&mut h, false);
        assert_eq!(next.passes(), 0);
        assert!(next.timeline(5.0).is_empty());
    }
}

/// A pass runs with its requests already published as running (`num_running_reqs`, served on
/// `/metrics` and sampled by the autoscaler): a request admitted at a step shows while its
/// prefill runs, not only once the pass is done. Published only after the pass, an engine
/// serving one request after another read as idle with a request waiting for the whole of
/// each prefill, which on a loaded machine was most of its time. One request at a time
/// (`max_running_requests` 1), three queued, so every request but the first is admitted at
/// the step after the one that finished its predecessor.
#[test]
fn admitted_requests_show_as_running_while_their_pass_runs() {
    for mode in [Mode::Plain, Mode::Overlap] {
        let mut h = Setup {
            mode,
            max_running_requests: 1,
            ..Setup::default()
        }
        .build();
        let mut clients: Vec<Client> = (0..3)
            .map(|i| h.submit(prompt(12 + i, i as u32), greedy(3)))
            .collect();
        h.run_to_idle();
        for c in &mut clients {
            assert_eq!(c.output().len(), 3, "{mode:?}");
        }
        let (passes, seen) = (h.passes(), h.running_seen());
        assert_eq!(passes.len(), seen.len(), "{mode:?}");
        let prefills = passes.iter().filter(|p| p.iter().any(|s| s.prompt)).count();
        assert_eq!(prefills, 3, "{mode:?}: one prefill a request");
        for (i, (pass, &running)) in passes.iter().zip(&seen).enumerate() {
            assert!(
                running >= pass.len(),
                "{mode:?}: pass {i} ran {} sequences while {running} were published as running \
                 (passes {passes:?}, published {seen:?})",
                pass.len()
            );
        }
    }
}
