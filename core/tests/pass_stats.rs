//! The pass statistics of an engine on the CPU backend with the test model, read through the
//! handle as a benchmark reads them: every generated token, prompt token and pass is counted
//! once, with and without the overlap schedule.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;
use sgl_core::engine::EngineHandle;
use sgl_core::request::{GenerateRequest, SamplingParams, StreamEvent, Usage};

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    server: sgl_core::config::ServerArgs,
}

fn launch(extra: &[&str]) -> EngineHandle {
    let model = sgl_test_harness::default_model().unwrap_or_else(|e| panic!("{e}"));
    let mut argv = vec![
        "test".to_string(),
        "--model-path".into(),
        model.display().to_string(),
        "--device".into(),
        "cpu".into(),
        "--skip-tokenizer-init".into(),
        "--chunked-prefill-size".into(),
        "48".into(),
        "--random-seed".into(),
        "1".into(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    sgl_core::engine::launch(Flags::parse_from(argv).server).expect("engine")
}

fn prompt(len: usize, salt: usize) -> Vec<u32> {
    (0..len)
        .map(|j| (1000 + (j * 104_729 + salt * 7_919) % 30_000) as u32)
        .collect()
}

/// Run the requests together; the usage of each.
async fn run(engine: &EngineHandle, reqs: &[(Vec<u32>, usize)]) -> Vec<Usage> {
    let mut streams = Vec::new();
    for (i, (p, n)) in reqs.iter().enumerate() {
        let req = GenerateRequest {
            rid: format!("r{i}"),
            input_ids: p.clone(),
            sampling: SamplingParams {
                temperature: 0.0,
                max_new_tokens: *n,
                ignore_eos: true,
                ..SamplingParams::default()
            },
            detokenize: false,
            logprobs: None,
        };
        streams.push(engine.submit(req).expect("submitted"));
    }
    let mut usage = Vec::new();
    for mut s in streams {
        let mut tokens = 0;
        let mut done = None;
        while let Some(ev) = s.next().await {
            match ev {
                StreamEvent::Tokens { ids, .. } => tokens += ids.len(),
                StreamEvent::Finished { usage, .. } => done = Some(usage),
                StreamEvent::Error { message } => panic!("request failed: {message}"),
                StreamEvent::PromptLogprobs { .. } => {}
            }
        }
        let u = done.expect("finished");
        assert_eq!(u.completion_tokens, tokens);
        usage.push(u);
    }
    usage
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_stats_agree_with_what_the_requests_received() {
    for extra in [&[][..], &["--enable-overlap-schedule"][..]] {
        let engine = launch(extra);
        // A warm-up the measured window leaves out.
        run(&engine, &[(prompt(20, 9), 3)]).await;
        let warm = engine.take_pass_stats().await.expect("stats");
        assert!(warm.passes() > 0);

        // Two long prompts in chunks beside the decodes of short ones, then one sharing the
        // first long prompt's prefix once that is cached.
        let mut reqs = vec![
            (prompt(100, 1), 6),
            (prompt(7, 2), 12),
            (prompt(30, 3), 1),
            (prompt(70, 4), 5),
        ];
        let mut usage = run(&engine, &reqs).await;
        let mut shared = prompt(100, 1);
        shared.extend(prompt(10, 5));
        reqs.push((shared, 4));
        usage.extend(run(&engine, &reqs[4..]).await);
        let s = engine.pass_stats().await.expect("stats");
        println!("{extra:?}: {}", serde_json::to_string(&s).unwrap());
        for row in s.timeline(1.0) {
            println!("{}", serde_json::to_string(&row).unwrap());
        }

        let completion: usize = usage.iter().map(|u| u.completion_tokens).sum();
        let computed: usize = usage
            .iter()
            .map(|u| u.prompt_tokens - u.cached_tokens)
            .sum();
        assert!(usage[4].cached_tokens >= 100, "{:?}", usage[4]);
        assert_eq!(
            completion,
            reqs.iter().map(|r| r.1).sum::<usize>(),
            "{extra:?}"
        );
        assert_eq!(s.sampled_tokens(), completion as u64, "{extra:?}");
        assert_eq!(
            s.decode_seqs(),
            (completion - reqs.len()) as u64,
            "{extra:?}"
        );
        assert_eq!(s.prefill_tokens(), computed as u64, "{extra:?}");
        assert!(s.decode.passes > 0 && s.prefill.passes > 0 && s.mixed.passes > 0);
        for k in [&s.decode, &s.prefill, &s.mixed] {
            assert!(k.secs > 0.0 && k.p50_ms > 0.0 && k.p50_ms <= k.p90_ms);
            assert!(k.p90_ms <= k.max_ms + 1e-9);
        }
        let overlapped = s.decode.overlapped + s.prefill.overlapped + s.mixed.overlapped;
        assert_eq!(overlapped > 0, !extra.is_empty(), "{extra:?}");
        assert!(s.busy_secs > 0.0 && s.busy_secs <= s.wall_secs);
        assert!((s.busy_secs + s.idle_secs + s.gap_secs - s.wall_secs).abs() < 1e-6);
        let rows = s.timeline(1.0);
        assert_eq!(rows.iter().map(|r| r.passes).sum::<u64>(), s.passes());
    }
}
