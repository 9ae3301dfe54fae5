//! Status computed from what exists: replica counts, endpoint and the three conditions.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use sgl_crds::{SGLangService, SGLangServiceStatus};

use crate::objects::{MODEL_DOWNLOAD, Names, engine_selector_string};

pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";

/// How the last attempt to converge went.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every object was applied.
    Applied,
    /// The spec breaks a validation rule; nothing was applied.
    InvalidSpec(String),
    /// The API server refused or failed a request.
    ApplyFailed(String),
}

/// The workloads as the API server returned them.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub engine: Option<Deployment>,
    pub router: Option<Deployment>,
    /// The service's engine pods.
    pub engine_pods: Vec<Pod>,
}

/// Why an engine pod does not run: a reason for the conditions and a message with the pod's
/// name and, for an engine that exited, its own last error line.
#[derive(Clone, Debug, PartialEq)]
pub struct PodProblem {
    pub reason: String,
    pub message: String,
}

/// Waiting reasons that mean the container will not start without a change.
const STUCK_WAITING: [&str; 7] = [
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Longest engine message quoted in status.
const MAX_ENGINE_MESSAGE: usize = 400;

/// clap's closing hint after a usage error: never the error itself.
const CLAP_HELP_HINT: &str = "For more information, try";

/// The engine's own error line in a termination message (with `FallbackToLogsOnError`, the
/// tail of its log): the last line that starts with `error:` (how the engine and clap report
/// a fatal error), else the last non-empty line that is not clap's `--help` hint; trimmed to a
/// readable length.
fn error_line(text: &str) -> Option<String> {
    let lines = || text.lines().rev().map(str::trim).filter(|l| !l.is_empty());
    let is_error = |l: &&str| {
        l.get(..6)
            .is_some_and(|head| head.eq_ignore_ascii_case("error:"))
    };
    let line = lines()
        .find(is_error)
        .or_else(|| lines().find(|l| !l.starts_with(CLAP_HELP_HINT)))?;
    let mut end = line.len().min(MAX_ENGINE_MESSAGE);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    Some(line[..end].to_string())
}

fn exit_description(code: i32, message: Option<&str>) -> String {
    match message.and_then(error_line) {
        Some(m) => format!("exit code {code}: {m}"),
        None => format!("exit code {code}"),
    }
}

/// What keeps one pod from running, if anything.
fn pod_problem(pod: &Pod) -> Option<PodProblem> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let name = pod.metadata.name.as_deref().unwrap_or("?");
    let status = pod.status.as_ref()?;
    // Init containers first: while one fails (a model download refused, say), the engine
    // container only waits.
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for c in containers {
        let state = c.state.as_ref();
        let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
        if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
            let reason = waiting.reason.as_deref().unwrap_or_default();
            if reason == "CrashLoopBackOff" {
                let why = last
                    .map(|t| exit_description(t.exit_code, t.message.as_deref()))
                    .unwrap_or_else(|| "it keeps exiting".into());
                return Some(PodProblem {
                    reason: reason.into(),
                    message: format!("pod {name}: container {} crash-loops, {why}", c.name),
                });
            }
            if STUCK_WAITING.contains(&reason) {
                let detail = waiting.message.as_deref().unwrap_or(reason);
                return Some(PodProblem {
                    reason: reason.into(),
                    message: format!("pod {name}: container {}: {detail}", c.name),
                });
            }
        }
        if let Some(t) = state.and_then(|s| s.terminated.as_ref())
            && t.exit_code != 0
        {
            return Some(PodProblem {
                reason: "EngineFailed".into(),
                message: format!(
                    "pod {name}: container {} exited, {}",
                    c.name,
                    exit_description(t.exit_code, t.message.as_deref())
                ),
            });
        }
    }
    if status.phase.as_deref() == Some("Failed") {
        return Some(PodProblem {
            reason: "PodFailed".into(),
            message: format!(
                "pod {name}: {}",
                status.message.as_deref().unwrap_or("the pod failed")
            ),
        });
    }
    let unschedulable = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    })?;
    Some(PodProblem {
        reason: "Unschedulable".into(),
        message: format!(
            "pod {name} cannot be scheduled: {}",
            unschedulable.message.as_deref().unwrap_or("no node fits")
        ),
    })
}

