//! The sampling surface beyond temperature and top-k/p: penalties, `logit_bias`,
//! `min_new_tokens`, `no_stop_trim`, `max_new_tokens` 0, logprobs (native and OpenAI, streamed
//! too), prompt logprobs over a cached prefix, and parallel sampling (`n`).

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::common::sse_json;
use crate::{assert_error, greedy_chat, server};

const REPEAT_PROMPT: &str = "List: apple, apple, apple,";

async fn completion_text(body: &Value) -> String {
    let (status, r) = server().post("/v1/completions", body).await;
    assert_eq!(status, 200, "{body}: {r}");
    r["choices"][0]["text"].as_str().unwrap().to_string()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[tokio::test]
async fn penalties_change_greedy_output_deterministically() {
    let base =
        json!({"prompt": REPEAT_PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let baseline = completion_text(&base).await;
    assert!(
        baseline.matches("apple").count() >= 3,
        "the baseline should keep repeating: {baseline:?}"
    );
    for (field, value) in [
        ("frequency_penalty", 1.5),
        ("presence_penalty", 2.0),
        ("repetition_penalty", 1.5),
    ] {
        let mut body = base.clone();
        body[field] = json!(value);
        let a = completion_text(&body).await;
        let b = completion_text(&body).await;
        assert_eq!(a, b, "{field} must stay deterministic at temperature 0");
        assert_ne!(a, baseline, "{field} {value} must change the output");
        assert!(
            a.matches("apple").count() < baseline.matches("apple").count(),
            "{field}: {a:?} should repeat less than {baseline:?}"
        );
    }
    // Neutral values leave the output alone; /generate takes the same names.
    let mut neutral = base.clone();
    neutral["frequency_penalty"] = json!(0);
    neutral["repetition_penalty"] = json!(1.0);
    assert_eq!(completion_text(&neutral).await, baseline);
    let (status, g) = server()
        .post(
            "/generate",
            &json!({"text": REPEAT_PROMPT, "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": true, "repetition_penalty": 1.5}}),
        )
        .await;
    assert_eq!(status, 200, "{g}");
    let mut rep = base.clone();
    rep["repetition_penalty"] = json!(1.5);
    assert_eq!(g["text"].as_str().unwrap(), completion_text(&rep).await);
}

#[tokio::test]
async fn logit_bias_forces_and_bans_tokens() {
    let s = server();
    let ids = json!([504, 3459, 314]);
    let gen_ids = |extra: Value| {
        let mut sp = json!({"max_new_tokens": 4, "temperature": 0, "ignore_eos": true});
        for (k, v) in extra.as_object().unwrap() {
            sp[k] = v.clone();
        }
        json!({"input_ids": ids, "sampling_params": sp})
    };
    let (status, base) = s.post("/generate", &gen_ids(json!({}))).await;
    assert_eq!(status, 200, "{base}");
    let first = base["output_ids"][0].as_u64().unwrap();
    // A large bias makes a token win every step.
    let (status, forced) = s
        .post("/generate", &gen_ids(json!({"logit_bias": {"3575": 100}})))
        .await;
    assert_eq!(status, 200, "{forced}");
    assert_eq!(forced["output_ids"], json!([3575, 3575, 3575, 3575]));
    // A large negative bias bans the greedy choice.
    let (_, banned) = s
        .post(
            "/generate",
            &gen_ids(json!({"logit_bias": {first.to_string(): -100}})),
        )
        .await;
    assert_ne!(banned["output_ids"][0].as_u64().unwrap(), first, "{banned}");
    // The OpenAI spelling on completions.
    let (status, c) = s
        .post(
            "/v1/completions",
            &json!({"prompt": [504, 3459, 314], "max_tokens": 3, "temperature": 0, "logit_bias": {"3575": 100}, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(
        c["choices"][0]["text"].as_str().unwrap(),
        " capital capital capital"
    );
}

#[tokio::test]
async fn min_tokens_hold_off_the_end_of_generation() {
    let s = server();
    let base = greedy_chat("Say hello.", 100);
    let (status, r) = s.post("/v1/chat/completions", &base).await;
    assert_eq!(status, 200, "{r}");
    let short = r["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(r["choices"][0]["finish_reason"], json!("stop"), "{r}");
    assert!(short < 60, "the model should stop early on its own: {r}");
    let want = short + 10;
    let mut body = base.clone();
    body["min_tokens"] = json!(want);
    let (status, r) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{r}");
    let n = r["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(n >= want, "min_tokens {want} gave {n} tokens: {r}");
    // The native name on /generate, with the same effect on stop_token_ids.
    let mut native = json!({"input_ids": [504, 3459, 314], "sampling_params": {"max_new_tokens": 30, "temperature": 0, "stop_token_ids": [30, 28, 29, 198]}});
    let (_, g) = s.post("/generate", &native).await;
    assert!(
        g["output_ids"].as_array().unwrap().len() < 25,
        "a stop id should come early without min_new_tokens: {g}"
    );
    native["sampling_params"]["min_new_tokens"] = json!(25);
    let (status, g) = s.post("/generate", &native).await;
    assert_eq!(status, 200, "{g}");
    let ids = g["output_ids"].as_array().unwrap();
    assert!(ids.len() >= 25, "{g}");
    assert!(
        ids[..25]
            .iter()
            .all(|id| ![30, 28, 29, 198].contains(&id.as_u64().unwrap())),
        "stop ids must not be sampled before min_new_tokens: {g}"
    );
    // min_new_tokens above the budget is refused with the field named.
    body["min_tokens"] = json!(101);
    let (status, r) = s.post("/v1/chat/completions", &body).await;
    assert_error(status, &r, 400, "min_tokens", "min_tokens > max_tokens");
}

#[tokio::test]
async fn no_stop_trim_keeps_the_matched_stop() {
    let s = server();
    let base = json!({"text": "Count: 1, 2, 3, 4,", "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": true}});
    let (_, full) = s.post("/generate", &base).await;
    let full = full["text"].as_str().unwrap().to_string();
    let words: Vec<&str> = full.split_whitespace().collect();
    assert!(words.len() >= 3, "{full:?}");
    let stop = words[1].to_string();
    let cut = full.find(&stop).unwrap();
    let mut body = base.clone();
    body["sampling_params"]["stop"] = json!(stop);
    let (_, trimmed) = s.post("/generate", &body).await;
    assert_eq!(trimmed["text"].as_str().unwrap(), &full[..cut]);
    body["sampling_params"]["no_stop_trim"] = json!(true);
    let (status, kept) = s.post("/generate", &body).await;
    assert_eq!(status, 200, "{kept}");
    let kept = kept["text"].as_str().unwrap();
    assert!(
        kept.starts_with(&full[..cut + stop.len()]) && full.starts_with(kept),
        "{kept:?} should keep {stop:?} from {full:?}"
    );
    // A stop token's text stays too (shown when special tokens are not skipped).
    let chat = json!({"messages": [{"role": "user", "content": "Say hello."}], "temperature": 0, "max_tokens": 40,
                      "no_stop_trim": true, "skip_special_tokens": false});
    let (_, r) = s.post("/v1/chat/completions", &chat).await;
    assert_eq!(r["choices"][0]["finish_reason"], json!("stop"), "{r}");
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.ends_with("<|im_end|>"), "{text:?}");
}

/// A `[logprob, id, text]` triple.
fn triple(v: &Value) -> (Option<f64>, u64, Option<String>) {
    let a = v.as_array().unwrap_or_else(|| panic!("not a triple: {v}"));
    assert_eq!(a.len(), 3, "{v}");
    (
        a[0].as_f64(),
        a[1].as_u64().unwrap(),
        a[2].as_str().map(str::to_string),
    )
}

#[tokio::test]
async fn native_logprobs_have_sglang_shapes() {
    let s = server();
    let prompt_ids = json!([504, 3459, 314, 253, 1345, 282]);
    let body = json!({"input_ids": prompt_ids, "return_logprob": true, "logprob_start_len": 0,
                      "top_logprobs_num": 3, "return_text_in_logprobs": true,
                      "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": true}});
    let (status, r) = s.post("/generate", &body).await;
    assert_eq!(status, 200, "{r}");
    let m = &r["meta_info"];
    let input = m["input_token_logprobs"].as_array().unwrap();
    assert_eq!(input.len(), 6, "{m}");
    for (i, e) in input.iter().enumerate() {
        let (lp, id, text) = triple(e);
        assert_eq!(id, prompt_ids[i].as_u64().unwrap());
        assert!(text.is_some());
        match lp {
            None => assert_eq!(i, 0, "only the first prompt token has a null logprob"),
            Some(lp) => assert!(i > 0 && lp <= 0.0, "{e}"),
        }
    }
    let input_top = m["input_top_logprobs"].as_array().unwrap();
    assert_eq!(input_top.len(), 6);
    assert!(input_top[0].is_null());
    assert_eq!(input_top[1].as_array().unwrap().len(), 3);
    let output = m["output_token_logprobs"].as_array().unwrap();
    let out_ids = r["output_ids"].as_array().unwrap();
    assert_eq!(output.len(), 5);
    let output_top = m["output_top_logprobs"].as_array().unwrap();
    let mut text = String::new();
    for (i, e) in output.iter().enumerate() {
        let (lp, id, t) = triple(e);
        assert_eq!(id, out_ids[i].as_u64().unwrap());
        text.push_str(&t.unwrap());
        let top = output_top[i].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let (best_lp, best_id, _) = triple(&top[0]);
        // Greedy tokens are the most likely ones, with the same logprob.
        assert_eq!(best_id, id, "{e} vs {}", top[0]);
        assert_eq!(best_lp, lp);
        let lps: Vec<f64> = top.iter().map(|t| triple(t).0.unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{lps:?}");
        let total: f64 = lps.iter().map(|l| l.exp()).sum();
        assert!(total <= 1.0 + 1e-4, "{lps:?}");
    }
    let (_, plain) = s
        .post(
            "/generate",
            &json!({"input_ids": prompt_ids, "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": true, "skip_special_tokens": false}}),
        )
        .await;
    assert_eq!(plain["output_ids"], r["output_ids"]);

    // Defaults: output logprobs only, no texts, no top lists.
    let (status, d) = s
        .post(
            "/generate",
            &json!({"text": "The sky is", "return_logprob": true, "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": true}}),
        )
        .await;
    assert_eq!(status, 200, "{d}");
    let m = &d["meta_info"];
    assert_eq!(m["input_token_logprobs"], json!([]), "{m}");
    assert_eq!(m["output_token_logprobs"].as_array().unwrap().len(), 3);
    assert!(m["output_token_logprobs"][0][2].is_null());
    assert!(m.get("output_top_logprobs").is_none(), "{m}");

    // Streaming: the last chunk carries the same logprobs as the whole response.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let chunks = sse_json(&s.post_sse("/generate", &sbody).await);
    let mut seen = 0;
    for c in &chunks {
        let got = c["meta_info"]["output_token_logprobs"].as_array().unwrap();
        assert!(got.len() >= seen, "output logprobs are cumulative");
        seen = got.len();
        assert_eq!(
            c["meta_info"]["input_token_logprobs"]
                .as_array()
                .unwrap()
                .len(),
            6
        );
    }
    let last = &chunks.last().unwrap()["meta_info"];
    let streamed = last["output_token_logprobs"].as_array().unwrap();
    assert_eq!(streamed.len(), 5);
    for (a, b) in streamed.iter().zip(output) {
        assert_eq!(a[1], b[1]);
        assert!((f(&a[0]) - f(&b[0])).abs() < 1e-4, "{a} vs {b}");
    }

    // Scoring a prompt: max_new_tokens 0 computes the prompt only.
    let (status, z) = s
        .post(
            "/generate",
            &json!({"input_ids": prompt_ids, "return_logprob": true, "logprob_start_len": 0, "sampling_params": {"max_new_tokens": 0}}),
        )
        .await;
    assert_eq!(status, 200, "{z}");
    assert_eq!(z["text"], json!(""));
    assert_eq!(z["output_ids"], json!([]));
    assert_eq!(
        z["meta_info"]["finish_reason"],
        json!({"type": "length", "length": 0})
    );
    assert_eq!(z["meta_info"]["completion_tokens"], json!(0));
    let scored = z["meta_info"]["input_token_logprobs"].as_array().unwrap();
    assert_eq!(scored.len(), 6);
    for (a, b) in scored.iter().zip(input).skip(1) {
        assert!((f(&a[0]) - f(&b[0])).abs() < 1e-4, "{a} vs {b}");
    }
    // A start at or past the end of the prompt is refused.
    let (status, e) = s
        .post(
            "/generate",
            &json!({"input_ids": prompt_ids, "return_logprob": true, "logprob_start_len": 6}),
        )
        .await;
    assert_error(
        status,
        &e,
        400,
        "logprob_start_len",
        "start past the prompt",
    );
}

#[tokio::test]
async fn prompt_logprobs_match_with_a_cached_prefix() {
    let s = server();
    // Long enough to be prefilled in two chunks (--chunked-prefill-size defaults to 512), and
    // unique to this test so that the first request finds nothing cached.
    let prompt = format!(
        "Prompt logprob test {}: {}",
        std::process::id(),
        "The river runs past the old mill, under the stone bridge and on to the sea. ".repeat(40)
    );
    let score = |start: i64| {
        json!({"text": prompt, "return_logprob": true, "logprob_start_len": start,
               "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    };
    let (status, cold) = s.post("/generate", &score(0)).await;
    assert_eq!(status, 200, "{cold}");
    let n = cold["meta_info"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(n > 600, "prompt of {n} tokens should span two chunks");
    let cold_lp = cold["meta_info"]["input_token_logprobs"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(cold_lp.len(), n);
    // The same request again: its prompt is now cached, but logprobs from 0 recompute it all.
    let (_, warm) = s.post("/generate", &score(0)).await;
    let warm_lp = warm["meta_info"]["input_token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(warm_lp.len(), n);
    for (i, (a, b)) in warm_lp.iter().zip(&cold_lp).enumerate().skip(1) {
        assert_eq!(a[1], b[1]);
        assert!(
            (f(&a[0]) - f(&b[0])).abs() < 1e-4,
            "position {i}: {a} vs {b}"
        );
    }
    // From a position in the second chunk: the prefix before it comes from the cache, the
    // rest is recomputed, and the values agree with the cold run.
    let start = 550;
    let (_, part) = s.post("/generate", &score(start as i64)).await;
    let part_lp = part["meta_info"]["input_token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(part_lp.len(), n - start - 1, "{}", part["meta_info"]);
    for (i, (a, b)) in part_lp.iter().zip(&cold_lp[start + 1..]).enumerate() {
        assert_eq!(a[1], b[1]);
        assert!(
            (f(&a[0]) - f(&b[0])).abs() < 1e-4,
            "position {}: {a} vs {b}",
            start + 1 + i
        );
    }
    let cached = part["meta_info"]["cached_tokens"].as_u64().unwrap() as usize;
    assert!(cached <= start, "cached {cached} must stop at {start}");
    // The output logprob is the same either way.
    assert!(
        (f(&part["meta_info"]["output_token_logprobs"][0][0])
            - f(&cold["meta_info"]["output_token_logprobs"][0][0]))
        .abs()
            < 1e-4
    );
}

#[tokio::test]
async fn openai_logprobs_have_openai_shapes() {
    let s = server();
    let mut chat = greedy_chat("Name a color.", 6);
    chat["logprobs"] = json!(true);
    chat["top_logprobs"] = json!(3);
    chat["ignore_eos"] = json!(true);
    let (status, r) = s.post("/v1/chat/completions", &chat).await;
    assert_eq!(status, 200, "{r}");
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 6, "{r}");
    let mut joined = String::new();
    for e in content {
        let token = e["token"].as_str().unwrap();
        joined.push_str(token);
        let bytes: Vec<u8> = e["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(bytes, token.as_bytes());
        assert!(f(&e["logprob"]) <= 0.0);
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], e["token"], "greedy picks the top token");
        assert_eq!(top[0]["logprob"], e["logprob"]);
    }
    assert_eq!(
        joined,
        r["choices"][0]["message"]["content"].as_str().unwrap()
    );

    // Streamed: the chunks' entries add up to the same list.
    let mut sreq = chat.clone();
    sreq["stream"] = json!(true);
    let chunks = sse_json(&s.post_sse("/v1/chat/completions", &sreq).await);
    let streamed: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(streamed.len(), content.len());
    for (a, b) in streamed.iter().zip(content) {
        assert_eq!(a["token"], b["token"]);
        assert!((f(&a["logprob"]) - f(&b["logprob"])).abs() < 1e-4);
    }

    // Completions: logprobs k, with text offsets into the choice's text.
    let comp = json!({"prompt": "One, two, three,", "max_tokens": 5, "temperature": 0, "logprobs": 2, "ignore_eos": true});
    let (status, r) = s.post("/v1/completions", &comp).await;
    assert_eq!(status, 200, "{r}");
    let choice = &r["choices"][0];
    let lp = &choice["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 5);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 5);
    let text = choice["text"].as_str().unwrap();
    let offsets = lp["text_offset"].as_array().unwrap();
    for (t, o) in tokens.iter().zip(offsets) {
        let rest: String = text.chars().skip(o.as_u64().unwrap() as usize).collect();
        assert!(
            rest.starts_with(t.as_str().unwrap()),
            "{t} at {o} in {text:?}"
        );
    }
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 2);
        let best = top.values().map(f).fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(
            best,
            f(&lp["token_logprobs"][i]),
            "greedy token is the best"
        );
    }
    // Streamed completions carry their tokens' logprobs.
    let mut sc = comp.clone();
    sc["stream"] = json!(true);
    let chunks = sse_json(&s.post_sse("/v1/completions", &sc).await);
    let streamed: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["tokens"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(&streamed, tokens);
    // With echo the prompt's tokens come first, the very first without a logprob.
    let mut echo = comp.clone();
    echo["echo"] = json!(true);
    let (status, e) = s.post("/v1/completions", &echo).await;
    assert_eq!(status, 200, "{e}");
    let lp = &e["choices"][0]["logprobs"];
    let prompt_tokens = e["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert_eq!(lp["tokens"].as_array().unwrap().len(), prompt_tokens + 5);
    assert!(lp["token_logprobs"][0].is_null());
    assert!(lp["top_logprobs"][0].is_null());
    assert!(f(&lp["token_logprobs"][1]) <= 0.0);
}

#[tokio::test]
async fn parallel_samples_share_the_prompt() {
    let s = server();
    // The prompt of the first sample is cached by the shared prefill unless the cache was
    // flushed in between by another test; retry a few times with a fresh prompt.
    let mut reused = false;
    for attempt in 0..4 {
        let content = format!(
            "Attempt {attempt} of process {}: write a short poem about the autumn wind in the valley.",
            std::process::id()
        );
        let mut body = greedy_chat(&content, 8);
        body["n"] = json!(3);
        body["temperature"] = json!(1.2);
        body["seed"] = json!(11);
        body["ignore_eos"] = json!(true);
        let (status, r) = s.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{r}");
        let choices = r["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3);
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(c["index"], json!(i));
        }
        let texts: Vec<&str> = choices
            .iter()
            .map(|c| c["message"]["content"].as_str().unwrap())
            .collect();
        let distinct: HashSet<&&str> = texts.iter().collect();
        assert!(distinct.len() > 1, "seeded samples must differ: {texts:?}");
        let u = &r["usage"];
        assert_eq!(u["completion_tokens"], json!(24), "{u}");
        let prompt = u["prompt_tokens"].as_u64().unwrap();
        // The same seed gives the same samples.
        let (_, again) = s.post("/v1/chat/completions", &body).await;
        let again: Vec<&str> = again["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["message"]["content"].as_str().unwrap())
            .collect();
        assert_eq!(again, texts);
        let cached = u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(cached <= prompt);
        if cached + 1 >= prompt {
            reused = true;
            break;
        }
    }
    assert!(
        reused,
        "the samples must find the prompt in the radix cache"
    );

    // Native: one prompt with n = 3 answers with a list of 3 results, each reusing the prompt.
    let mut ok = false;
    for attempt in 0..4 {
        let text = format!(
            "Native attempt {attempt} of {}: the lighthouse keeper wrote in his log that",
            std::process::id()
        );
        let (status, r) = s
            .post(
                "/generate",
                &json!({"text": text, "sampling_params": {"n": 3, "max_new_tokens": 4, "temperature": 0.9, "ignore_eos": true}}),
            )
            .await;
        assert_eq!(status, 200, "{r}");
        let list = r.as_array().unwrap();
        assert_eq!(list.len(), 3);
        let prompt = list[0]["meta_info"]["prompt_tokens"].as_u64().unwrap();
        if list
            .iter()
            .all(|o| o["meta_info"]["cached_tokens"].as_u64().unwrap() + 1 >= prompt)
        {
            ok = true;
            break;
        }
    }
    assert!(ok, "native samples must reuse the prompt");

    // Streaming: chunks carry their choice's index, and each choice finishes once.
    let mut body = greedy_chat("Say something.", 4);
    body["n"] = json!(2);
    body["stream"] = json!(true);
    let chunks = sse_json(&s.post_sse("/v1/chat/completions", &body).await);
    for index in 0..2 {
        let finishes = chunks
            .iter()
            .filter(|c| {
                c["choices"][0]["index"] == json!(index)
                    && !c["choices"][0]["finish_reason"].is_null()
            })
            .count();
        assert_eq!(finishes, 1, "choice {index}: {chunks:?}");
    }
}

#[tokio::test]
async fn bad_sampling_values_are_refused() {
    let s = server();
    let chat = |extra: Value| {
        let mut b = greedy_chat("Hi", 4);
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "/v1/chat/completions",
            chat(json!({"frequency_penalty": 3})),
            "frequency_penalty",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"presence_penalty": -3})),
            "presence_penalty",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"repetition_penalty": 0})),
            "repetition_penalty",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": 50})),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_logprobs": 2})),
            "top_logprobs",
        ),
        ("/v1/chat/completions", chat(json!({"n": 0})), "n"),
        ("/v1/chat/completions", chat(json!({"n": 17})), "n"),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"hello": 5}})),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"5": 500}})),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"99999999": 1}})),
            "logit_bias",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "logprobs": 6}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "echo": true, "logprobs": 1, "stream": true}),
            "echo",
        ),
        (
            "/generate",
            json!({"text": "a", "sampling_params": {"presence_penalty": 2.5}}),
            "sampling_params.presence_penalty",
        ),
        (
            "/generate",
            json!({"text": "a", "return_logprob": true, "top_logprobs_num": -1}),
            "top_logprobs_num",
        ),
        (
            "/generate",
            json!({"text": "a", "return_logprob": true, "logprob_start_len": -2}),
            "logprob_start_len",
        ),
        (
            "/generate",
            json!({"text": "a", "return_logprob": "yes"}),
            "return_logprob",
        ),
        (
            "/generate",
            json!({"text": "a", "sampling_params": {"n": 0}}),
            "sampling_params.n",
        ),
    ];
    for (path, body, field) in &cases {
        let (status, resp) = s.post(path, body).await;
        assert_error(status, &resp, 400, field, &format!("{path} {body}"));
        assert_eq!(
            resp["error"]["param"].as_str().map(|p| p.contains(field)),
            Some(true),
            "{path} {body}: {resp}"
        );
    }
}
