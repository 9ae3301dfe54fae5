//! Leader election on a `coordination.k8s.io/v1` Lease, so two operator replicas can run and
//! only one reconciles. Updates carry the Lease's resourceVersion: when two replicas race,
//! the API server accepts one write and refuses the other with 409.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;

use crate::Error;

/// One candidate for the lease `name`.
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_seconds: i32,
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl LeaderElector {
    pub fn new(api: Api<Lease>, name: &str, identity: &str, lease_seconds: i32) -> Self {
        Self {
            api,
            name: name.into(),
            identity: identity.into(),
            lease_seconds,
        }
    }

    /// How often the holder renews: a third of the lease, so two missed renewals still hold.
    pub fn renew_period(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.lease_seconds / 3).unwrap_or(1).max(1))
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.lease_seconds),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// Takes the lease if it is free or expired, or renews it if held. Returns whether this
    /// candidate holds it afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, Error> {
        let now = Timestamp::now();
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now, None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) if conflict(&e) => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        let current = lease.spec.clone().unwrap_or_default();
        let mine = current.holder_identity.as_deref() == Some(self.identity.as_str());
        let expired = match (&current.renew_time, current.lease_duration_seconds) {
            (Some(renewed), Some(secs)) => renewed
                .0
                .saturating_add(SignedDuration::from_secs(secs.into()))
                .is_ok_and(|until| until < now),
            _ => true,
        };
        let free = current.holder_identity.as_deref().is_none_or(str::is_empty);
        if !mine && !expired && !free {
            return Ok(false);
        }
        let transitions = current.lease_transitions.unwrap_or(0) + i32::from(!mine);
        let acquired = if mine { current.acquire_time } else { None };
        let updated = Lease {
            metadata: lease.metadata,
            spec: Some(self.spec(now, acquired, transitions)),
        };
        match self
            .api
            .replace(&self.name, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if conflict(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits until this candidate holds the lease.
    pub async fn acquire(&self) -> Result<(), Error> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => return Ok(()),
                Ok(false) => tracing::debug!(lease = %self.name, "another replica leads"),
                Err(e) => tracing::warn!(lease = %self.name, error = %e, "lease request failed"),
            }
            tokio::time::sleep(self.renew_period()).await;
        }
    }

    /// Renews until a renewal is refused or the lease could lapse before the next attempt;
    /// returns then, so the caller stops reconciling. Giving up one renewal period before the
    /// lease ends leaves no moment where another replica may take it while this one still acts.
    pub async fn hold(&self) -> Error {
        let mut last_renewal = tokio::time::Instant::now();
        let lease = Duration::from_secs(u64::try_from(self.lease_seconds).unwrap_or(15));
        loop {
            tokio::time::sleep(self.renew_period()).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => return Error::LostLease,
                Err(e) if last_renewal.elapsed() + self.renew_period() >= lease => return e,
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "lease renewal failed; retrying")
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::Api;
    use serde_json::{Value, json};

    use super::LeaderElector;
    use crate::fixtures::{FakeApi, Responder, service, timeout};

    fn lease(holder: &str, renewed_secs_ago: i64) -> Value {
        let renewed = k8s_openapi::jiff::Timestamp::now()
            .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(
                renewed_secs_ago,
            ))
            .unwrap();
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "lead", "namespace": "ops", "resourceVersion": "41"},
               "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                        "renewTime": renewed.to_string(), "leaseTransitions": 3}})
    }

    async fn attempt(responder: Responder) -> (bool, FakeApi) {
        let (ctx, api) = FakeApi::start(&service(json!({})), (json!({}), json!({})), responder);
        let elector = LeaderElector::new(
            Api::<Lease>::namespaced(ctx.client.clone(), "ops"),
            "lead",
            "me",
            15,
        );
        let won = timeout(elector.try_acquire_or_renew()).await.unwrap();
        (won, api)
    }

    #[tokio::test]
    async fn a_missing_lease_is_created_and_won() {
        let (won, api) = attempt(Box::new(|_| None)).await;
        assert!(won);
        let created = api.body("POST", "/apis/coordination.k8s.io/v1/namespaces/ops/leases");
        assert_eq!(created["spec"]["holderIdentity"], "me");
    }

    #[tokio::test]
    async fn a_fresh_lease_of_another_replica_is_respected() {
        let (won, api) = attempt(Box::new(|c| {
            (c.method == "GET").then(|| (200, lease("other", 2)))
        }))
        .await;
        assert!(!won);
        assert_eq!(
            api.summary(),
            ["GET /apis/coordination.k8s.io/v1/namespaces/ops/leases/lead"]
        );
    }

    #[tokio::test]
    async fn an_expired_lease_is_taken_over_with_optimistic_concurrency() {
        let (won, api) = attempt(Box::new(|c| match c.method.as_str() {
            "GET" => Some((200, lease("other", 60))),
            "PUT" => Some((200, c.body.clone())),
            _ => None,
        }))
        .await;
        assert!(won);
        let put = api.body("PUT", "/leases/lead");
        assert_eq!(put["metadata"]["resourceVersion"], "41");
        assert_eq!(put["spec"]["holderIdentity"], "me");
        assert_eq!(put["spec"]["leaseTransitions"], 4);
    }

    #[tokio::test]
    async fn losing_the_race_for_an_expired_lease_is_not_an_error() {
        let (won, _) = attempt(Box::new(|c| match c.method.as_str() {
            "GET" => Some((200, lease("other", 60))),
            "PUT" => Some((409, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409, "reason": "Conflict", "message": "the object has been modified"}))),
            _ => None,
        }))
        .await;
        assert!(!won);
    }

    #[tokio::test]
    async fn the_holder_renews_its_own_lease() {
        let (won, api) = attempt(Box::new(|c| match c.method.as_str() {
            "GET" => Some((200, lease("me", 5))),
            "PUT" => Some((200, c.body.clone())),
            _ => None,
        }))
        .await;
        assert!(won);
        assert_eq!(
            api.body("PUT", "/leases/lead")["spec"]["leaseTransitions"],
            3
        );
    }
}