/// The first problem among the pods (by name), with a count of the others.
pub fn pod_problems(pods: &[Pod]) -> Option<PodProblem> {
    let mut sorted: Vec<&Pod> = pods.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut problems = sorted.into_iter().filter_map(pod_problem);
    let mut first = problems.next()?;
    let more = problems.count();
    if more > 0 {
        first.message.push_str(&format!(
            " (and {more} more engine pod{} failing)",
            if more == 1 { "" } else { "s" }
        ));
    }
    Some(first)
}

/// A 40-digit hexadecimal git commit id.
fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The commit the model download resolved, from the termination message of the engine pods'
/// `model-download` init container (`commit <sha>` among its lines); the most recent download
/// wins when pods disagree (a branch that moved between two pod starts).
pub fn downloaded_commit(pods: &[Pod]) -> Option<String> {
    pods.iter()
        .filter_map(|pod| {
            let statuses = pod.status.as_ref()?.init_container_statuses.as_ref()?;
            let done = statuses
                .iter()
                .find(|c| c.name == MODEL_DOWNLOAD)?
                .state
                .as_ref()?
                .terminated
                .as_ref()
                .filter(|t| t.exit_code == 0)?;
            let commit = done.message.as_deref()?.lines().find_map(|l| {
                l.trim()
                    .strip_prefix("commit ")
                    .map(str::trim)
                    .filter(|c| is_commit(c))
            })?;
            Some((done.finished_at.clone(), commit.to_string()))
        })
        .max_by(|a, b| a.0.as_ref().map(|t| t.0).cmp(&b.0.as_ref().map(|t| t.0)))
        .map(|(_, commit)| commit)
}

struct EngineCounts {
    desired: i32,
    replicas: i32,
    ready: i32,
    rolled_out: bool,
}

fn engine_counts(svc: &SGLangService, deploy: Option<&Deployment>) -> EngineCounts {
    let Some(deploy) = deploy else {
        return EngineCounts {
            desired: svc.spec.dp_size,
            replicas: 0,
            ready: 0,
            rolled_out: false,
        };
    };
    let status = deploy.status.clone().unwrap_or_default();
    let desired = deploy.spec.replicas.unwrap_or(svc.spec.dp_size);
    let generation_seen = match (deploy.metadata.generation, status.observed_generation) {
        (Some(g), Some(o)) => o >= g,
        (None, _) => true,
        (Some(_), None) => false,
    };
    let replicas = status.replicas.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    EngineCounts {
        desired,
        replicas,
        ready: status.ready_replicas.unwrap_or(0),
        // During a surge `replicas` counts the old pods still running too.
        rolled_out: generation_seen && updated >= desired && replicas == desired,
    }
}

/// Whether every engine replica the Deployment asks for runs its current template and is
/// available: then an older engine StatefulSet of the service may go.
pub fn engines_available(deploy: Option<&Deployment>) -> bool {
    let Some(deploy) = deploy else {
        return false;
    };
    let status = deploy.status.clone().unwrap_or_default();
    let desired = deploy.spec.replicas.unwrap_or(1);
    status.updated_replicas.unwrap_or(0) >= desired
        && status.available_replicas.unwrap_or(0) >= desired
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: now.clone(),
    }
}

/// Keeps the transition time of conditions whose status did not change.
fn carry_transition_times(old: &[Condition], new: &mut [Condition]) {
    for c in new.iter_mut() {
        if let Some(prev) = old
            .iter()
            .find(|p| p.type_ == c.type_ && p.status == c.status)
        {
            c.last_transition_time = prev.last_transition_time.clone();
        }
    }
}

/// The status the resource should show after `outcome`, given what was observed.
pub fn compute(
    svc: &SGLangService,
    names: &Names,
    observed: &Observed,
    outcome: &Outcome,
    now: &Time,
) -> SGLangServiceStatus {
    let old = svc.status.clone().unwrap_or_default();
    let generation = svc.metadata.generation;
    let engines = engine_counts(svc, observed.engine.as_ref());
    let router_ready = observed
        .router
        .as_ref()
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let router_ok = !svc.spec.router.enabled || router_ready >= 1;
    let engines_ok = engines.desired > 0 && engines.ready >= engines.desired;
    let problem = match outcome {
        Outcome::Applied => pod_problems(&observed.engine_pods),
        _ => None,
    };

    let (ready, ready_reason, ready_msg) = match outcome {
        Outcome::InvalidSpec(_) => (
            false,
            "InvalidSpec",
            "the spec is invalid; see Degraded".to_string(),
        ),
        _ if engines.desired == 0 => (
            false,
            "ScaledToZero",
            "no engine replicas requested".to_string(),
        ),
        _ if !engines_ok => {
            let counts = format!(
                "{} of {} engine replicas ready",
                engines.ready, engines.desired
            );
            match &problem {
                Some(p) => (false, p.reason.as_str(), format!("{counts}; {}", p.message)),
                None => (false, "EnginesNotReady", counts),
            }
        }
        _ if !router_ok => (
            false,
            "RouterNotReady",
            "no router replica is ready".to_string(),
        ),
        _ => (
            true,
            "AllReplicasReady",
            format!("{} engine replicas ready", engines.ready),
        ),
    };
    let (progressing, prog_reason, prog_msg) = match outcome {
        // Waiting would not help: a pod crash-loops or cannot be placed.
        Outcome::Applied if problem.is_some() => (
            false,
            problem.as_ref().map_or("", |p| p.reason.as_str()),
            "stalled: an engine pod cannot run; see Degraded".to_string(),
        ),
        Outcome::Applied if !engines.rolled_out => (
            true,
            "RollingOut",
            "engine Deployment is rolling out".to_string(),
        ),
        Outcome::Applied if !engines_ok || !router_ok => (
            true,
            "WaitingForReplicas",
            "waiting for replicas to become ready".to_string(),
        ),
        Outcome::Applied => (false, "Stable", "all replicas are up to date".to_string()),
        _ => (
            false,
            "Blocked",
            "changes are not being applied; see Degraded".to_string(),
        ),
    };
    let (degraded, deg_reason, deg_msg) = match outcome {
        Outcome::Applied if problem.is_some() => (
            true,
            problem.as_ref().map_or("", |p| p.reason.as_str()),
            problem
                .as_ref()
                .map(|p| p.message.clone())
                .unwrap_or_default(),
        ),
        Outcome::Applied => (
            false,
            "ReconcileSucceeded",
            "all objects applied".to_string(),
        ),
        Outcome::InvalidSpec(m) => (true, "InvalidSpec", m.clone()),
        Outcome::ApplyFailed(m) => (true, "ApplyFailed", m.clone()),
    };
    let mut conditions = vec![
        condition(
            READY,
            ready,
            ready_reason,
            ready_msg.clone(),
            generation,
            now,
        ),
        condition(
            PROGRESSING,
            progressing,
            prog_reason,
            prog_msg,
            generation,
            now,
        ),
        condition(
            DEGRADED,
            degraded,
            deg_reason,
            deg_msg.clone(),
            generation,
            now,
        ),
    ];
    carry_transition_times(&old.conditions, &mut conditions);
    // One reason and message for `kubectl get`: what is wrong, else why it is not ready yet.
    let summary = if degraded {
        Some((deg_reason.to_string(), deg_msg))
    } else if !ready {
        Some((ready_reason.to_string(), ready_msg))
    } else {
        None
    };
    let (reason, message) = summary.unzip();

    SGLangServiceStatus {
        reason,
        message,
        conditions,
        observed_generation: generation,
        replicas: engines.replicas,
        ready_replicas: engines.ready,
        ready: Some(format!("{}/{}", engines.ready, engines.desired)),
        model_commit: downloaded_commit(&observed.engine_pods),
        endpoint: Some(names.endpoint(svc)),
        selector: Some(engine_selector_string(names)),
    }
}

/// Conditions whose status (or reason) differs from before: each becomes an Event.
pub fn changed_conditions<'a>(old: &[Condition], new: &'a [Condition]) -> Vec<&'a Condition> {
    new.iter()
        .filter(|c| {
            !old.iter()
                .any(|o| o.type_ == c.type_ && o.status == c.status && o.reason == c.reason)
        })
        .collect()
}

/// The JSON merge patch (RFC 7386) that turns `old` into `new`: changed values, and `null` for
/// every key `new` no longer has. A plain `{"status": new}` would leave such keys in place,
/// since the status types omit empty fields when serialized (a cleared `reason` stayed).
pub fn merge_patch(old: &serde_json::Value, new: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    let (Value::Object(old), Value::Object(new)) = (old, new) else {
        return new.clone();
    };
    let mut patch = serde_json::Map::new();
    for key in old.keys().filter(|k| !new.contains_key(*k)) {
        patch.insert(key.clone(), Value::Null);
    }
    for (key, value) in new {
        match old.get(key) {
            Some(before) if before == value => {}
            Some(before) => {
                patch.insert(key.clone(), merge_patch(before, value));
            }
            None => {
                patch.insert(key.clone(), value.clone());
            }
        }
    }
    Value::Object(patch)
}

/// Whether the resource is fully ready per `status`.
pub fn is_ready(status: &SGLangServiceStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == READY && c.status == "True")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn pod(name: &str, status: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name}, "status": status})).unwrap()
    }

    fn container(state: Value) -> Value {
        json!({"containerStatuses": [{"name": "engine", "ready": false, "restartCount": 0,
            "image": "e", "imageID": "", "state": state}]})
    }

    #[test]
    fn image_pull_and_config_errors_carry_the_kubelets_message() {
        let p = pod(
            "e-0",
            container(
                json!({"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"ghcr.io/x:1\""}}),
            ),
        );
        assert_eq!(
            pod_problem(&p),
            Some(PodProblem {
                reason: "ImagePullBackOff".into(),
                message: "pod e-0: container engine: Back-off pulling image \"ghcr.io/x:1\"".into()
            })
        );
        // A container still being created is not a problem.
        let creating = pod(
            "e-0",
            container(json!({"waiting": {"reason": "ContainerCreating"}})),
        );
        assert_eq!(pod_problem(&creating), None);
    }

    #[test]
    fn an_engine_that_exits_with_an_error_is_reported_before_the_back_off() {
        let p = pod(
            "e-0",
            container(
                json!({"terminated": {"exitCode": 2, "message": "error: --tp-size 2 is not supported\n\n"}}),
            ),
        );
        let problem = pod_problem(&p).unwrap();
        assert_eq!(problem.reason, "EngineFailed");
        assert_eq!(
            problem.message,
            "pod e-0: container engine exited, exit code 2: error: --tp-size 2 is not supported"
        );
        // A clean exit is not a failure.
        let done = pod("e-0", container(json!({"terminated": {"exitCode": 0}})));
        assert_eq!(pod_problem(&done), None);
    }

    #[test]
    fn the_first_failing_pod_is_named_and_the_others_counted() {
        let crash = |name: &str| {
            pod(
                name,
                container(json!({"waiting": {"reason": "CrashLoopBackOff"}})),
            )
        };
        let mut deleted = crash("e-3");
        deleted.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        let problem =
            pod_problems(&[crash("e-2"), crash("e-1"), deleted, pod("e-0", json!({}))]).unwrap();
        assert_eq!(
            problem.message,
            "pod e-1: container engine crash-loops, it keeps exiting (and 1 more engine pod failing)"
        );
        assert_eq!(
            pod_problems(&[pod("e-0", json!({"phase": "Running"}))]),
            None
        );
    }

    #[test]
    fn long_engine_messages_are_cut_on_a_character_boundary() {
        let long = format!("error: {}", "é".repeat(400));
        let line = error_line(&long).unwrap();
        assert!(line.len() <= MAX_ENGINE_MESSAGE);
        assert!(line.starts_with("error: é"));
        assert_eq!(error_line("\n  \n"), None);
    }

    #[test]
    fn the_engines_error_line_is_picked_out_of_its_log_tail() {
        // A refused flag: clap's usage error ends with a usage line and a hint.
        let clap = "error: unexpected argument '--no-such-flag' found\n\n  tip: to pass \
                    '--no-such-flag' as a value, use '-- --no-such-flag'\n\nUsage: \
                    sgl-engine serve [OPTIONS]\n\nFor more information, try '--help'.\n";
        assert_eq!(
            error_line(clap).as_deref(),
            Some("error: unexpected argument '--no-such-flag' found")
        );
        // A start-up failure: log lines, then the engine's own `error:` line, then nothing.
        let start = "2026-11-26T07:00:00Z  INFO sgl_engine: loading\n\
                     error: --model-path /m does not exist\n";
        assert_eq!(
            error_line(start).as_deref(),
            Some("error: --model-path /m does not exist")
        );
        // The last of several errors wins; `Error:` (anyhow's) counts too.
        assert_eq!(
            error_line("error: first\nError: second\nshutting down").as_deref(),
            Some("Error: second")
        );
        // No error line: the last line that is not the hint.
        assert_eq!(
            error_line("panicked at main.rs:1\nFor more information, try '--help'.").as_deref(),
            Some("panicked at main.rs:1")
        );
        assert_eq!(error_line("For more information, try '--help'."), None);
    }

    fn downloaded(name: &str, finished: &str, code: i32, message: &str) -> Pod {
        pod(
            name,
            json!({"initContainerStatuses": [{"name": "model-download", "ready": code == 0,
                "restartCount": 0, "image": "e", "imageID": "",
                "state": {"terminated": {"exitCode": code, "message": message,
                    "finishedAt": finished}}}]}),
        )
    }

    #[test]
    fn the_downloaded_commit_comes_from_the_init_containers_termination_message() {
        let a = "a".repeat(40);
        let b = "b".repeat(40);
        let message = |c: &str| format!("path /cache/hub/models--o--n/snapshots/{c}\ncommit {c}\n");
        // The most recent download wins.
        let pods = [
            downloaded("e-0", "2026-11-26T07:00:00Z", 0, &message(&a)),
            downloaded("e-1", "2026-11-26T08:00:00Z", 0, &message(&b)),
        ];
        assert_eq!(downloaded_commit(&pods), Some(b.clone()));
        // A failed download, or a message without a commit id, says nothing.
        assert_eq!(
            downloaded_commit(&[downloaded("e-0", "2026-11-26T07:00:00Z", 1, &message(&a))]),
            None
        );
        assert_eq!(
            downloaded_commit(&[downloaded("e-0", "2026-11-26T07:00:00Z", 0, "commit main")]),
            None
        );
        assert_eq!(downloaded_commit(&[pod("e-0", json!({}))]), None);
    }

    #[test]
    fn a_failing_download_is_the_pods_problem() {
        let p = pod(
            "e-0",
            json!({
                "initContainerStatuses": [{"name": "model-download", "ready": false,
                    "restartCount": 2, "image": "e", "imageID": "",
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 1,
                        "message": "error: org/name needs a token: 401 (set HF_TOKEN ...)"}}}],
                "containerStatuses": [{"name": "engine", "ready": false, "restartCount": 0,
                    "image": "e", "imageID": "", "state": {"waiting": {"reason": "PodInitializing"}}}],
            }),
        );
        let problem = pod_problem(&p).unwrap();
        assert_eq!(problem.reason, "CrashLoopBackOff");
        assert_eq!(
            problem.message,
            "pod e-0: container model-download crash-loops, exit code 1: error: org/name needs a token: 401 (set HF_TOKEN ...)"
        );
    }
}
